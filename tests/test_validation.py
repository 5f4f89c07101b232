"""Input constraints of the seed's tables (003), enforced exactly: INVALID_INPUT with details.field."""

import io
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import Api, snapshot

POOL = "pool_" + "0123456789abcdefghjkmnpqrs"  # 26 chars of the alphabet
SITE = "site_" + "0123456789abcdefghjkmnpqrs"
PACCT = "pacct_" + "0123456789abcdefghjkmnpqrs"

VALID: dict[str, dict[str, Any]] = {
    "compute/pools/list": {"tenantId": "acme"},
    "compute/pools/get": {"tenantId": "acme", "poolId": POOL},
    "compute/pools/capacity": {"tenantId": "acme", "poolId": POOL},
    "compute/pools/archive": {"tenantId": "acme", "poolId": POOL},
    "compute/pools/create": {"tenantId": "acme", "siteId": SITE, "class": "metal-host"},
    "compute/pools/offer": {
        "tenantId": "acme",
        "poolId": POOL,
        "toTenantId": "beta",
        "quota": {"gpu": 1},
    },
    "compute/pools/unoffer": {"tenantId": "acme", "poolId": POOL, "toTenantId": "beta"},
    "compute/pools/update": {"tenantId": "acme", "poolId": POOL, "policy": {}},
}

BAD_TENANT = ["", "a b", "a/b", "x" * 129, 7, None, ["acme"], "tenant!", "acme\n"]
BAD_POOL = [
    "pool_" + "0123456789abcdefghjkmnpqr",  # 25
    "pool_" + "0" * 53,
    "pool_" + "i" * 26,  # i, l, o, u are not in the alphabet
    "pool_" + "O" * 26,
    "POOL_" + "0" * 26,
    SITE,
    1,
    "pool_" + "0123456789abcdefghjkmnpqrs\n",
]

CASES: list[tuple[str, str, Any]] = []
for path in VALID:
    CASES += [(path, "tenantId", bad) for bad in BAD_TENANT]
    if "poolId" in VALID[path]:
        CASES += [(path, "poolId", bad) for bad in BAD_POOL]
CASES += [("compute/pools/create", "siteId", bad) for bad in ("site_x", POOL, "site_" + "u" * 26)]
CASES += [("compute/pools/create", "class", bad) for bad in ("gpu-host", "", "METAL-HOST", 1)]
CASES += [
    ("compute/pools/create", "gpuModel", bad) for bad in ("", "H100_SXM", "H 100", "x" * 33, 100)
]
CASES += [("compute/pools/create", "sharing", bad) for bad in ("spatial", "", None)]
CASES += [("compute/pools/create", "agent", bad) for bad in ("k8s", "", True)]
CASES += [("compute/pools/create", "policy", bad) for bad in ([], "x", 1, None)]
CASES += [
    ("compute/pools/create", "ownerQuota", bad)
    for bad in (
        {"1gpu": 1},
        {"gpu": -1},
        {"gpu": 2147483648},
        {"gpu": 1.5},
        {"gpu": "1"},
        {"g" * 65: 1},
        [],
        {"gpu": True},
    )
]
CASES += [
    ("compute/pools/create", "providerAccountId", bad)
    for bad in ("pacct_x", POOL, "pacct_" + "0" * 53)
]
CASES += [
    ("compute/pools/create", "idempotencyKey", bad) for bad in ("", "has space", "k" * 129, "é", 5)
]
CASES += [("compute/pools/offer", "toTenantId", bad) for bad in BAD_TENANT]
CASES += [
    ("compute/pools/offer", "quota", bad)
    for bad in ({"gpu": -1}, {"-gpu": 1}, None, {"gpu": 2**31})
]
CASES += [("compute/pools/offer", "includeDescendants", bad) for bad in ("yes", 1, None)]
CASES += [("compute/pools/offer", "priority", bad) for bad in (1001, -1001, 1.5, "1")]
CASES += [("compute/pools/unoffer", "toTenantId", bad) for bad in BAD_TENANT]
CASES += [("compute/pools/update", "policy", bad) for bad in ("x", [], None)]
CASES += [("compute/pools/update", "gpuModel", bad) for bad in ("", "x" * 33, "a.b")]


# The other methods' schemas: IAM, sites, quotas, capacity, events.
OTHERS: dict[str, dict[str, Any]] = {
    "iam/tenants/create": {"tenantId": "acme"},
    "iam/tenants/delete": {"tenantId": "acme"},
    "iam/credentials/create": {"tenantId": "acme"},
    "iam/credentials/revoke": {"tenantId": "acme", "credentialId": "cred_" + "0" * 26},
    "compute/sites/create": {"tenantId": "acme", "name": "fra1", "region": "eu", "kind": "custom"},
    "compute/sites/list": {"tenantId": "acme"},
    "compute/quotas/set": {
        "tenantId": "acme",
        "poolId": POOL,
        "forTenantId": "beta",
        "quota": {"gpu": 1},
    },
    "compute/quotas/list": {"tenantId": "acme"},
    "compute/capacity/byPool": {"tenantId": "acme", "poolId": POOL},
    "compute/events/list": {"tenantId": "acme"},
    "compute/reservations/create": {"tenantId": "acme", "poolId": POOL, "resources": {"gpu": 1}},
    "compute/reservations/get": {"tenantId": "acme", "reservationId": "res_" + "0" * 26},
    "compute/reservations/end": {"tenantId": "acme", "reservationId": "res_" + "0" * 26},
    "compute/budgets/set": {"tenantId": "acme", "meter": "gpu.h100.hours", "limit": 10},
    "compute/budgets/get": {"tenantId": "acme", "meter": "gpu.h100.hours"},
}
VALID.update(OTHERS)
for path in OTHERS:
    CASES += [(path, "tenantId", bad) for bad in BAD_TENANT]
CASES += [("iam/tenants/create", "parentTenantId", bad) for bad in BAD_TENANT]
CASES += [("iam/tenants/create", "name", bad) for bad in ("", "n" * 201, 5)]
CASES += [("iam/credentials/create", "name", bad) for bad in ("", "n" * 201)]
CASES += [
    ("iam/credentials/create", "statements", bad)
    for bad in (
        {},
        [{"effect": "maybe", "actions": ["*"], "resources": ["*"]}],
        [{"effect": "allow", "actions": [], "resources": ["*"]}],
        [{"effect": "allow", "actions": ["compute:pools:read:x:y"], "resources": ["*"]}],
        [{"effect": "allow", "actions": ["*"], "resources": ["compute-node"]}],
        [
            {
                "effect": "allow",
                "actions": ["*"],
                "resources": ["*"],
                "conditions": {"color": ["red"]},
            }
        ],
        [
            {
                "effect": "allow",
                "actions": ["*"],
                "resources": ["*"],
                "conditions": {"owned": ["yes"]},
            }
        ],
    )
]
CASES += [
    ("iam/credentials/revoke", "credentialId", bad)
    for bad in ("cred_x", POOL, "cred_" + "0" * 26 + "\n")
]
CASES += [("compute/sites/create", "name", bad) for bad in ("", "-x", "a b", "n" * 65, "fra1\n")]
CASES += [("compute/sites/create", "region", bad) for bad in ("", "eu west", "r" * 65)]
CASES += [("compute/sites/create", "kind", bad) for bad in ("private", "", None)]
CASES += [("compute/quotas/set", "forTenantId", bad) for bad in BAD_TENANT]
CASES += [("compute/quotas/set", "quota", bad) for bad in ({"gpu": -1}, {"gpu\n": 1}, [])]
CASES += [("compute/quotas/set", "poolId", bad) for bad in BAD_POOL]
CASES += [("compute/quotas/list", "poolId", bad) for bad in BAD_POOL]
CASES += [("compute/capacity/byPool", "poolId", bad) for bad in BAD_POOL]
CASES += [
    ("compute/reservations/create", "resources", bad)
    for bad in ({"gpu": 0}, {"gpu": -1}, {"tpu": 1}, {"gpu": 1.5}, [], None)
]
CASES += [("compute/reservations/create", "migProfile", bad) for bad in ("big", "1g.10gb\n", 3)]
CASES += [("compute/reservations/create", "poolId", bad) for bad in BAD_POOL]
CASES += [
    ("compute/reservations/get", "reservationId", bad)
    for bad in ("res_x", POOL, "res_" + "0" * 26 + "\n")
]
CASES += [
    ("compute/budgets/set", "meter", bad) for bad in ("h100", "gpu.H100.hours", "gpu.h100.hours\n")
]
CASES += [("compute/budgets/set", "limit", bad) for bad in (-1, "10")]
CASES += [("compute/events/list", "after", bad) for bad in (-1, 2**63, 2**64, 1.5, "1")]
CASES += [("compute/events/list", "limit", bad) for bad in (0, 1001, None)]
CASES += [
    ("compute/events/list", "types", bad)
    for bad in ("pool.created", ["Pool.Created"], ["pool"], [1])
]


@pytest.mark.parametrize(("path", "field", "value"), CASES)
async def test_every_field_constraint_is_invalid_input(
    api: Api, db: Path, path: str, field: str, value: Any
) -> None:
    """Each constraint of the seed's input tables refuses with INVALID_INPUT and the field."""
    before = snapshot(db)
    error = await api.err(path, {**VALID[path], field: value}, "INVALID_INPUT", status=400)
    got = error["details"]["field"]
    assert got == field or got.startswith(f"{field}."), error  # e.g. statements.0.effect
    assert snapshot(db) == before


@pytest.mark.parametrize("path", list(VALID))
async def test_required_and_unknown_fields(api: Api, db: Path, path: str) -> None:
    """Every required field is required, and unknown top-level fields are refused."""
    before = snapshot(db)
    for field in VALID[path]:
        if path == "compute/pools/update" and field == "policy":
            continue  # optional: update takes policy, gpuModel or both
        body = {k: v for k, v in VALID[path].items() if k != field}
        await api.err(path, body, "INVALID_INPUT", field)
    await api.err(path, {**VALID[path], "surprise": 1}, "INVALID_INPUT", "surprise")
    await api.err(path, {**VALID[path], "ownerTenantId": "root"}, "INVALID_INPUT", "ownerTenantId")
    assert snapshot(db) == before


@pytest.mark.parametrize(
    ("path", "field", "value"),
    [
        ("compute/pools/list", "tenantId", "x" * 128),
        ("compute/pools/get", "poolId", "pool_" + "z" * 52),
        ("compute/pools/offer", "priority", 1000),
        ("compute/pools/offer", "priority", -1000),
        ("compute/pools/offer", "quota", {"gpu": 2147483647, "Z" + "-" * 63: 0}),
        ("compute/pools/create", "idempotencyKey", "a._~:/+=-Z9"),
        ("compute/pools/create", "gpuModel", "RTX-PRO-6000-BLACKWELL"),
    ],
)
async def test_boundary_values_pass_validation(api: Api, path: str, field: str, value: Any) -> None:
    """Values at the edges of each range are accepted by the schema (the request fails later, or not)."""
    status, answer = await api.call(path, {**VALID[path], field: value})
    assert status != 400, answer


async def test_longest_provider_account_id_passes(api: Api) -> None:
    """providerAccountId of 58 characters (the maximum) is accepted."""
    site = await api.site()
    pool = await api.pool(site, **{"class": "provider", "providerAccountId": "pacct_" + "0" * 52})
    assert pool["providerAccountId"] == "pacct_" + "0" * 52


async def test_body_must_be_a_json_object(api: Api, db: Path) -> None:
    """A body that is not JSON, or not an object, is INVALID_INPUT."""
    before = snapshot(db)
    for raw in (b"not json", b"[]", b'"x"', b"", b'{"tenantId": "root",}'):
        status, answer = await api.call("compute/pools/list", None, raw=raw)
        assert (status, answer["error"]["code"]) == (400, "INVALID_INPUT"), raw
    assert snapshot(db) == before


async def test_bodies_over_one_mib_are_refused(api: Api, db: Path) -> None:
    """Request bodies over 1 MiB are refused with 413 INVALID_INPUT."""
    site = await api.site()
    before = snapshot(db)
    big = (
        b'{"tenantId":"root","siteId":"'
        + site.encode()
        + b'","class":"metal-host","policy":{"x":"'
        + b"a" * (1024 * 1024)
        + b'"}}'
    )
    status, answer = await api.call("compute/pools/create", None, raw=io.BytesIO(big))
    assert (status, answer["error"]["code"]) == (413, "INVALID_INPUT")
    assert snapshot(db) == before
