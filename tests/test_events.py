"""events.list and E1: each event in the transaction of its change, with a gapless seq."""

from pathlib import Path

from tests.conftest import Api, execute


async def test_e1_every_pool_event_with_gapless_seq(api: Api, db: Path) -> None:
    """E1: pool.created/offered/unoffered/updated/archived and quota.updated, seq without gaps."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "acme")
    await api.ok(
        "compute/quotas/set",
        {"tenantId": "root", "poolId": pool, "forTenantId": "acme", "quota": {"gpu": 3}},
    )
    await api.ok(
        "compute/pools/unoffer", {"tenantId": "root", "poolId": pool, "toTenantId": "acme"}
    )
    await api.ok(
        "compute/pools/update", {"tenantId": "root", "poolId": pool, "policy": {"maxPending": "1h"}}
    )
    # A refused request writes no event and burns no seq.
    await api.err(
        "compute/pools/update",
        {"tenantId": "root", "poolId": pool, "policy": {"replicas": 2}},
        "INVALID_INPUT",
    )
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    listed = await api.ok("compute/events/list", {"tenantId": "root", "limit": 1000})
    seqs = [e["seq"] for e in listed["items"]]
    assert seqs == list(range(1, len(seqs) + 1))
    pool_types = [e["type"] for e in listed["items"] if e["poolId"] == pool]
    assert pool_types == [
        "pool.created",
        "pool.offered",
        "quota.updated",
        "pool.unoffered",
        "pool.updated",
        "pool.archived",
    ]
    assert execute(db, "SELECT count(*) FROM events") == [(len(seqs),)]


async def test_events_cursor_limit_and_types(api: Api) -> None:
    """events.list pages with after/limit and filters by types; next is the last seq returned."""
    site = await api.site()
    for _ in range(3):
        await api.pool(site)
    first = await api.ok("compute/events/list", {"tenantId": "root", "limit": 2})
    assert len(first["items"]) == 2 and first["next"] == first["items"][-1]["seq"]
    rest = await api.ok(
        "compute/events/list", {"tenantId": "root", "after": first["next"], "limit": 100}
    )
    assert rest["items"][0]["seq"] == first["next"] + 1
    end = await api.ok("compute/events/list", {"tenantId": "root", "after": rest["next"]})
    assert end == {"items": [], "next": rest["next"]}
    created = await api.ok("compute/events/list", {"tenantId": "root", "types": ["pool.created"]})
    assert len(created["items"]) == 3


async def test_events_are_visible_only_to_their_audience(api: Api) -> None:
    """A tenant sees the events about its own pools and offers, never another tenant's."""
    await api.tenant("acme")
    await api.tenant("beta")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "beta")
    acme = await api.token_for("acme")
    seen = await api.ok("compute/events/list", {"tenantId": "acme"}, acme)
    assert {e["type"] for e in seen["items"]} <= {"tenant.created", "credential.created"}
    assert all(e["poolId"] is None for e in seen["items"])
    beta = await api.token_for("beta")
    beta_seen = await api.ok(
        "compute/events/list", {"tenantId": "beta", "types": ["pool.offered"]}, beta
    )
    assert [e["poolId"] for e in beta_seen["items"]] == [pool]


def test_b1_a_tenants_events_page_walks_its_index_from_any_cursor(tmp_path: Path) -> None:
    """B1: the statement events/list runs for a tenant's page reads its audience rows' primary
    key from the cursor and stops at the limit: no sort of the tenant's whole history."""
    from controlplane.storage import events
    from controlplane.storage.db import Store

    store = Store(tmp_path / "bc.db")
    try:
        ran: list[str] = []
        conn = store.reader.conn  # type: ignore[attr-defined]
        conn.set_trace_callback(ran.append)
        with store.snapshot() as db:
            events.list_events(db, tenant_id="acme", after=10, limit=100, types=None)
        conn.set_trace_callback(None)
        [statement] = [sql for sql in ran if "FROM event_audience" in sql]
        plan = conn.execute(f"EXPLAIN QUERY PLAN {statement}").fetchall()
        details = " | ".join(str(row[-1]) for row in plan)
        assert "USING PRIMARY KEY (tenant_id=? AND seq>?)" in details, details
        assert "TEMP B-TREE" not in details, details
    finally:
        store.close()
