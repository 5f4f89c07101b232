"""Concurrency: one writer, one transaction per mutation, event inside it."""

import asyncio
import json
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from controlplane.storage import events
from controlplane.storage.db import Store
from controlplane.storage.sql import Database
from tests.conftest import Api, execute


async def test_twelve_parallel_creates_with_one_key_give_one_pool(api: Api, db: Path) -> None:
    """P4: 12 parallel creates with one idempotency key give one pool and one pool.created."""
    site = await api.site()
    body = {
        "tenantId": "root",
        "siteId": site,
        "class": "metal-host",
        "gpuModel": "H100",
        "idempotencyKey": "same",
    }
    answers = await asyncio.gather(*(api.ok("compute/pools/create", body) for _ in range(12)))
    assert len({a["id"] for a in answers}) == 1
    assert execute(db, "SELECT count(*) FROM pools") == [(1,)]
    assert execute(db, "SELECT count(*) FROM events WHERE type = 'pool.created'") == [(1,)]


async def test_fifty_parallel_offers_and_quota_updates_stay_consistent(api: Api, db: Path) -> None:
    """O2, E1: 50 parallel offers and quota updates leave consistent rows and one event per change."""
    tenants = [await api.tenant(f"t{i}") for i in range(10)]
    site = await api.site()
    pool = (await api.pool(site))["id"]

    async def offer(i: int) -> None:
        await api.offer(pool, tenants[i % 10], {"gpu": i + 1})

    async def set_owner_quota(i: int) -> None:
        await api.ok(
            "compute/quotas/set",
            {"tenantId": "root", "poolId": pool, "forTenantId": "root", "quota": {"gpu": 1000 + i}},
        )

    await asyncio.gather(*(offer(i) if i % 2 else set_owner_quota(i) for i in range(50)))
    events = execute(
        db, "SELECT seq, type, data FROM events WHERE pool_id = ? ORDER BY seq", (pool,)
    )
    types = Counter(t for _, t, _ in events)
    assert types == {"pool.created": 1, "pool.offered": 25, "quota.updated": 25}
    seqs = [s for s, _, _ in execute(db, "SELECT seq, type, data FROM events ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))
    # Each tenant's row equals its last offer in event order: rows and events agree.
    last: dict[str, int] = {}
    owner_last = None
    for _, kind, data in events:
        payload = json.loads(data)
        if kind == "pool.offered":
            last[payload["toTenantId"]] = payload["quota"]["gpu"]
        elif kind == "quota.updated":
            owner_last = payload["quota"]["gpu"]
    rows = dict(
        execute(
            db, "SELECT tenant_id, max FROM quotas WHERE pool_id = ? AND resource = 'gpu'", (pool,)
        )
    )
    assert rows == {**last, "root": owner_last}
    offered = {t for (t,) in execute(db, "SELECT to_tenant_id FROM pool_offers")}
    authz = {t for (t,) in execute(db, "SELECT tenant_id FROM pool_authz WHERE owned = 0")}
    assert offered == authz == set(last)


async def test_b5_a_write_ended_by_a_deadlock_runs_again_alone(postgres_url: str) -> None:
    """B5 on PostgreSQL: two writes run beside each other (each of its own node) that take two
    rows in opposite orders deadlock; PostgreSQL ends one, which runs again, alone, and
    commits: each write's rows and event land once, and the seq stays gapless."""
    stores = [Store(postgres_url), Store(postgres_url)]  # two replicas, migrated
    for tenant in ("x", "y"):
        execute(
            postgres_url,
            "INSERT INTO tenants (id, name, created_at) VALUES (?, ?, 'now')",
            [tenant, tenant],
        )
    both_hold_one = threading.Barrier(2)
    runs: Counter[str] = Counter()

    def crossing(name: str, first: str, then: str) -> Callable[[Database], None]:
        def txn(db: Database) -> None:
            runs[name] += 1
            db.execute("UPDATE tenants SET name = name WHERE id = ?", [first])
            if runs[name] == 1:
                both_hold_one.wait(10)
            db.execute("UPDATE tenants SET name = name || ? WHERE id = ?", [f"+{name}", then])
            events.append(db, "tenant.updated", pool_id=None, data={"by": name}, audience=[])

        return txn

    try:
        await asyncio.gather(
            stores[0].write(crossing("a", "x", "y"), own_rows="node-a"),
            stores[1].write(crossing("b", "y", "x"), own_rows="node-b"),
        )
    finally:
        for store in stores:
            store.close()
    assert sorted(runs.values()) == [1, 2]  # one of them was ended and ran again
    assert execute(postgres_url, "SELECT id, name FROM tenants ORDER BY id") == [
        ("x", "x+b"),
        ("y", "y+a"),
    ]
    assert execute(postgres_url, "SELECT seq FROM events ORDER BY seq") == [(1,), (2,)]
