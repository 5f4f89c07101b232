"""Pool-policy validators as pure functions (P6, P8, U3) and the MIG profile facts they use."""

import pytest

from shared.errors import InvalidInput, InvalidState
from shared.mig import layout_fits, profiles_for
from shared.policy import POOL_POLICY_VALIDATORS, PolicyContext, PolicyViolation, validate_policy


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
