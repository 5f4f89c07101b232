"""The host's word on its bookings (D5-D7): delivered, failed, released, release-blocked.

A report's ``bookings`` move the node's reservations: ``delivered`` makes a placed one
active (D6); ``failed`` ends it ``DeliveryFailed`` with the agent's reason; ``released``
frees what an ended one held (D7); ``release-blocked`` keeps it held and says why, on the
reservation, on the node (``stateReason``) and in ``node.releaseBlocked``. The agent's
word counts only for reservations booked on its own node (D8). A placed reservation its
host has not delivered within ``placement.deliverWithinSeconds`` fails the same way.
"""

from collections.abc import Sequence

import msgspec
from msgspec import UNSET

from controlplane.capacity import delivery
from controlplane.capacity.bookings import finish, release, reservation_event
from controlplane.capacity.states import node_event
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import epoch, now
from controlplane.storage.node_types import NodeRow
from controlplane.storage.sql import Database
from controlplane.storage.types import PoolRow, ReservationRow
from shared.schemas.nodes import BookingReport

DELIVER_WITHIN = 600  # seconds, when the pool's policy does not say (D6)
RELEASING = ("releasing", "release-blocked")


def take_report(
    db: Database, node: NodeRow, owner_tenant_id: str, reports: Sequence[BookingReport]
) -> bool:
    """Apply the agent's report of its bookings; True when a booking moved."""
    moved = False
    for report in reports:
        row = res_sql.get(db, report.reservation_id)
        if row is None or row.node_id != node.id:
            continue  # D8: not a booking of this node: the agent's word does not count
        moved = _take(db, node, owner_tenant_id, row, report) or moved
    if moved:
        delivery.refresh_bookings(db, node.id)
    return moved


def _take(
    db: Database, node: NodeRow, owner: str, row: ReservationRow, report: BookingReport
) -> bool:
    at = now()
    if report.state == "delivered":
        if row.state != "placed" or row.delivery_state != "pending":
            return False
        fields = {
            "state": "active",
            "updated_at": at,
            "delivery_state": "delivered",
            "delivery_reason": None,
            "delivery_at": at,
        }
        res_sql.update(db, row.id, fields)
        reservation_event(
            db, "active", msgspec.structs.replace(row, **fields), owner, nodeId=node.id
        )
        return True
    if report.state == "failed":
        if row.state not in ("placed", "active") or row.delivery_state not in ("pending", None):
            return False
        reason = report.reason or "the host did not say why"
        finish(
            db, row, "failed", f"DeliveryFailed: {reason}"[:500], "the host could not deliver it"
        )
        res_sql.update(db, row.id, {"delivery_reason": reason[:500]})
        return True
    if row.delivery_state not in RELEASING:
        return False
    if report.state == "released":
        release(db, row)
        res_sql.update(
            db,
            row.id,
            {"delivery_state": "released", "delivery_reason": None, "delivery_at": at},
        )
        return True
    # release-blocked
    reason = report.reason or "processes still run on its devices"
    if row.delivery_state == "release-blocked" and row.delivery_reason == reason:
        return False
    first = row.delivery_state != "release-blocked"
    res_sql.update(
        db,
        row.id,
        {"delivery_state": "release-blocked", "delivery_reason": reason[:500], "delivery_at": at},
    )
    if first:
        node_event(db, "releaseBlocked", node, owner, reservationId=row.id, reason=reason)
    return True


def deliver_within(pool: PoolRow) -> int:
    policy = pool.model
    if policy is None or policy.placement is UNSET:
        return DELIVER_WITHIN
    return policy.placement.deliverWithinSeconds


def fail_undelivered(db: Database, row: ReservationRow, at: float) -> bool:
    """D6: a placed reservation its host has not delivered in time fails; True if it did."""
    pool = pool_sql.get_pool(db, row.pool_id)
    if pool is None or row.delivery_at is None:
        return False
    limit = deliver_within(pool)
    if at - epoch(row.delivery_at) < limit:
        return False
    finish(
        db,
        row,
        "failed",
        f"DeliveryFailed: not delivered within {limit}s",
        "the host did not deliver it in time",
    )
    return True


def free_without_host(db: Database, node_id: str) -> None:
    """``nodes/remove --force`` (D7): what ended bookings still hold is freed without the host."""
    for row in res_sql.releasing_on_node(db, node_id):
        release(db, row)
        res_sql.update(
            db,
            row.id,
            {
                "delivery_state": "released",
                "delivery_reason": "the node was removed",
                "delivery_at": now(),
            },
        )
