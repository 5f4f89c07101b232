"""pools.create: P1–P9."""

from pathlib import Path

import pytest

from tests.conftest import Api, snapshot

PACCT = "pacct_01m8p96ta1gm587tbv5pw7gvfq"


async def test_p1_defaults_version_empty_rollup_and_event(api: Api) -> None:
    """P1: sharing exclusive, agent bcd, version 1, empty rollup, pool.created."""
    site = await api.site()
    pool = await api.pool(site)
    assert pool["sharing"] == "exclusive"
    assert pool["agent"] == "bcd"
    assert pool["version"] == 1
    assert pool["owned"] is True and pool["archived"] is False
    assert pool["policy"] == {}
    assert pool["id"].startswith("pool_") and len(pool["id"]) == 31
    capacity = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool["id"]})
    assert capacity == {"items": []}
    events = await api.ok("compute/events/list", {"tenantId": "root", "types": ["pool.created"]})
    assert [(e["type"], e["poolId"]) for e in events["items"]] == [("pool.created", pool["id"])]


async def test_p1_provider_pool_defaults_to_agent_none(api: Api) -> None:
    """P1: a provider pool's agent defaults to none."""
    site = await api.site()
    pool = await api.pool(site, **{"class": "provider", "providerAccountId": PACCT})
    assert pool["agent"] == "none"
    assert pool["providerAccountId"] == PACCT


async def test_p2_site_of_another_tenant_is_not_found(api: Api, db: Path) -> None:
    """P2: a site the tenant does not own is NOT_FOUND, and nothing is written."""
    await api.tenant("acme")
    root_site = await api.site()
    before = snapshot(db)
    await api.err(
        "compute/pools/create",
        {"tenantId": "acme", "siteId": root_site, "class": "metal-host"},
        "NOT_FOUND",
        "siteId",
    )
    await api.err(
        "compute/pools/create",
        {"tenantId": "root", "siteId": "site_01m8p96ta1gm587tbv5pw7gvfq", "class": "metal-host"},
        "NOT_FOUND",
        "siteId",
    )
    assert snapshot(db) == before


async def test_p2_create_needs_compute_pools_create(api: Api, db: Path) -> None:
    """P2: create is decided as compute:pools:create on the tenant."""
    await api.tenant("acme")
    admin = await api.token_for("acme")
    site = await api.site("acme", kind="custom", token=admin)
    reader = await api.token_for(
        "acme",
        [{"effect": "allow", "actions": ["compute:pools:read"], "resources": ["compute-tenant"]}],
    )
    before = snapshot(db)
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host"}
    await api.err("compute/pools/create", body, "PERMISSION_DENIED", token=reader)
    assert snapshot(db) == before
    creator = await api.token_for(
        "acme",
        [{"effect": "allow", "actions": ["compute:pools:create"], "resources": ["compute-tenant"]}],
    )
    pool = await api.ok("compute/pools/create", body, creator)
    assert pool["ownerTenantId"] == "acme"


async def test_p2_tenant_creates_on_its_own_custom_site(api: Api) -> None:
    """P2: a customer creates pools on its own custom site; root acts for any tenant (fleet)."""
    await api.tenant("acme")
    site = await api.site("acme", kind="custom")
    pool = await api.pool(site, tenant_id="acme")
    assert pool["ownerTenantId"] == "acme"
    assert pool["owned"] is True


async def test_p3_owner_quota_default_and_given(api: Api) -> None:
    """P3: ownerQuota defaults to {gpu: 2147483647}; given rows replace the default."""
    site = await api.site()
    pool = await api.pool(site)
    assert [(q["resource"], q["max"], q["used"], q["available"]) for q in pool["quotas"]] == [
        ("gpu", 2147483647, 0, 2147483647)
    ]
    mig = await api.pool(site, sharing="mig", ownerQuota={"gpu.mig": 70})
    assert [(q["resource"], q["max"]) for q in mig["quotas"]] == [("gpu.mig", 70)]


async def test_p4_idempotency_key_returns_the_same_pool(api: Api, db: Path) -> None:
    """P4: the id derives from tenant, caller and key; a retry returns the stored pool."""
    site = await api.site()
    first = await api.pool(site, idempotencyKey="pool-fra1-h100")
    assert len(first["id"]) == len("pool_") + 52
    before = snapshot(db)
    again = await api.pool(site, idempotencyKey="pool-fra1-h100", policy={"maxPending": "1h"})
    assert again["id"] == first["id"]
    assert again["policy"] == {}  # the stored pool, not the retry's body
    assert snapshot(db) == before
    other = await api.pool(site, idempotencyKey="pool-fra1-h100-b")
    assert other["id"] != first["id"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("class", "metal-dedicated"),
        ("sharing", "mig"),
        ("agent", "none"),
    ],
)
async def test_p4_same_key_different_parameters_is_conflict(
    api: Api, db: Path, field: str, value: str
) -> None:
    """P4: the same key with a different site, class, sharing or agent is CONFLICT."""
    site = await api.site()
    await api.pool(site, idempotencyKey="k1")
    before = snapshot(db)
    body = {"tenantId": "root", "siteId": site, "class": "metal-host", "idempotencyKey": "k1"}
    body[field] = value
    error = await api.err("compute/pools/create", body, "CONFLICT", "idempotencyKey")
    assert error["details"]["differs"] == field
    assert snapshot(db) == before


async def test_p4_same_key_other_site_or_provider_account_is_conflict(api: Api) -> None:
    """P4: a different site or provider account under one key is CONFLICT too."""
    site = await api.site()
    other_site = await api.site(name="fra2")
    await api.pool(site, idempotencyKey="k2")
    body = {"tenantId": "root", "siteId": other_site, "class": "metal-host", "idempotencyKey": "k2"}
    await api.err("compute/pools/create", body, "CONFLICT", "idempotencyKey")
    provider = {"class": "provider", "providerAccountId": PACCT, "idempotencyKey": "k3"}
    await api.pool(site, **provider)
    provider["providerAccountId"] = "pacct_01m8p96ta1gm587tbv5pw7gvfr"
    await api.err(
        "compute/pools/create",
        {"tenantId": "root", "siteId": site, **provider},
        "CONFLICT",
        "idempotencyKey",
    )


async def test_p4_retry_skips_the_second_iam_decision(api: Api, db: Path) -> None:
    """P4: a retry returns the stored pool without a second create decision, but only to a
    caller that may read it; anyone else learns nothing (NOT_FOUND)."""
    await api.tenant("acme")
    admin = await api.token_for("acme")
    site = await api.site("acme", kind="custom", token=admin)
    body = {"tenantId": "acme", "siteId": site, "class": "metal-host", "idempotencyKey": "k"}
    first = await api.ok("compute/pools/create", body, admin)
    reader = await api.token_for(
        "acme",
        [
            {
                "effect": "allow",
                "actions": ["compute:pools:read"],
                "resources": ["compute-tenant", "compute-pool"],
            }
        ],
    )
    # Another caller of the same tenant derives the same id (the caller is the tenant).
    again = await api.ok("compute/pools/create", body, reader)
    assert again["id"] == first["id"]
    blind = await api.token_for(
        "acme",
        [{"effect": "allow", "actions": ["compute:pools:create"], "resources": ["compute-tenant"]}],
    )
    before = snapshot(db)
    await api.err("compute/pools/create", body, "NOT_FOUND", "idempotencyKey", blind)
    await api.err(
        "compute/pools/create", {**body, "class": "vps-host"}, "NOT_FOUND", "idempotencyKey", blind
    )
    assert snapshot(db) == before


async def test_p5_provider_rules(api: Api, db: Path) -> None:
    """P5: provider needs providerAccountId and agent none; other classes refuse the account."""
    site = await api.site()
    before = snapshot(db)
    base = {"tenantId": "root", "siteId": site}
    await api.err(
        "compute/pools/create",
        {**base, "class": "provider"},
        "INVALID_INPUT",
        "providerAccountId",
    )
    await api.err(
        "compute/pools/create",
        {**base, "class": "provider", "providerAccountId": PACCT, "agent": "bcd"},
        "INVALID_INPUT",
        "agent",
    )
    await api.err(
        "compute/pools/create",
        {**base, "class": "metal-host", "providerAccountId": PACCT},
        "INVALID_INPUT",
        "providerAccountId",
    )
    assert snapshot(db) == before


@pytest.mark.parametrize(
    ("policy", "field"),
    [
        ({"hugepages": {"2Mi": -1}}, "policy.hugepages.2Mi"),
        ({"hugepages": {"4Mi": 2}}, "policy.hugepages.4Mi"),
        ({"overcommit": {"vcpu": 0}}, "policy.overcommit.vcpu"),
        ({"overcommit": {"vcpu": -1.5}}, "policy.overcommit.vcpu"),
        ({"overcommit": {"memoryGiB": "2"}}, "policy.overcommit.memoryGiB"),
        ({"overcommit": {"memoryGiB": True}}, "policy.overcommit.memoryGiB"),
        ({"hostReserve": {"vcpu": -2}}, "policy.hostReserve.vcpu"),
        ({"kernelModules": {"load": ["bad name"]}}, "policy.kernelModules.load.0"),
        ({"kernelModules": {"load": ["vfio"], "blacklist": ["vfio"]}}, "policy.kernelModules"),
        ({"cpu": {"governor": "turbo"}}, "policy.cpu.governor"),
        ({"cpu": {"isolate": "8-4"}}, "policy.cpu.isolate"),
        ({"iommu": {"mode": "maybe"}}, "policy.iommu.mode"),
        ({"gpu": {"powerLimitW": 0}}, "policy.gpu.powerLimitW"),
        ({"gpu": {"computeMode": "shared"}}, "policy.gpu.computeMode"),
        ({"replicas": 4}, "policy.replicas"),
        ({"maxPending": "six hours"}, "policy.maxPending"),
        ({"acceptance": [{"kind": "diag.unknown"}]}, "policy.acceptance.0.kind"),
        ({"admission": {"budgetCheck": "yes"}}, "policy.admission.budgetCheck"),
        ({"singleTenant": "yes"}, "policy.singleTenant"),
        ({"prewarmImages": ["Not An Image"]}, "policy.prewarmImages.0"),
        ({"migLayout": {"default": ["3g.40gb"]}}, "policy.migLayout"),
    ],
)
async def test_p6_policy_validators_refuse_bad_values(
    api: Api, db: Path, policy: dict[str, object], field: str
) -> None:
    """P6: every module's validator runs on create; a bad value is INVALID_INPUT 'policy: ...'."""
    site = await api.site()
    before = snapshot(db)
    body = {"tenantId": "root", "siteId": site, "class": "metal-host", "gpuModel": "H100"}
    error = await api.err(
        "compute/pools/create", {**body, "policy": policy}, "INVALID_INPUT", field
    )
    assert error["message"].startswith("policy: ")
    assert snapshot(db) == before


@pytest.mark.parametrize(
    ("sharing", "policy", "field"),
    [
        ("timeslice", {}, "policy.replicas"),
        ("mps", {"replicas": 1}, "policy.replicas"),
        ("mps", {"replicas": 49}, "policy.replicas"),
        ("mig", {"migLayout": {"default": ["1g.12gb", "1g.10gb"]}}, "policy.migLayout.default"),
        ("mig", {"migLayout": {"default": ["4g.40gb", "4g.40gb"]}}, "policy.migLayout.default"),
        ("mig", {"migLayout": {"default": ["9g.90gb"]}}, "policy.migLayout.default"),
        ("mig", {"migLayout": {"GPU-x": ["1g.10gb"]}}, "policy.migLayout"),
    ],
)
async def test_p6_sharing_and_mig_layout_as_nodes_get_them(
    api: Api, sharing: str, policy: dict[str, object], field: str
) -> None:
    """P6, S1, U3: replicas 2…48 for timeslice/mps; MIG profiles must exist and fit the model."""
    site = await api.site()
    body = {"tenantId": "root", "siteId": site, "class": "metal-host", "gpuModel": "H100"}
    await api.err(
        "compute/pools/create",
        {**body, "sharing": sharing, "policy": policy},
        "INVALID_INPUT",
        field,
    )


async def test_p6_good_policies_are_stored(api: Api) -> None:
    """P6: valid host, sharing and MIG policies pass every validator and round-trip."""
    site = await api.site()
    policy = {
        "acceptance": [{"kind": "diag.nvml"}],
        "maxPending": "6h",
        "overcommit": {"vcpu": 2, "memoryGiB": 1.5},
        "hostReserve": {"vcpu": 8, "memoryGiB": 64},
        "hugepages": {"2Mi": 1024, "1Gi": 16},
        "kernelModules": {
            "load": ["vfio-pci"],
            "blacklist": ["nouveau"],
            "options": {"nvidia": "NVreg_EnableGpuFirmware=0"},
        },
        "cpu": {"governor": "performance", "isolate": "2-31,34-63"},
        "iommu": {"mode": "passthrough"},
        "gpu": {"persistenceMode": True, "computeMode": "exclusive-process", "powerLimitW": 600},
        "prewarmImages": ["nvcr.io/nvidia/pytorch:25.01-py3"],
        "joinAttestors": ["join-token"],
        "admission": {"budgetCheck": "meter"},
    }
    pool = await api.pool(site, policy=policy)
    assert pool["policy"] == policy
    mig = await api.pool(
        site,
        sharing="mig",
        policy={
            "migLayout": {
                "default": ["3g.40gb", "4g.40gb"],
                "GPU-0b4c2c6f-6b9e-4b8e-9c9c-2f6f1c6f9a11": ["1g.12gb"] * 7,
            }
        },
    )
    assert mig["sharing"] == "mig"
    slots = await api.pool(site, sharing="timeslice", policy={"replicas": 48})
    assert slots["policy"]["replicas"] == 48


async def test_p7_kubernetes_set_all_or_none_and_platform_operated(api: Api, db: Path) -> None:
    """P7: the kubernetes join set is all or none; on a platform site it needs platformOperated."""
    site = await api.site()
    join = {
        "apiServer": "https://k8s.example:6443",
        "token": "abcdef.0123456789abcdef",
        "caCertHash": "sha256:" + "a" * 64,
    }
    before = snapshot(db)
    body = {"tenantId": "root", "siteId": site, "class": "metal-host"}
    await api.err(
        "compute/pools/create",
        {**body, "policy": {"kubernetes": {"apiServer": join["apiServer"]}}},
        "INVALID_INPUT",
        "policy.kubernetes.token",
    )
    await api.err(
        "compute/pools/create",
        {**body, "policy": {"kubernetes": join}},
        "INVALID_INPUT",
        "policy.platformOperated",
    )
    assert snapshot(db) == before
    pool = await api.pool(site, policy={"kubernetes": join, "platformOperated": True})
    assert pool["policy"]["kubernetes"] == join
    await api.tenant("acme")
    custom = await api.site("acme", kind="custom")
    tenant_pool = await api.pool(custom, tenant_id="acme", policy={"kubernetes": join})
    assert tenant_pool["ownerTenantId"] == "acme"


async def test_p8_join_attestors_must_be_registered(api: Api) -> None:
    """P8: joinAttestors may name only join-token and registered attestors."""
    site = await api.site()
    error = await api.err(
        "compute/pools/create",
        {
            "tenantId": "root",
            "siteId": site,
            "class": "metal-host",
            "policy": {"joinAttestors": ["join-token", "tpm-quote"]},
        },
        "INVALID_INPUT",
        "policy.joinAttestors.1",
    )
    assert "tpm-quote" in error["message"]


async def test_p9_unknown_policy_fields_round_trip(api: Api) -> None:
    """P9: unknown policy fields are stored and returned as given."""
    site = await api.site()
    policy = {"maxPending": "30m", "x-team": {"owner": "infra", "n": [1, 2.5, None, True]}}
    pool = await api.pool(site, policy=policy)
    assert pool["policy"] == policy
    got = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool["id"]})
    assert got["policy"] == policy
