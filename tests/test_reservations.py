"""Reservations through the API: admission, the placer, and the rules that now take effect."""

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import msgspec
import pytest

from controlplane.capacity.liveness import Liveness
from controlplane.reconciler import reconcile_pass
from controlplane.storage.db import Store
from tests.conftest import Api, execute, snapshot
from tests.nodes import (
    DGX_POLICY,
    host_confirms,
    join,
    joined,
    one_pass,
    pool_with_token,
    recorded,
    twin,
)


def invariants(db: Path) -> None:
    """Never more than a row's capacity, never an atom twice, bookings (live or releasing, D7)
    add up to what is allocated."""
    assert execute(db, "SELECT count(*) FROM node_resources WHERE allocated > capacity") == [(0,)]
    rows = dict(
        ((n, r), a)
        for n, r, a in execute(db, "SELECT node_id, resource, allocated FROM node_resources")
    )
    booked: Counter[tuple[str, str]] = Counter()
    for node, resource, amount in execute(
        db,
        "SELECT b.node_id, b.resource, b.amount FROM bookings b JOIN reservations r ON r.id = b.reservation_id "
        "WHERE r.state IN ('placed', 'active') OR b.releasing = 1",
    ):
        booked[(node, resource)] += amount
    for key, allocated in rows.items():
        assert booked.get(key, 0) == allocated, (key, allocated, booked.get(key))
    atoms = execute(
        db,
        "SELECT reservation_id, count(*) FROM node_devices WHERE allocated = 1 GROUP BY reservation_id",
    )
    placed_atoms = dict(
        execute(
            db,
            "SELECT b.reservation_id, b.amount FROM bookings b JOIN reservations r ON r.id = b.reservation_id "
            "WHERE (r.state IN ('placed', 'active') OR b.releasing = 1) AND b.resource LIKE 'gpu%'",
        )
    )
    assert dict(atoms) == placed_atoms
    assert execute(
        db, "SELECT count(*) FROM node_devices WHERE allocated = 0 AND reservation_id IS NOT NULL"
    ) == [(0,)]


async def reserve(
    api: Api,
    pool: str,
    resources: dict[str, int],
    tenant: str = "root",
    token: str | None = None,
    **extra: Any,
) -> Any:
    return await api.ok(
        "compute/reservations/create",
        {"tenantId": tenant, "poolId": pool, "resources": resources, **extra},
        token,
    )


async def test_a_reservation_is_admitted_placed_and_ended(api: Api, db: Path) -> None:
    """Admission counts quota at once, the placer books atoms and rows; end gives the quota
    back at once and the bookings once the host confirms the release (D7)."""
    pool, token = await pool_with_token(api, policy=DGX_POLICY, ownerQuota={"gpu": 8, "vcpu": 500})
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    placed = await reserve(api, pool, {"gpu": 2, "vcpu": 16})
    assert placed["state"] == "placed" and placed["nodeId"]
    capacity = {
        r["resource"]: (r["total"], r["allocated"])
        for r in (await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool}))[
            "items"
        ]
    }
    assert capacity["gpu"] == (8, 2) and capacity["vcpu"] == (432, 16)
    quotas = {
        q["resource"]: (q["used"], q["available"])
        for q in (await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool}))["quotas"]
    }
    assert quotas == {"gpu": (2, 6), "vcpu": (16, 484)}
    invariants(db)
    ended = await api.ok(
        "compute/reservations/end", {"tenantId": "root", "reservationId": placed["id"]}
    )
    assert ended["state"] == "ended" and ended["delivery"]["state"] == "releasing"
    quotas = {
        q["resource"]: q["used"]
        for q in (await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool}))["quotas"]
    }
    assert quotas == {"gpu": 0, "vcpu": 0}

    async def ledger() -> dict[str, tuple[int, int]]:
        answer = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool})
        return {r["resource"]: (r["allocated"], r["releasing"]) for r in answer["items"]}

    assert (await ledger())["gpu"] == (2, 2) and (await ledger())["vcpu"] == (16, 16)
    await host_confirms(api, node, inventory)
    assert (await ledger())["gpu"] == (0, 0) and (await ledger())["vcpu"] == (0, 0)
    assert (
        await api.ok(
            "compute/reservations/end", {"tenantId": "root", "reservationId": placed["id"]}
        )
    )["state"] == "ended"
    invariants(db)
    types = [
        e["type"]
        for e in (
            await api.ok(
                "compute/events/list",
                {
                    "tenantId": "root",
                    "types": ["reservation.created", "reservation.placed", "reservation.ended"],
                },
            )
        )["items"]
    ]
    assert types == ["reservation.created", "reservation.placed", "reservation.ended"]


async def test_quota_exceeded_and_a_missing_row_grants_zero(api: Api, db: Path) -> None:
    """Admission: used + asked ≤ max for every resource asked; a resource without a row grants 0 (P3)."""
    await api.tenant("acme")
    pool, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    await api.offer(pool, "acme", {"gpu": 2})
    acme = await api.token_for("acme")
    over = await reserve(api, pool, {"gpu": 3}, "acme", acme)
    assert (over["state"], over["reason"]) == ("failed", "QuotaExceeded")
    no_row = await reserve(api, pool, {"gpu": 1, "vcpu": 4}, "acme", acme)
    assert (no_row["state"], no_row["reason"]) == ("failed", "QuotaExceeded")
    assert execute(db, "SELECT used FROM quotas WHERE tenant_id = 'acme'") == [(0,)]
    assert execute(db, "SELECT count(*) FROM node_devices WHERE allocated = 1") == [(0,)]


async def test_s1_requests_must_match_the_pools_sharing(api: Api, db: Path) -> None:
    """S1: gpu in exclusive pools, gpu.mig with a migProfile in mig pools, gpu.slot in timeslice/mps pools."""
    pool, _ = await pool_with_token(api)
    mig, _ = await pool_with_token(api, gpuModel="A100", sharing="mig", ownerQuota={"gpu.mig": 7})
    refused = [  # (pool, request fields, details.field)
        (pool, {"resources": {"gpu.slot": 1}}, "resources.gpu.slot"),
        (pool, {"resources": {"diskGiB": 1}}, "resources.diskGiB"),
        (pool, {"resources": {}}, "resources"),
        (mig, {"resources": {"gpu.mig": 1}}, "migProfile"),
        (mig, {"resources": {"gpu.mig": 1}, "migProfile": "1g.18gb"}, "migProfile"),
        (pool, {"resources": {"gpu": 0}}, "resources.gpu"),
    ]
    before = snapshot(db)
    for pool_id, fields, field in refused:
        body = {"tenantId": "root", "poolId": pool_id, **fields}
        await api.err("compute/reservations/create", body, "INVALID_INPUT", field)
    assert snapshot(db) == before


async def test_mig_reservations_book_instances_of_their_profile(api: Api, db: Path) -> None:
    """S1: gpu.mig books MIG instances of the asked profile."""
    pool, token = await pool_with_token(
        api, gpuModel="A100", sharing="mig", ownerQuota={"gpu.mig": 20}
    )
    await joined(api, token, recorded("dgx-a100-02"))
    placed = await reserve(api, pool, {"gpu.mig": 2}, migProfile="1g.10gb")
    assert placed["state"] == "placed"
    booked = execute(
        db, "SELECT profile FROM node_devices WHERE reservation_id = ?", (placed["id"],)
    )
    assert booked == [("1g.10gb",), ("1g.10gb",)]
    invariants(db)


async def test_pending_until_capacity_then_placed_by_the_placer(api: Api, db: Path) -> None:
    """A reservation that fits nowhere waits; the placer books it once a node with room joins."""
    pool, token = await pool_with_token(api)
    waiting = await reserve(api, pool, {"gpu": 4})
    assert waiting["state"] == "pending"
    await joined(api, token, recorded("dgx-h100-01"))
    one_pass(db)
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": waiting["id"]}
    )
    assert got["state"] == "placed"
    invariants(db)


async def test_o6_a1_pending_reservations_fail_with_pool_gone(api: Api, db: Path) -> None:
    """O6, A1: after an unoffer or an archive, pending reservations fail with PoolGone at their next retry;
    new ones on an archived pool are NOT_FOUND; placed ones run on."""
    await api.tenant("acme")
    pool, token = await pool_with_token(api)
    await api.offer(pool, "acme", {"gpu": 16})
    acme = await api.token_for("acme")
    waiting = await reserve(api, pool, {"gpu": 4}, "acme", acme)
    assert waiting["state"] == "pending"
    await api.ok(
        "compute/pools/unoffer", {"tenantId": "root", "poolId": pool, "toTenantId": "acme"}
    )
    one_pass(db)
    gone = await api.ok(
        "compute/reservations/get", {"tenantId": "acme", "reservationId": waiting["id"]}, acme
    )
    assert (gone["state"], gone["reason"]) == ("failed", "PoolGone")
    # R6: in use is placed and active only: the pending 4 held nothing the owner re-grants.
    assert execute(db, "SELECT used, max FROM quotas WHERE tenant_id = 'acme'") == [(0, 0)]
    await joined(api, token, recorded("dgx-h100-01"))
    running = await reserve(api, pool, {"gpu": 2})
    root_waiting = await reserve(api, pool, {"gpu": 8})
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    one_pass(db)
    assert (
        await api.ok(
            "compute/reservations/get", {"tenantId": "root", "reservationId": root_waiting["id"]}
        )
    )["reason"] == "PoolGone"
    assert (
        await api.ok(
            "compute/reservations/get", {"tenantId": "root", "reservationId": running["id"]}
        )
    )["state"] == "placed"
    await api.err(
        "compute/reservations/create",
        {"tenantId": "root", "poolId": pool, "resources": {"gpu": 1}},
        "NOT_FOUND",
        "poolId",
    )
    invariants(db)


async def test_pending_reservations_expire_after_max_pending(api: Api, db: Path) -> None:
    """maxPending: a reservation not placed in time fails with Expired."""
    pool, _ = await pool_with_token(api, policy={"maxPending": "30m"})
    waiting = await reserve(api, pool, {"gpu": 1})
    assert waiting["expiresAt"]
    execute(db, "UPDATE reservations SET expires_at = '2000-01-01T00:00:00.000Z'")
    one_pass(db)
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": waiting["id"]}
    )
    assert (got["state"], got["reason"]) == ("failed", "Expired")
    assert execute(db, "SELECT used FROM quotas WHERE resource = 'gpu'") == [(0,)]


async def test_t1_deleting_a_tenant_ends_its_reservations_and_others_run_on(
    api: Api, db: Path
) -> None:
    """T1: the deleted tenant's reservations end; another tenant's booking in its archived pool runs on."""
    await api.tenant("acme")
    await api.tenant("beta")
    acme = await api.token_for("acme")
    beta = await api.token_for("beta")
    site = await api.site("acme", kind="custom", token=acme)
    acme_pool = (await api.pool(site, tenant_id="acme", token=acme))["id"]
    # beta rents acme's capacity (offered before acme's own hosts joined: O4); acme rents root's.
    await api.ok(
        "compute/pools/offer",
        {"tenantId": "acme", "poolId": acme_pool, "toTenantId": "beta", "quota": {"gpu": 4}},
        acme,
    )
    join = await api.ok(
        "compute/joinTokens/create", {"tenantId": "acme", "poolId": acme_pool}, acme
    )
    await joined(api, join["token"], recorded("dgx-h100-01"))
    betas = await reserve(api, acme_pool, {"gpu": 2}, "beta", beta)
    root_pool, _ = await pool_with_token(api)
    await api.offer(root_pool, "acme", {"gpu": 4})
    acmes = await reserve(api, root_pool, {"gpu": 1}, "acme", acme)
    await api.ok("iam/tenants/delete", {"tenantId": "acme"})
    states = dict(execute(db, "SELECT id, state FROM reservations"))
    assert states[acmes["id"]] == "ended" and states[betas["id"]] == "placed"
    invariants(db)


async def test_n5_rows_never_shrink_below_real_allocations(api: Api, db: Path) -> None:
    """N5: a policy that shrinks vcpu below what reservations hold keeps the row at the allocation."""
    pool, token = await pool_with_token(api, policy=DGX_POLICY, ownerQuota={"vcpu": 1000})
    await joined(api, token, recorded("dgx-h100-01"))
    await reserve(api, pool, {"vcpu": 400})
    await api.ok(
        "compute/pools/update",
        {"tenantId": "root", "poolId": pool, "policy": {**DGX_POLICY, "overcommit": {"vcpu": 1}}},
    )
    one_pass(db)
    assert execute(
        db, "SELECT capacity, allocated FROM node_resources WHERE resource = 'vcpu'"
    ) == [(400, 400)]
    invariants(db)


async def test_budgets_meter_gpu_hours_and_refuse_when_spent(api: Api, db: Path) -> None:
    """admission.budgetCheck meter: root sets a budget on gpu.h100.hours; a spent budget refuses admission."""
    await api.tenant("acme")
    pool, token = await pool_with_token(api, policy={"admission": {"budgetCheck": "meter"}})
    await joined(api, token, recorded("dgx-h100-01"))
    await api.offer(pool, "acme", {"gpu": 4})
    acme = await api.token_for("acme")
    await api.err(
        "compute/budgets/set",
        {"tenantId": "acme", "meter": "gpu.h100.hours", "limit": 10},
        "PERMISSION_DENIED",
        token=acme,
    )
    budget = await api.ok(
        "compute/budgets/set", {"tenantId": "acme", "meter": "gpu.h100.hours", "limit": 1.0}
    )
    assert budget == {"tenantId": "acme", "meter": "gpu.h100.hours", "limit": 1.0, "spent": 0.0}
    first = await reserve(api, pool, {"gpu": 2}, "acme", acme)
    assert first["state"] == "placed"
    # Two GPUs booked an hour ago: 2 GPU-hours spent, over the 1 h budget.
    execute(
        db,
        "UPDATE reservations SET placed_at = '2000-01-01T00:00:00.000Z' WHERE id = ?",
        (first["id"],),
    )
    spent = await api.ok(
        "compute/budgets/get", {"tenantId": "acme", "meter": "gpu.h100.hours"}, acme
    )
    assert spent["spent"] > 1.0
    refused = await reserve(api, pool, {"gpu": 1}, "acme", acme)
    assert (refused["state"], refused["reason"]) == ("failed", "BudgetExhausted")


async def test_two_hundred_concurrent_creates_against_a_quota_of_32_admit_32(
    api: Api, db: Path
) -> None:
    """Concurrency: 200 parallel creates against a quota of 32 admit exactly 32; nothing over-books."""
    pool, token = await pool_with_token(api, ownerQuota={"gpu": 32})
    await joined(api, token, recorded("dgx-h100-01"))
    answers = await asyncio.gather(*(reserve(api, pool, {"gpu": 1}) for _ in range(200)))
    states = Counter(a["state"] for a in answers)
    assert states["placed"] == 8 and states["pending"] == 24 and states["failed"] == 168
    assert execute(db, "SELECT used FROM quotas WHERE resource = 'gpu'") == [(32,)]
    invariants(db)


async def test_d6_placed_becomes_active_once_its_host_delivers_it(api: Api, db: Path) -> None:
    """pending → placed → active: a node that merely reports again does not make a booking
    active; its agent reporting the booking delivered does (D6)."""
    pool, token = await pool_with_token(api)
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    placed = await reserve(api, pool, {"gpu": 1})
    liveness = Liveness()
    liveness.seen(node["nodeId"])
    store = Store(db)
    try:
        store.transact(lambda d: reconcile_pass(d, liveness, 3600, True))
    finally:
        store.close()
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": placed["id"]}
    )
    assert got["state"] == "placed" and got["delivery"]["state"] == "pending"
    await host_confirms(api, node, inventory)
    active = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": placed["id"]}
    )
    assert active["state"] == "active" and active["delivery"]["state"] == "delivered"
    ended = await api.ok(
        "compute/reservations/end", {"tenantId": "root", "reservationId": placed["id"]}
    )
    assert ended["state"] == "ended"
    invariants(db)


async def test_archive_with_reservations_in_every_state(api: Api, db: Path) -> None:
    """A1: archiving fails pending ones with PoolGone at the next retry; placed and active run on;
    ended and failed stay as they were."""
    pool, token = await pool_with_token(api, ownerQuota={"gpu": 12})
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    ended = await reserve(api, pool, {"gpu": 1})
    await api.ok("compute/reservations/end", {"tenantId": "root", "reservationId": ended["id"]})
    active = await reserve(api, pool, {"gpu": 1})
    await host_confirms(api, node, inventory)
    placed = await reserve(api, pool, {"gpu": 6})
    pending = await reserve(api, pool, {"gpu": 4})
    failed = await reserve(api, pool, {"gpu": 100})
    states = dict(execute(db, "SELECT id, state FROM reservations"))
    assert [states[r["id"]] for r in (ended, active, placed, pending, failed)] == [
        "ended",
        "active",
        "placed",
        "pending",
        "failed",
    ]
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    one_pass(db)
    after = dict(execute(db, "SELECT id, state || ':' || coalesce(reason, '') FROM reservations"))
    assert (
        after[ended["id"]] == "ended:"
        and after[active["id"]] == "active:"
        and after[placed["id"]] == "placed:"
    )
    assert (
        after[pending["id"]] == "failed:PoolGone" and after[failed["id"]] == "failed:QuotaExceeded"
    )
    invariants(db)


async def test_a_lost_nodes_bookings_are_marked_not_freed(api: Api, db: Path) -> None:
    """A lost node's bookings stay booked and are marked NodeLost."""
    pool, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    placed = await reserve(api, pool, {"gpu": 2})
    execute(db, "UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z'")
    store = Store(db)
    try:
        store.transact(lambda d: reconcile_pass(d, Liveness(), 90, True))
    finally:
        store.close()
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": placed["id"]}
    )
    assert (got["state"], got["reason"]) == ("placed", "NodeLost")
    assert execute(db, "SELECT count(*) FROM node_devices WHERE allocated = 1") == [(2,)]


async def test_the_placer_looks_past_its_first_candidates(api: Api, db: Path) -> None:
    """First fit pages through the whole pool: a node far down the list is found when the first are full."""
    pool, token = await pool_with_token(api, max_uses=40, ownerQuota={"vcpu": 10_000})
    for n in range(36):
        await joined(api, token, twin("dgx-h100-01", n))
    last = execute(db, "SELECT id FROM nodes ORDER BY id DESC LIMIT 1")[0][0]
    execute(
        db,
        "UPDATE node_resources SET allocated = capacity WHERE resource = 'vcpu' AND node_id != ?",
        (last,),
    )
    placed = await reserve(api, pool, {"vcpu": 4})
    assert (placed["state"], placed["nodeId"]) == ("placed", last)


async def test_live_mig_bookings_count_against_the_budget(api: Api, db: Path) -> None:
    """Budgets: MIG instances booked now count their share of a GPU's hours while they run."""
    await api.tenant("acme")
    pool, token = await pool_with_token(
        api, gpuModel="A100", sharing="mig", policy={"admission": {"budgetCheck": "meter"}}
    )
    await joined(api, token, recorded("dgx-a100-02"))
    await api.offer(pool, "acme", {"gpu.mig": 4})
    acme = await api.token_for("acme")
    await api.ok(
        "compute/budgets/set", {"tenantId": "acme", "meter": "gpu.a100.hours", "limit": 1.0}
    )
    first = await reserve(api, pool, {"gpu.mig": 2}, "acme", acme, migProfile="1g.10gb")
    assert first["state"] == "placed"
    execute(
        db,
        "UPDATE reservations SET placed_at = '2000-01-01T00:00:00.000Z' WHERE id = ?",
        (first["id"],),
    )
    spent = await api.ok(
        "compute/budgets/get", {"tenantId": "acme", "meter": "gpu.a100.hours"}, acme
    )
    assert spent["spent"] > 1.0
    refused = await reserve(api, pool, {"gpu.mig": 1}, "acme", acme, migProfile="1g.10gb")
    assert refused["reason"] == "BudgetExhausted"


async def test_o6_an_offer_made_again_does_not_save_a_pending_reservation(
    api: Api, db: Path
) -> None:
    """O6: unoffered and offered again before the next retry, a pending reservation still fails with PoolGone."""
    await api.tenant("acme")
    pool, _ = await pool_with_token(api)
    await api.offer(pool, "acme", {"gpu": 16})
    acme = await api.token_for("acme")
    waiting = await reserve(api, pool, {"gpu": 4}, "acme", acme)
    await api.ok(
        "compute/pools/unoffer", {"tenantId": "root", "poolId": pool, "toTenantId": "acme"}
    )
    await api.offer(pool, "acme", {"gpu": 16})
    one_pass(db)
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "acme", "reservationId": waiting["id"]}, acme
    )
    assert (got["state"], got["reason"]) == ("failed", "PoolGone")
    assert execute(db, "SELECT used FROM quotas WHERE tenant_id = 'acme'") == [(0,)]


async def test_an_idempotent_retry_returns_the_reservation_even_after_an_archive(
    api: Api, db: Path
) -> None:
    """idempotencyKey: a retry returns what the first call made, whatever the pool has become."""
    pool, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    first = await reserve(api, pool, {"gpu": 1}, idempotencyKey="job-7")
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    again = await reserve(api, pool, {"gpu": 1}, idempotencyKey="job-7")
    assert again["id"] == first["id"] and again["state"] == "placed"
    await api.err(
        "compute/reservations/create",
        {"tenantId": "root", "poolId": pool, "resources": {"gpu": 2}, "idempotencyKey": "job-7"},
        "CONFLICT",
        "idempotencyKey",
    )


async def test_r5_a_reservation_the_placer_cannot_handle_does_not_stop_the_others(
    api: Api, db: Path
) -> None:
    """R5: a pending reservation whose stored row makes the placer raise is left pending and
    counted; the pending one after it is still placed in the same pass."""
    pool, token = await pool_with_token(api)
    broken = await reserve(api, pool, {"gpu": 1})
    waiting = await reserve(api, pool, {"gpu": 2})
    execute(db, "UPDATE reservations SET resources = 'not json' WHERE id = ?", (broken["id"],))
    await joined(api, token, recorded("dgx-h100-01"))
    store = Store(db)
    try:
        stats = store.transact(lambda d: reconcile_pass(d, Liveness(), 3600, True))
    finally:
        store.close()
    assert stats.failures == 1
    states = dict(execute(db, "SELECT id, state FROM reservations"))
    assert (states[broken["id"]], states[waiting["id"]]) == ("pending", "placed")


async def test_d6_a_booking_not_delivered_in_time_fails_and_gives_its_quota_back(
    api: Api, db: Path
) -> None:
    """D6: a placed booking its host has not delivered within placement.deliverWithinSeconds
    fails DeliveryFailed at the next pass; its quota comes back, its GPUs wait for the host
    to confirm the release (D7)."""
    policy = {"placement": {"deliverWithinSeconds": 30}}
    pool, token = await pool_with_token(api, policy=policy, ownerQuota={"gpu": 8})
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    placed = await reserve(api, pool, {"gpu": 1})
    one_pass(db)
    assert (
        await api.ok(
            "compute/reservations/get", {"tenantId": "root", "reservationId": placed["id"]}
        )
    )["state"] == "placed"
    execute(
        db,
        "UPDATE reservations SET delivery_at = '2000-01-01T00:00:00.000Z' WHERE id = ?",
        (placed["id"],),
    )
    one_pass(db)
    failed = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": placed["id"]}
    )
    assert (failed["state"], failed["reason"]) == (
        "failed",
        "DeliveryFailed: not delivered within 30s",
    )
    assert failed["delivery"]["state"] == "releasing"
    assert execute(db, "SELECT used FROM quotas WHERE resource = 'gpu'") == [(0,)]
    await host_confirms(api, node, inventory)
    assert execute(db, "SELECT count(*) FROM node_devices WHERE allocated = 1") == [(0,)]


@pytest.mark.parametrize(
    ("placement", "field"),
    [
        ({"topology": "tight"}, "policy.placement.topology"),
        ({"deliverWithinSeconds": 5}, "policy.placement.deliverWithinSeconds"),
        ({"topology": "strict", "spread": True}, "policy.placement"),
    ],
)
async def test_d2_the_placement_policy_is_validated(
    api: Api, placement: dict[str, Any], field: str
) -> None:
    """D2, D6: placement.topology is preferred, strict or none; deliverWithinSeconds ≥ 30;
    nothing else inside placement."""
    status, answer = await api.call(
        "compute/pools/create",
        {
            "tenantId": "root",
            "siteId": await api.site(),
            "class": "metal-host",
            "gpuModel": "H100",
            "policy": {"placement": placement},
        },
    )
    assert status == 400, answer
    assert answer["error"]["code"] == "INVALID_INPUT"
    assert answer["error"]["details"]["field"].startswith(field), answer


async def test_d5_a_booking_placed_before_the_placer_recorded_it_reaches_the_nodespec(
    api: Api, db: Path
) -> None:
    """D5, D7 across an upgrade: a booking with no recorded placement and a node whose bookings
    were never written (what migration 12 leaves of an older database) reaches the node's spec
    at the next pass, from the atoms it holds; ended, the host releases it and its GPUs
    return."""
    pool, token = await pool_with_token(api, ownerQuota={"gpu": 8})
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    placed = await reserve(api, pool, {"gpu": 2})
    execute(
        db,
        "UPDATE reservations SET placement = NULL, delivery_state = 'delivered', state = 'active'",
    )
    execute(db, "UPDATE nodes SET bookings = NULL, rows_pool_version = -1")
    one_pass(db)
    spec = await host_confirms(api, node, inventory)
    (booking,) = spec["bookings"]
    held = {u for (u,) in execute(db, "SELECT gpu_uuid FROM node_devices WHERE allocated = 1")}
    assert (booking["reservationId"], set(booking["gpus"])) == (placed["id"], held)
    await api.ok("compute/reservations/end", {"tenantId": "root", "reservationId": placed["id"]})
    await host_confirms(api, node, inventory)
    assert execute(db, "SELECT count(*) FROM node_devices WHERE allocated = 1") == [(0,)]


async def test_d2_strict_places_no_set_on_a_host_without_topology_facts(api: Api, db: Path) -> None:
    """D2 strict: a host that gave no topology facts (an older agent) cannot show a set is
    NVLink-joined or on one NUMA node: nothing of two GPUs or more is placed there."""
    pool, token = await pool_with_token(
        api, policy={"placement": {"topology": "strict"}}, ownerQuota={"gpu": 8}
    )
    await joined(api, token, recorded("dgx-h100-01"))
    execute(db, "UPDATE nodes SET topology = NULL")
    two = await reserve(api, pool, {"gpu": 2})
    assert (two["state"], two["reason"]) == ("pending", "no node fits its topology")
    assert (await reserve(api, pool, {"gpu": 1}))["state"] == "placed"


async def test_d1_a_cpulist_that_is_not_one_is_refused_and_a_backwards_one_harms_nothing(
    api: Api, db: Path
) -> None:
    """D1: an inventory whose cpulist is not one (or names CPUs no host has) is INVALID_INPUT
    naming the field; one written backwards ("5-3") is stored, and the placer reads that
    host as one that gave no topology facts instead of failing every request."""
    pool, token = await pool_with_token(api, ownerQuota={"gpu": 8})
    dgx = recorded("dgx-h100-01")
    for bad in ("0-99999", "1,,2", "a"):
        cpu = msgspec.structs.replace(dgx.cpu, thread_siblings=[bad])
        status, answer = await join(api, token, msgspec.structs.replace(dgx, cpu=cpu))
        assert status == 400 and answer["error"]["details"]["field"].startswith(
            "inventory.cpu.threadSiblings"
        ), answer
    backwards = msgspec.structs.replace(
        dgx.cpu, thread_siblings=["5-3", *dgx.cpu.thread_siblings[1:]]
    )
    await joined(api, token, msgspec.structs.replace(dgx, cpu=backwards))
    assert (await reserve(api, pool, {"gpu": 2}))["state"] == "placed"


async def test_h3_d7_a_drain_at_a_deadline_of_0_answers_draining_while_ended_bookings_release(
    api: Api, db: Path
) -> None:
    """H3, D7: draining with deadline 0 ends what is live at once; the answer says draining
    (as stored) until the host releases what ended, then the drain is drained."""
    pool, token = await pool_with_token(api, ownerQuota={"gpu": 8})
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    await reserve(api, pool, {"gpu": 2})
    at = {"tenantId": "root", "nodeId": node["nodeId"]}
    view = await api.ok("compute/nodes/drain", {**at, "reason": "now", "deadlineSeconds": 0})
    assert view["drain"]["state"] == "draining"
    assert execute(db, "SELECT drain_state FROM nodes") == [("draining",)]
    await host_confirms(api, node, inventory)
    one_pass(db)
    assert (await api.ok("compute/nodes/get", at))["drain"]["state"] == "drained"
