"""C3, C4, C5: offers that end, reservations that end, and offered capacity that is covered
or not. The passing of time is stood in for by moving an end into the past in the database;
the reconciler's pass of ends (controlplane.reconciler.end_terms) then runs as the leader
runs it, in a transaction of its own."""

import time
from pathlib import Path
from typing import Any

import aiohttp

from controlplane.reconciler import Ended, end_terms
from controlplane.storage.db import Store, timestamp
from tests.conftest import Api, execute, snapshot
from tests.daemons import Daemon, call, root_pool
from tests.nodes import host_confirms, joined, one_pass, pool_with_token, recorded

PAST = "2000-01-01T00:00:00.000Z"


def ends_pass(db: Path) -> Ended:
    store = Store(db)
    try:
        return store.transact(end_terms)
    finally:
        store.close()


def ahead(seconds: float) -> str:
    return timestamp(time.time() + seconds)


async def offered_pool(api: Api) -> tuple[str, dict[str, Any]]:
    """An exclusive pool with the recorded DGX H100 ready in it, and a tenant acme."""
    await api.tenant("acme")
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    return pool, node


async def test_c3_an_offer_ends_and_is_withdrawn_as_an_unoffer(api: Api, db: Path) -> None:
    """C3, O6: notAfter is checked (future, ≤ 10 years), shown to the owner and as
    offerEndsAt to the tenant, kept when offered again without it and cleared by null. Once
    it passes, the pass withdraws the offer as pools/unoffer does: quotas drop to what is in
    use, the tenant no longer sees the pool, its pending reservation fails PoolGone, its
    placed one runs on, and pool.unoffered says reason expired."""
    pool, _ = await offered_pool(api)
    acme = await api.token_for("acme")
    before = snapshot(db)
    for bad in ("2001-01-01T00:00:00Z", ahead(11 * 366 * 86400), "2030-01-01T00:00:00"):
        body = {"tenantId": "root", "poolId": pool, "toTenantId": "acme", "quota": {"gpu": 16}}
        await api.err("compute/pools/offer", {**body, "notAfter": bad}, "INVALID_INPUT", "notAfter")
    assert snapshot(db) == before  # a refused offer changes nothing
    end = ahead(3600)
    await api.offer(pool, "acme", {"gpu": 16}, notAfter=end)
    await api.offer(pool, "acme", {"gpu": 16})  # without notAfter: the end is kept
    owner = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool})
    assert [o["notAfter"] for o in owner["offers"]] == [end]
    assert "offerEndsAt" not in owner
    seen = await api.ok("compute/pools/get", {"tenantId": "acme", "poolId": pool}, acme)
    assert seen["offerEndsAt"] == end
    listed = await api.ok("compute/pools/list", {"tenantId": "acme"}, acme)
    assert [p["offerEndsAt"] for p in listed["items"]] == [end]
    cleared = await api.offer(pool, "acme", {"gpu": 16}, notAfter=None)
    assert cleared["offerEndsAt"] is None
    await api.offer(pool, "acme", {"gpu": 16}, notAfter=end)

    create = {"tenantId": "acme", "poolId": pool}
    live = await api.ok("compute/reservations/create", {**create, "resources": {"gpu": 2}}, acme)
    assert live["state"] == "placed"
    waiting = await api.ok("compute/reservations/create", {**create, "resources": {"gpu": 7}}, acme)
    assert waiting["state"] == "pending"
    assert ends_pass(db) == Ended()  # not yet
    execute(db, "UPDATE pool_offers SET not_after = ?", (PAST,))
    assert ends_pass(db).offers == 1
    assert ends_pass(db).offers == 0  # withdrawn once
    await api.err(
        "compute/pools/get", {"tenantId": "acme", "poolId": pool}, "NOT_FOUND", None, acme
    )
    [event] = execute(db, "SELECT data FROM events WHERE type = 'pool.unoffered'")
    assert '"reason":"expired"' in event[0] and '"toTenantId":"acme"' in event[0]
    # quotas drop to what placed and active hold (R6)
    assert execute(db, "SELECT resource, max FROM quotas WHERE tenant_id = 'acme'") == [("gpu", 2)]
    one_pass(db)
    states = dict(execute(db, "SELECT id, state || ':' || coalesce(reason, '') FROM reservations"))
    assert states == {live["id"]: "placed:", waiting["id"]: "failed:PoolGone"}


async def test_c4_a_duration_ends_a_delivered_reservation(api: Api, db: Path) -> None:
    """C4, D7: durationSeconds (60 … 7,776,000) gives endsAt; one past the offer's notAfter
    is INVALID_INPUT on durationSeconds naming the offer's end; at endsAt the pass ends the
    reservation TimeUp: its quota back at once, its GPUs releasing until the host confirms."""
    pool, node = await offered_pool(api)
    acme = await api.token_for("acme")
    end = ahead(3600)
    await api.offer(pool, "acme", {"gpu": 8}, notAfter=end)
    create = {"tenantId": "acme", "poolId": pool, "resources": {"gpu": 2}}
    before = snapshot(db)
    for bad in (59, 7_776_001):
        await api.err(
            "compute/reservations/create",
            {**create, "durationSeconds": bad},
            "INVALID_INPUT",
            "durationSeconds",
            acme,
        )
    error = await api.err(
        "compute/reservations/create",
        {**create, "durationSeconds": 7200},
        "INVALID_INPUT",
        "durationSeconds",
        acme,
    )
    assert end in error["message"]
    assert snapshot(db) == before
    timed = await api.ok("compute/reservations/create", {**create, "durationSeconds": 600}, acme)
    assert timed["state"] == "placed" and timed["endsAt"] > timed["createdAt"]
    untimed = await api.ok("compute/reservations/create", create, acme)
    assert untimed["endsAt"] is None
    await host_confirms(api, node, recorded("dgx-h100-01"))
    got = {"tenantId": "acme", "reservationId": timed["id"]}
    assert (await api.ok("compute/reservations/get", got, acme))["state"] == "active"

    execute(db, "UPDATE reservations SET ends_at = ? WHERE id = ?", (PAST, timed["id"]))
    assert ends_pass(db).reservations == 1
    ended = await api.ok("compute/reservations/get", got, acme)
    assert (ended["state"], ended["reason"]) == ("ended", "TimeUp")
    assert ended["delivery"]["state"] == "releasing"
    assert execute(db, "SELECT used FROM quotas WHERE tenant_id = 'acme'") == [(2,)]  # untimed
    held = "SELECT count(*) FROM node_devices WHERE reservation_id = ?"
    assert execute(db, held, (timed["id"],)) == [(2,)]  # D7: until the host confirms
    await host_confirms(api, node, recorded("dgx-h100-01"))
    assert execute(db, held, (timed["id"],)) == [(0,)]
    assert (await api.ok("compute/reservations/get", got, acme))["delivery"]["state"] == "released"
    untouched = {"tenantId": "acme", "reservationId": untimed["id"]}
    assert (await api.ok("compute/reservations/get", untouched, acme))["state"] == "active"


async def test_c5_offering_over_capacity_warns_and_the_ledger_shows_coverage(api: Api) -> None:
    """C5: pools/offer and quotas/set warn when the maxima offered on a resource exceed its
    schedulable capacity (and still do it); the owner's ledger rows carry coverage =
    schedulable ÷ offered (null when nothing is offered), the tenant's do not."""
    pool, _ = await offered_pool(api)
    acme = await api.token_for("acme")
    await api.tenant("globex")
    offered = await api.offer(pool, "acme", {"gpu": 6})
    assert "warnings" not in offered
    oversold = await api.offer(pool, "globex", {"gpu": 34})
    assert oversold["warnings"] == ["quota gpu: 40 offered over 8 schedulable"]
    assert {q["resource"]: q["max"] for q in oversold["quotas"]} == {"gpu": 34}  # still done
    body = {"tenantId": "root", "poolId": pool, "forTenantId": "globex"}
    fewer = await api.ok("compute/quotas/set", {**body, "quota": {"gpu": 2}})
    assert "warnings" not in fewer
    more = await api.ok("compute/quotas/set", {**body, "quota": {"gpu": 10}})
    assert more["warnings"] == ["quota gpu: 16 offered over 8 schedulable"]
    ledger = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool})
    coverage = {row["resource"]: row["coverage"] for row in ledger["items"]}
    assert coverage["gpu"] == 0.5 and coverage["vcpu"] is None
    theirs = await api.ok("compute/pools/capacity", {"tenantId": "acme", "poolId": pool}, acme)
    assert all("coverage" not in row and "offered" not in row for row in theirs["items"])


async def test_c3_the_running_daemon_withdraws_an_offer_when_it_ends(tmp_path: Path) -> None:
    """C3, F2: the real daemon's reconciler (its leader's loop) withdraws an offer whose
    notAfter passed, in a pass of its own: pool.unoffered with reason expired reaches the
    owner's event log, and the tenant's quota is gone."""
    daemon = Daemon(tmp_path, "--reconcile-interval", "0.2")
    daemon.start()
    try:
        async with aiohttp.ClientSession() as session:
            pool = await root_pool(session, daemon, gpuModel="H100")
            await call(
                session, daemon.url, "iam/tenants/create", daemon.token, {"tenantId": "acme"}
            )
            offer = {
                "tenantId": "root",
                "poolId": pool["id"],
                "toTenantId": "acme",
                "quota": {"gpu": 4},
                "notAfter": ahead(1),
            }
            await call(session, daemon.url, "compute/pools/offer", daemon.token, offer)
            listed = {"tenantId": "root", "types": ["pool.unoffered"], "waitSeconds": 10}
            for _ in range(6):  # bounded: the pass after the end withdraws it
                found = await call(session, daemon.url, "compute/events/list", daemon.token, listed)
                if found["items"]:
                    break
            [event] = found["items"]
            assert event["data"] == {"toTenantId": "acme", "reason": "expired"}
            got = {"tenantId": "root", "poolId": pool["id"]}
            seen = await call(session, daemon.url, "compute/pools/get", daemon.token, got)
            assert seen["offers"] == []
    finally:
        daemon.stop()
