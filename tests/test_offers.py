"""pools.offer, pools.unoffer and quotas.set: O1–O6."""

import re
from pathlib import Path
from typing import Any

from controlplane.api.keys import RUNTIME
from controlplane.capacity.liveness import Liveness
from controlplane.reconciler import reconcile_pass
from controlplane.storage.db import Store
from tests.conftest import Api, execute, snapshot
from tests.nodes import held, joined, pool_with_token, recorded
from tests.statements import mutation, writer_statements


async def setup_offered(api: Api) -> tuple[str, str]:
    """A root pool on a shared site, and tenant acme."""
    await api.tenant("acme")
    site = await api.site()
    pool = await api.pool(site)
    return site, pool["id"]


async def test_o1_only_the_owner_offers(api: Api, db: Path) -> None:
    """O1: offer is owner only: an offered tenant or a stranger gets NOT_FOUND."""
    _, pool = await setup_offered(api)
    await api.tenant("beta")
    await api.offer(pool, "acme")
    acme = await api.token_for("acme")
    beta = await api.token_for("beta")
    before = snapshot(db)
    body = {"poolId": pool, "toTenantId": "beta", "quota": {"gpu": 1}}
    await api.err("compute/pools/offer", {"tenantId": "acme", **body}, "NOT_FOUND", "poolId", acme)
    await api.err("compute/pools/offer", {"tenantId": "beta", **body}, "NOT_FOUND", "poolId", beta)
    await api.err(
        "compute/pools/unoffer",
        {"tenantId": "acme", "poolId": pool, "toTenantId": "acme"},
        "NOT_FOUND",
        "poolId",
        acme,
    )
    assert snapshot(db) == before


async def test_o1_offering_again_updates_row_and_quota(api: Api) -> None:
    """O1, O3: offering again updates the offer row and the quota; priority round-trips."""
    _, pool = await setup_offered(api)
    await api.offer(pool, "acme", {"gpu": 32}, priority=10)
    seen = await api.offer(
        pool, "acme", {"gpu": 16, "vcpu": 64}, priority=-5, includeDescendants=True
    )
    assert {q["resource"]: q["max"] for q in seen["quotas"]} == {"gpu": 16, "vcpu": 64}
    owner = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool})
    assert owner["offers"] == [
        {
            "toTenantId": "acme",
            "quota": {"gpu": 16, "vcpu": 64},
            "includeDescendants": True,
            "priority": -5,
            "notAfter": None,
        }
    ]


async def test_o2_max_below_used_is_raised_to_used(api: Api, db: Path) -> None:
    """O2: a new max below what is in use (a placed reservation's 12 vCPUs) is raised to it."""
    await api.tenant("acme")
    pool, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    await api.offer(pool, "acme", {"vcpu": 32})
    await held(api, pool, "acme", {"vcpu": 12}, await api.token_for("acme"))
    seen = await api.offer(pool, "acme", {"vcpu": 4})
    assert [(q["max"], q["used"], q["available"]) for q in seen["quotas"]] == [(12, 12, 0)]
    offered = await api.ok("compute/events/list", {"tenantId": "root", "types": ["pool.offered"]})
    assert offered["items"][-1]["data"]["quota"] == {"vcpu": 12}  # the stored max, not the asked
    rows = await api.ok(
        "compute/quotas/set",
        {"tenantId": "root", "poolId": pool, "forTenantId": "acme", "quota": {"vcpu": 3}},
    )
    assert [(q["max"], q["used"]) for q in rows["items"]] == [(12, 12)]


async def test_o3_defaults_include_descendants_false_priority_zero(api: Api) -> None:
    """O3: includeDescendants defaults to false and priority to 0."""
    _, pool = await setup_offered(api)
    await api.offer(pool, "acme")
    owner = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool})
    assert owner["offers"][0]["includeDescendants"] is False
    assert owner["offers"][0]["priority"] == 0


async def test_o4_archived_pool_cannot_be_offered(api: Api, db: Path) -> None:
    """O4: offering an archived pool is INVALID_STATE."""
    _, pool = await setup_offered(api)
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    before = snapshot(db)
    await api.err(
        "compute/pools/offer",
        {"tenantId": "root", "poolId": pool, "toTenantId": "acme", "quota": {"gpu": 1}},
        "INVALID_STATE",
    )
    assert snapshot(db) == before


async def test_o4_timeslice_and_mps_pools_only_to_their_owner(api: Api, db: Path) -> None:
    """O4, S1: timeslice and mps pools are single-tenant; offering to the owner sets its quota."""
    await api.tenant("acme")
    site = await api.site()
    for sharing in ("timeslice", "mps"):
        pool = await api.pool(site, sharing=sharing, policy={"replicas": 4})
        before = snapshot(db)
        await api.err(
            "compute/pools/offer",
            {
                "tenantId": "root",
                "poolId": pool["id"],
                "toTenantId": "acme",
                "quota": {"gpu.slot": 4},
            },
            "INVALID_STATE",
            "toTenantId",
        )
        assert snapshot(db) == before
        own = await api.offer(pool["id"], "root", {"gpu.slot": 32})
        assert {q["resource"]: q["max"] for q in own["quotas"]}["gpu.slot"] == 32


async def test_o4_pool_with_tenant_owned_nodes_only_to_owner(api: Api, db: Path) -> None:
    """O4: a pool holding tenant-owned nodes is offered only to its owner."""
    _, pool = await setup_offered(api)
    execute(
        db,
        "INSERT INTO nodes (id, pool_id, hostname, tenant_owned, state, created_at) "
        "VALUES ('node_01', ?, 'h1', 1, 'ready', 'now')",
        (pool,),
    )
    await api.err(
        "compute/pools/offer",
        {"tenantId": "root", "poolId": pool, "toTenantId": "acme", "quota": {"gpu": 1}},
        "INVALID_STATE",
        "toTenantId",
    )


async def test_o4_single_tenant_pool(api: Api, db: Path) -> None:
    """O4: a singleTenant pool goes to one tenant besides its owner, never with includeDescendants."""
    await api.tenant("acme")
    await api.tenant("beta")
    site = await api.site()
    pool = (await api.pool(site, policy={"singleTenant": True}))["id"]
    await api.err(
        "compute/pools/offer",
        {
            "tenantId": "root",
            "poolId": pool,
            "toTenantId": "acme",
            "quota": {"gpu": 1},
            "includeDescendants": True,
        },
        "INVALID_STATE",
        "includeDescendants",
    )
    await api.offer(pool, "acme")
    await api.offer(pool, "acme", {"gpu": 2})  # re-offering to the same tenant is fine
    before = snapshot(db)
    await api.err(
        "compute/pools/offer",
        {"tenantId": "root", "poolId": pool, "toTenantId": "beta", "quota": {"gpu": 1}},
        "INVALID_STATE",
        "toTenantId",
    )
    assert snapshot(db) == before


async def test_o5_offer_writes_authz_row_event_and_answers_as_that_tenant(
    api: Api, db: Path
) -> None:
    """O5: the offered tenant's authz row holds gpuModel, class, sharing, region, owned."""
    _, pool = await setup_offered(api)
    seen = await api.offer(pool, "acme", {"gpu": 32})
    assert seen["owned"] is False
    assert "offers" not in seen
    assert [q["tenantId"] for q in seen["quotas"]] == ["acme"]
    rows = execute(
        db,
        "SELECT gpu_model, class, sharing, region, owned FROM pool_authz WHERE tenant_id = 'acme'",
    )
    assert rows == [("H100", "metal-host", "exclusive", "eu-central", 0)]
    events = await api.ok("compute/events/list", {"tenantId": "root", "types": ["pool.offered"]})
    assert [e["data"]["toTenantId"] for e in events["items"]] == ["acme"]


async def test_o6_unoffer(api: Api, db: Path) -> None:
    """O6: unoffer answers removed; quotas drop to in use; authz row gone; event once."""
    await api.tenant("acme")
    pool, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    await api.offer(pool, "acme", {"gpu": 32, "vcpu": 10})
    acme = await api.token_for("acme")
    await held(api, pool, "acme", {"gpu": 3}, acme)
    body = {"tenantId": "root", "poolId": pool, "toTenantId": "acme"}
    assert await api.ok("compute/pools/unoffer", body) == {"removed": True}
    rows = execute(
        db, "SELECT resource, max, used FROM quotas WHERE tenant_id = 'acme' ORDER BY resource"
    )
    assert rows == [("gpu", 3, 3), ("vcpu", 0, 0)]
    assert execute(db, "SELECT count(*) FROM pool_authz WHERE tenant_id = 'acme'") == [(0,)]
    await api.err(
        "compute/pools/get", {"tenantId": "acme", "poolId": pool}, "NOT_FOUND", token=acme
    )
    before = snapshot(db)
    assert await api.ok("compute/pools/unoffer", body) == {"removed": False}
    assert snapshot(db) == before  # no second pool.unoffered
    events = await api.ok("compute/events/list", {"tenantId": "root", "types": ["pool.unoffered"]})
    assert len(events["items"]) == 1


async def test_o6_unoffering_the_owner_is_invalid_input(api: Api, db: Path) -> None:
    """O6: a pool cannot be unoffered from its owner."""
    _, pool = await setup_offered(api)
    before = snapshot(db)
    await api.err(
        "compute/pools/unoffer",
        {"tenantId": "root", "poolId": pool, "toTenantId": "root"},
        "INVALID_INPUT",
        "toTenantId",
    )
    assert snapshot(db) == before


async def test_offer_to_unknown_tenant_is_not_found(api: Api, db: Path) -> None:
    """Offering to a tenant that does not exist changes nothing."""
    _, pool = await setup_offered(api)
    before = snapshot(db)
    await api.err(
        "compute/pools/offer",
        {"tenantId": "root", "poolId": pool, "toTenantId": "ghost", "quota": {"gpu": 1}},
        "NOT_FOUND",
        "toTenantId",
    )
    assert snapshot(db) == before


async def test_quotas_set_emits_quota_updated_only_on_change(api: Api, db: Path) -> None:
    """E1: quotas.set writes rows and quota.updated in one transaction; no change, no event."""
    _, pool = await setup_offered(api)
    await api.offer(pool, "acme", {"gpu": 8})
    body: dict[str, Any] = {
        "tenantId": "root",
        "poolId": pool,
        "forTenantId": "acme",
        "quota": {"gpu": 9},
    }
    rows = await api.ok("compute/quotas/set", body)
    assert [(q["resource"], q["max"]) for q in rows["items"]] == [("gpu", 9)]
    before = snapshot(db)
    await api.ok("compute/quotas/set", body)
    assert snapshot(db) == before
    events = await api.ok(
        "compute/events/list",
        {"tenantId": "acme", "types": ["quota.updated"]},
        await api.token_for("acme"),
    )
    assert [e["data"] for e in events["items"]] == [{"forTenantId": "acme", "quota": {"gpu": 9}}]


async def test_quotas_set_needs_an_offer_and_quotas_list_shows_own_rows(api: Api, db: Path) -> None:
    """quotas.set is for the owner or an offered tenant; quotas.list shows the caller's rows."""
    _, pool = await setup_offered(api)
    before = snapshot(db)
    await api.err(
        "compute/quotas/set",
        {"tenantId": "root", "poolId": pool, "forTenantId": "acme", "quota": {"gpu": 1}},
        "INVALID_STATE",
        "forTenantId",
    )
    assert snapshot(db) == before
    await api.offer(pool, "acme", {"gpu": 5})
    acme = await api.token_for("acme")
    listed = await api.ok("compute/quotas/list", {"tenantId": "acme"}, acme)
    assert [(q["tenantId"], q["resource"], q["max"]) for q in listed["items"]] == [
        ("acme", "gpu", 5)
    ]
    one = await api.ok("compute/quotas/list", {"tenantId": "acme", "poolId": pool}, acme)
    assert one == listed
    other = await api.pool(await api.site(name="fra2"))
    await api.err(
        "compute/quotas/list",
        {"tenantId": "acme", "poolId": other["id"]},
        "NOT_FOUND",
        "poolId",
        acme,
    )


async def test_r6_pending_reservations_hold_no_quota_after_an_unoffer(api: Api, db: Path) -> None:
    """R6: with 2 GPUs placed and 3 pending, an unoffer drops max to the 2 in use; once the 3
    fail with PoolGone, a re-offer of another resource leaves nothing bookable on gpu beyond
    the 2 the owner never re-granted."""
    await api.tenant("acme")
    pool, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    await api.offer(pool, "acme", {"gpu": 16})
    acme = await api.token_for("acme")
    await held(api, pool, "acme", {"gpu": 2}, acme)
    await held(api, pool, "root", {"gpu": 6})  # the owner fills the host: acme's next waits
    pending = await api.ok(
        "compute/reservations/create",
        {"tenantId": "acme", "poolId": pool, "resources": {"gpu": 3}},
        acme,
    )
    assert pending["state"] == "pending"
    body = {"tenantId": "root", "poolId": pool, "toTenantId": "acme"}
    assert await api.ok("compute/pools/unoffer", body) == {"removed": True}
    assert execute(db, "SELECT max FROM quotas WHERE tenant_id = 'acme'") == [(2,)]
    await api.offer(pool, "acme", {"vcpu": 8})  # before the pass: the pending 3 still count
    assert execute(db, "SELECT max FROM quotas WHERE tenant_id = 'acme' AND resource = 'gpu'") == [
        (2,)
    ]
    store = Store(db)
    try:
        store.transact(lambda d: reconcile_pass(d, Liveness(), 3600, True))
    finally:
        store.close()
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "acme", "reservationId": pending["id"]}, acme
    )
    assert (got["state"], got["reason"]) == ("failed", "PoolGone")
    rows = execute(db, "SELECT resource, max, used FROM quotas WHERE tenant_id = 'acme' ORDER BY 1")
    assert rows == [("gpu", 2, 2), ("vcpu", 8, 0)]


POOL_READ = re.compile(r"^SELECT .* JOIN pools p\b|^SELECT .* FROM pools\b", re.DOTALL)
# a pools/offer's own statements in its transaction (framing aside): the checks, the offer
# (its end kept, C3), the authz and quota rows, the event, and the coverage read (C5)
OFFER_STATEMENTS = 15


async def test_r1_an_offer_reads_its_pool_once_in_its_transaction(api: Api) -> None:
    """R1, R3: pools/offer's decision finds the pool (its version checked) and the service
    takes that row: one read of the pool in the transaction, and a bounded statement count."""
    _, pool = await setup_offered(api)
    store = api.client.app[RUNTIME].db
    body = {"tenantId": "root", "poolId": pool, "toTenantId": "acme", "quota": {"gpu": 2}}
    with writer_statements(store) as seen:
        await api.ok("compute/pools/offer", {**body, "version": 1})
    own = mutation(seen)
    print(len(own), *own, sep="\n")
    assert len([sql for sql in own if POOL_READ.match(sql)]) == 1  # the gate's read
    assert len([sql for sql in own if "SELECT * FROM quotas" in sql]) == 1
    assert len(own) <= OFFER_STATEMENTS
