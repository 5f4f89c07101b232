"""F8, R5: pools/list builds its page straight from its rows, byte for byte the answer the
typed views give; a pool whose stored policy is damaged is still read, and its nodes are
quarantined by the reconciler."""

from pathlib import Path
from typing import Any

import msgspec
import pytest

from controlplane.api.answer import encode_answer
from controlplane.services.views import pool_view
from controlplane.storage import pools as pool_sql
from controlplane.storage.db import Store
from controlplane.storage.types import PoolRow
from shared.schemas import PoolList, PoolView
from tests.conftest import Api, execute
from tests.nodes import DGX_POLICY, joined, one_pass, pool_with_token, recorded, report

PACCT = "pacct_" + "0" * 26
KUBERNETES = {
    "apiServer": "https://k8s.example:6443",
    "token": "abcdef.0123456789abcdef",
    "caCertHash": "sha256:" + "a" * 64,
}


def typed_list(db: Path | str, tenant_id: str, pool_ids: list[str]) -> bytes:
    """The page as the typed views build it: each pool read into its row, then its view."""
    store = Store(db)
    try:
        with store.snapshot() as reader:
            views = []
            for pool_id in pool_ids:
                pool = pool_sql.pool_for_tenant(reader, tenant_id, pool_id)
                assert pool is not None
                views.append(pool_view(reader, pool, tenant_id))
            return encode_answer(PoolList(items=views, next=None))
    finally:
        store.close()


async def listed(api: Api, tenant_id: str, token: str | None = None) -> bytes:
    response = await api.client.post(
        "/api/compute/pools/list",
        json={"tenantId": tenant_id},
        headers={"Authorization": f"Bearer {token or api.token}"},
    )
    assert response.status == 200
    return await response.read()


async def test_f8_a_pools_page_is_byte_for_byte_the_typed_views(api: Api, db: Path | str) -> None:
    """F8: the page built from rows is the page of typed views, byte for byte, over varied
    pools: offered with quotas to several tenants, archived, a provider pool, a policy with
    fields the code does not read and one with the owner's secret, as the owner and as a
    tenant offered them (its quotas, no offers, no secret)."""
    site = await api.site()
    await api.tenant("acme")
    await api.tenant("beta")
    plain = await api.pool(site)
    unknown = await api.pool(
        site, policy={"maxPending": "6h", "custom": {"nested": [1, 2.5, "ü", None]}, "z": True}
    )
    secret = await api.pool(site, policy={"kubernetes": KUBERNETES, "platformOperated": True})
    provider = await api.pool(site, **{"class": "provider", "providerAccountId": PACCT})
    archived = await api.pool(site, gpuModel=None)
    for pool in (plain, unknown, secret):
        await api.offer(pool["id"], "acme", {"gpu": 3, "vcpu": 40})
    await api.offer(unknown["id"], "beta", {"gpu": 1}, includeDescendants=True, priority=5)
    await api.offer(archived["id"], "acme", {"gpu": 2})
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": archived["id"]})
    execute(db, "UPDATE quotas SET used = 2 WHERE tenant_id = 'acme' AND resource = 'gpu'")
    acme = await api.token_for("acme")
    for tenant, token in (("root", None), ("acme", acme)):
        page = await listed(api, tenant, token)
        ids = [item["id"] for item in msgspec.json.decode(page)["items"]]
        assert page == typed_list(db, tenant, ids), tenant
    root_ids = [p["id"] for p in (plain, unknown, secret, provider, archived)]
    assert sorted(root_ids) == [
        item["id"] for item in msgspec.json.decode(await listed(api, "root"))["items"]
    ]
    shown = {i["id"]: i for i in msgspec.json.decode(await listed(api, "acme", acme))["items"]}
    assert "token" not in shown[secret["id"]]["policy"]["kubernetes"]
    assert archived["id"] not in shown  # the archive withdrew acme's offer


async def test_r5_a_damaged_policy_is_read_and_its_nodes_quarantined(
    api: Api, db: Path | str
) -> None:
    """R5: a pool whose stored policy no longer decodes as JSON (a damaged row) is still read:
    pools/get and pools/list show its policy as {}, nodes/list of it answers; a reconcile
    pass quarantines its node with a reason naming the policy, and a pool update that gives
    a policy repairs it."""
    pool, token = await pool_with_token(api, policy=DGX_POLICY)
    node = await joined(api, token, recorded("dgx-h100-01"))
    execute(db, "UPDATE pools SET policy = ? WHERE id = ?", ['{"hostReserve": {"vcpu', pool])
    got = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool})
    assert got["policy"] == {} and got["version"] == 1
    listing = await api.ok("compute/pools/list", {"tenantId": "root"})
    assert [item["policy"] for item in listing["items"]] == [{}]
    nodes = await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool})
    assert [n["id"] for n in nodes["items"]] == [node["nodeId"]]
    grown = recorded("dgx-h100-01")
    grown = msgspec.structs.replace(grown, memory_total_bytes=grown.memory_total_bytes * 2)
    status, answer = await report(api, node, grown)  # the reconciler's to look at it again
    assert status == 200, answer
    one_pass(db)  # type: ignore[arg-type]
    nodes = await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool})
    assert nodes["items"][0]["state"] == "quarantined"
    assert "policy" in nodes["items"][0]["stateReason"], nodes["items"][0]
    repaired = {"tenantId": "root", "poolId": pool, "policy": DGX_POLICY}
    assert (await api.ok("compute/pools/update", repaired))["policy"] == DGX_POLICY


def test_r5_a_damaged_policy_fails_only_the_step_that_needs_it() -> None:
    """R5: the row loads; its accessors answer the defaults; the policy itself is
    INVALID_STATE naming the pool's policy, and its view shows {}."""
    from shared.errors import InvalidState

    pool = PoolRow(
        id="pool_1",
        owner_tenant_id="t1",
        site_id="site_1",
        pool_class="metal-host",
        gpu_model=None,
        sharing="exclusive",
        agent="bcd",
        policy_json="[1, 2",
        provider_account_id=None,
        version=1,
        archived_at=None,
        created_at="2026-01-01T00:00:00Z",
        updated_at="2026-01-01T00:00:00Z",
    )
    assert pool.stored_policy is None and pool.model is None
    assert pool.replicas == 1 and pool.max_pending is None and not pool.single_tenant
    with pytest.raises(InvalidState, match="policy") as refused:
        assert pool.policy is None  # never reached: reading it raises
    assert refused.value.details == {"field": "policy"}
    shown: Any = pool_view(None, pool, "t1", quotas=[], offers=[])  # type: ignore[arg-type]
    assert isinstance(shown, PoolView) and shown.policy == {}
