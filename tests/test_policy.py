"""Pool-policy validators as pure functions (P6, P8, U3) and the MIG profile facts they use;
the warnings of P9 (policy fields the code does not read), pure and as the API answers them."""

import json
import re

import msgspec
import pytest

from shared.errors import InvalidInput, InvalidState
from shared.mig import layout_fits, profiles_for
from shared.policy import (
    POOL_POLICY_VALIDATORS,
    Policy,
    PolicyContext,
    PolicyViolation,
    validate_policy,
)
from shared.policy.model import policy_warnings
from tests.conftest import Api


def check(policy: dict[str, object], **pool: object) -> None:
    settings: dict[str, object] = {
        "pool_class": "metal-host",
        "sharing": "exclusive",
        "gpu_model": "H100",
        "site_kind": "shared",
        "attestors": frozenset({"join-token"}),
        **pool,
    }
    validate_policy(policy, POOL_POLICY_VALIDATORS, **settings)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("family", "layout", "fits"),
    [
        ("H100", ["3g.40gb", "3g.40gb"], True),
        ("H100", ["4g.40gb", "3g.40gb"], True),
        ("H100", ["4g.40gb", "4g.40gb"], False),  # 8 compute slices
        ("H100", ["1g.10gb"] * 7, True),
        ("H100", ["1g.10gb"] * 8, False),
        ("H100", ["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"], True),
        ("H100", ["3g.40gb", "1g.20gb", "1g.20gb", "1g.20gb"], False),  # memory slices overlap
        ("H100", ["1g.10gb+me", "1g.10gb+me"], False),  # one +me per GPU
        ("H100", ["1g.10gb", "1g.12gb"], False),  # two memory variants on one GPU
        ("H100", ["7g.94gb"], True),  # H100 NVL
        ("H200", ["3g.71gb", "3g.71gb"], True),
        ("B200", ["1g.23gb"] * 7, True),
        ("GB200", ["1g.24gb", "1g.23gb"], True),  # nvidia-smi and mig-parted names
        ("A30", ["2g.12gb", "2g.12gb"], True),
        ("A30", ["4g.24gb", "1g.6gb"], False),
        ("A100", ["3g.20gb", "3g.20gb"], True),
        ("RTX-PRO-6000-BLACKWELL", ["2g.48gb", "2g.48gb"], True),
        ("RTX-PRO-6000-BLACKWELL", ["4g.96gb", "1g.24gb"], False),
        ("L40S", ["1g.10gb"], False),
    ],
)
def test_u3_mig_layout_fits_one_gpu(family: str, layout: list[str], fits: bool) -> None:
    """U3: a layout must fit one GPU of one memory variant of the family."""
    assert layout_fits(family, layout) is fits


def test_mig_profiles_only_for_mig_capable_families() -> None:
    """MIG profiles exist for MIG-capable families only; names are exact, never prefixes."""
    assert "1g.10gb" in profiles_for("H100") and "1g.10gb" not in profiles_for("H200")
    assert profiles_for("L4") == profiles_for("A10") == frozenset()
    assert "1g.18gb" in profiles_for("H200")
    assert profiles_for("h200") == frozenset()  # N1: families compare exactly


def test_p6_validator_failure_reads_policy_prefix_and_names_field() -> None:
    """P6: a validator's failure is INVALID_INPUT 'policy: ...' with details.field."""
    with pytest.raises(InvalidInput) as caught:
        check({"kernelModules": {"load": ["nvidia"], "blacklist": ["nvidia"]}})
    assert caught.value.message.startswith("policy: ")
    assert caught.value.details == {"field": "policy.kernelModules"}


def test_p6_compute_errors_from_a_validator_pass_through() -> None:
    """P6: a validator may raise a compute error, which is not rewritten as 'policy: ...'."""

    def refuses(ctx: PolicyContext) -> None:
        raise InvalidState("nodes are draining")

    def violation(ctx: PolicyContext) -> None:
        raise PolicyViolation("x", "no")

    with pytest.raises(InvalidState):
        validate_policy(
            {},
            (refuses,),
            pool_class="metal-host",
            sharing="exclusive",
            gpu_model=None,
            site_kind="shared",
            attestors=frozenset(),
        )
    with pytest.raises(InvalidInput) as caught:
        validate_policy(
            {},
            (violation,),
            pool_class="metal-host",
            sharing="exclusive",
            gpu_model=None,
            site_kind="shared",
            attestors=frozenset(),
        )
    assert caught.value.message == "policy: no"


@pytest.mark.parametrize(
    ("policy", "pool", "field"),
    [
        ({"overcommit": {"diskGiB": 2}}, {}, "policy.overcommit.diskGiB"),
        ({"cpu": {"isolate": "0-3"}}, {}, "policy.cpu.isolate"),
        ({"cpu": {"isolate": "4-8,6-9"}}, {}, "policy.cpu.isolate"),
        ({"gpu": {"persistenceMode": True}}, {"gpu_model": None}, "policy.gpu"),
        ({"replicas": 4}, {"sharing": "mps", "pool_class": "vps-host"}, "policy.replicas"),
        (
            {"migLayout": {"default": ["1g.10gb"]}},
            {"sharing": "mig", "gpu_model": None},
            "policy.migLayout",
        ),
        (
            {"migLayout": {"default": ["1g.10gb"]}},
            {"sharing": "mig", "gpu_model": "L40S"},
            "policy.migLayout",
        ),
        ({"joinAttestors": []}, {}, "policy.joinAttestors"),
        (
            {
                "kubernetes": {
                    "apiServer": "http://plain:6443",
                    "token": "abcdef.0123456789abcdef",
                    "caCertHash": "sha256:" + "0" * 64,
                }
            },
            {"site_kind": "custom"},
            "policy.kubernetes.apiServer",
        ),
    ],
)
def test_p6_refusals(policy: dict[str, object], pool: dict[str, object], field: str) -> None:
    """P6, P7, S1: what nodes cannot take is refused with the field."""
    with pytest.raises(InvalidInput) as caught:
        check(policy, **pool)
    assert caught.value.details["field"] == field


def test_p8_registered_attestors_are_accepted() -> None:
    """P8: an attestor the server registered is accepted next to join-token."""
    check({"joinAttestors": ["join-token", "tpm"]}, attestors=frozenset({"join-token", "tpm"}))
    with pytest.raises(InvalidInput):
        check({"joinAttestors": ["tpm"]})


def test_vps_host_may_overcommit_disk() -> None:
    """N3: diskGiB is a resource of vps-host pools, so its ratio is accepted there."""
    check({"overcommit": {"diskGiB": 1.5, "vcpu": 4}}, pool_class="vps-host", gpu_model=None)


# --- policy feedback: fields the code does not read (P9) -----------------------------------

EVERY_FIELD = {
    "acceptance": [{"kind": "diag.nvml"}],
    "maxPending": "6h",
    "overcommit": {"vcpu": 2, "memoryGiB": 1.5, "diskGiB": 1},
    "hostReserve": {"vcpu": 8, "memoryGiB": 64},
    "hugepages": {"2Mi": 1024, "1Gi": 4},
    "kernelModules": {"load": ["vfio_pci"], "blacklist": ["nouveau"], "options": {"a": "b=1"}},
    "cpu": {"governor": "performance", "isolate": "2-7"},
    "iommu": {"mode": "passthrough"},
    "gpu": {"persistenceMode": True, "computeMode": "default", "powerLimitW": 300},
    "kubernetes": {"apiServer": "https://k8s.example/", "token": "x", "caCertHash": "y"},
    "platformOperated": True,
    "replicas": 4,
    "migLayout": {"default": ["3g.40gb"]},
    "prewarmImages": ["busybox:1.36"],
    "singleTenant": False,
    "joinAttestors": ["join-token"],
    "admission": {"budgetCheck": "meter"},
}


def test_p9_a_policy_of_known_fields_warns_of_nothing() -> None:
    """P9: every field of DESIGN §5, at every level, is one the code reads: no warnings."""
    assert policy_warnings(EVERY_FIELD) == []
    assert policy_warnings({}) == []


def test_p9_an_unknown_field_is_named_with_the_closest_known_one() -> None:
    """P9: a top-level typo is named with its path and the known name difflib finds closest;
    a field close to none is named alone."""
    assert policy_warnings({"hugepage": {"2Mi": 4}, "team": "research"}) == [
        "policy.hugepage: not a field the code reads; did you mean hugepages?",
        "policy.team: not a field the code reads",
    ]


def test_p9_unknown_fields_are_found_at_every_level_of_the_model() -> None:
    """P9: inside objects, lists of objects and maps the path goes down the typed model, and
    the suggestion is a known name of that level (as written in JSON: 2Mi)."""
    policy = {
        "hugepages": {"2mi": 4},
        "acceptance": [{"kind": "diag.nvml"}, {"knd": "diag.nvml"}],
        "kubernetes": {"apiserver": "https://k8s.example/"},
        "migLayout": {"default": ["3g.40gb"]},  # map keys are values, never fields
    }
    assert policy_warnings(policy) == [
        "policy.hugepages.2mi: not a field the code reads; did you mean 2Mi?",
        "policy.acceptance.1.knd: not a field the code reads; did you mean kind?",
        "policy.kubernetes.apiserver: not a field the code reads; did you mean apiServer?",
    ]


async def test_p9_create_and_update_warn_of_fields_nothing_reads(api: Api) -> None:
    """P9: pools/create and pools/update name the policy fields the code does not read in
    `warnings`, with the closest known name, and store them as given; pools/get has none."""
    site = await api.site()
    policy = {"hugepage": {"2Mi": 4}, "maxPending": "30m"}
    pool = await api.pool(site, policy=policy)
    assert pool["warnings"] == [
        "policy.hugepage: not a field the code reads; did you mean hugepages?"
    ]
    got = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool["id"]})
    assert got["policy"] == policy and "warnings" not in got
    body = {"tenantId": "root", "poolId": pool["id"], "policy": {"maxPendng": "1h"}}
    updated = await api.ok("compute/pools/update", body)
    assert updated["policy"] == {"maxPendng": "1h"}
    assert updated["warnings"] == [
        "policy.maxPendng: not a field the code reads; did you mean maxPending?"
    ]
    clean = await api.ok("compute/pools/update", {**body, "policy": {"maxPending": "1h"}})
    assert clean["warnings"] == []


async def test_p9_openapi_publishes_the_policy_model_open_to_unknown_fields(api: Api) -> None:
    """P9, DESIGN §5: components.schemas.PoolPolicy is the typed policy model (its parts
    closed, its top level open to unknown fields); create's and update's policy refer to it;
    every $ref of the document resolves."""
    document = await (await api.client.get("/api/openapi.json")).json()
    schemas = document["components"]["schemas"]
    policy = schemas["PoolPolicy"]
    assert set(policy["properties"]) == {f.encode_name for f in msgspec.structs.fields(Policy)}
    assert policy["additionalProperties"] is True
    assert policy["properties"]["hugepages"] == {"$ref": "#/components/schemas/PoolPolicyHugepages"}
    hugepages = schemas["PoolPolicyHugepages"]
    assert set(hugepages["properties"]) == {"2Mi", "1Gi"}
    assert hugepages["additionalProperties"] is False
    for request in ("PoolsCreate", "PoolsUpdate"):
        field = schemas[request]["properties"]["policy"]
        assert field["type"] == "object"
        assert field["allOf"] == [{"$ref": "#/components/schemas/PoolPolicy"}]
    assert schemas["PoolView"]["properties"]["warnings"]["items"] == {"type": "string"}
    refs = re.findall(r'"\$ref": "#/components/schemas/([^"]+)"', json.dumps(document))
    assert refs and set(refs) <= set(schemas)
