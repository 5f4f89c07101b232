"""The ledger's rules above storage: a release never takes quota ``used`` or a row's booked
amount below zero, and the placer's tries are counted by what they came to."""

from pathlib import Path

import structlog

from controlplane.capacity.bookings import Placement
from controlplane.metrics import PLACEMENTS
from tests.conftest import Api, execute
from tests.nodes import DGX_POLICY, host_confirms, joined, one_pass, pool_with_token, recorded


def placements(result: Placement) -> float:
    """bc_placements_total for one result, as /metrics serves it."""
    return sum(
        sample.value
        for metric in PLACEMENTS.collect()
        for sample in metric.samples
        if sample.name == "bc_placements_total" and sample.labels == {"result": result.value}
    )


async def test_f6_a_release_past_zero_stores_zero_and_logs_the_bookkeeping_bug(
    api: Api, db: Path
) -> None:
    """F6: ending a reservation (and its host releasing it, D7) gives back at most what quota
    ``used`` and the row's booked amount hold: they stop at 0, and each shortfall is logged
    as a warning."""
    pool, token = await pool_with_token(api, policy=DGX_POLICY, ownerQuota={"gpu": 8, "vcpu": 500})
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    placed = await api.ok(
        "compute/reservations/create",
        {"tenantId": "root", "poolId": pool, "resources": {"gpu": 2, "vcpu": 16}},
    )
    assert placed["state"] == "placed"
    # A ledger that lost count, standing in for a bookkeeping bug.
    execute(db, "UPDATE quotas SET used = 4 WHERE resource = 'vcpu'")
    execute(db, "UPDATE node_resources SET allocated = 4 WHERE resource = 'vcpu'")
    with structlog.testing.capture_logs() as logs:
        ended = await api.ok(
            "compute/reservations/end", {"tenantId": "root", "reservationId": placed["id"]}
        )
        await host_confirms(api, node, inventory)
    assert ended["state"] == "ended"
    assert execute(db, "SELECT resource, used FROM quotas ORDER BY resource") == [
        ("gpu", 0),
        ("vcpu", 0),
    ]
    assert execute(db, "SELECT allocated FROM node_resources WHERE resource = 'vcpu'") == [(0,)]
    warned = sorted(
        (entry["event"], entry["released"]) for entry in logs if entry["log_level"] == "warning"
    )
    assert warned == [
        ("booked amount would go below zero", 16),
        ("quota used would go below zero", 16),
    ]


async def test_f6_a_release_within_the_ledger_logs_nothing(api: Api, db: Path) -> None:
    """F6: a release that the ledger holds gives back exactly what was booked, without a warning."""
    pool, token = await pool_with_token(api, policy=DGX_POLICY, ownerQuota={"gpu": 8, "vcpu": 500})
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    reserve = {"tenantId": "root", "poolId": pool}
    kept = await api.ok("compute/reservations/create", {**reserve, "resources": {"vcpu": 8}})
    placed = await api.ok("compute/reservations/create", {**reserve, "resources": {"vcpu": 16}})
    with structlog.testing.capture_logs() as logs:
        await api.ok(
            "compute/reservations/end", {"tenantId": "root", "reservationId": placed["id"]}
        )
        await host_confirms(api, node, inventory, **{kept["id"]: "delivered"})
    assert [entry for entry in logs if entry["log_level"] == "warning"] == []
    assert execute(db, "SELECT used FROM quotas WHERE resource = 'vcpu'") == [(8,)]
    assert execute(db, "SELECT allocated FROM node_resources WHERE resource = 'vcpu'") == [(8,)]
    assert kept["state"] == "placed"
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": kept["id"]}
    )
    assert got["state"] == "active"


async def test_m1_the_reconciler_counts_a_pending_reservation_that_fails(
    api: Api, db: Path
) -> None:
    """M1: the placer returns what a retry came to and the reconciler counts it: a pending
    reservation of an archived pool is one ``failed`` try (A1)."""
    pool, _ = await pool_with_token(api)
    waiting = await api.ok(
        "compute/reservations/create",
        {"tenantId": "root", "poolId": pool, "resources": {"gpu": 1}},
    )
    assert waiting["state"] == "pending"
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    failed, pending = placements(Placement.FAILED), placements(Placement.NOT_PLACED)
    one_pass(db)
    assert placements(Placement.FAILED) == failed + 1
    assert placements(Placement.NOT_PLACED) == pending
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": waiting["id"]}
    )
    assert (got["state"], got["reason"]) == ("failed", "PoolGone")
