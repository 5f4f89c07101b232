"""Bookings: writing what the placer chose (capacity/placer.py: atoms, pinned CPUs and rows in
the caller's transaction), quota ``used`` following live reservations, a live reservation's
end (quota and GPU hours given back at once, its bookings held until the host confirms the
release, D7) and the release itself, with the reservation events they write.

The placer returns what each try came to (``Placement``); the layer above counts it.
"""

import enum
import time
from typing import Any

import msgspec
import structlog

from controlplane.capacity import delivery, placer
from controlplane.capacity.meters import gpu_equivalents, meter_of
from controlplane.capacity.placer import ATOMS
from controlplane.storage import budgets as budget_sql
from controlplane.storage import events
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import quotas as quota_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import epoch, now
from controlplane.storage.ledger_types import BookingRow
from controlplane.storage.sql import Database
from controlplane.storage.types import PoolRow, ReservationRow

log = structlog.get_logger("controlplane.capacity")


class Placement(enum.StrEnum):
    """What one try of the placer came to, named as the placements metric labels it."""

    PLACED = "placed"
    NOT_PLACED = "pending"  # nothing fits yet: it waits for the next pass
    FAILED = "failed"  # PoolGone or Expired


def reservation_event(
    db: Database, kind: str, row: ReservationRow, owner: str, **data: Any
) -> None:
    events.append(
        db,
        f"reservation.{kind}",
        pool_id=row.pool_id,
        data={
            "reservationId": row.id,
            "tenantId": row.tenant_id,
            "state": row.state,
            **data,
        },
        audience=[row.tenant_id, owner],
    )


def at_least_zero(value: int, bug: str, **where: object) -> int:
    """``value``, or 0 with ``bug`` logged where it would go below: the ledger's counts never
    go negative, and one that would is a bookkeeping bug to see."""
    if value >= 0:
        return value
    log.warning(bug, **where)
    return 0


def count_used(db: Database, row: ReservationRow, sign: int, at: str) -> None:
    """Quota ``used`` follows live reservations: admission adds the reservation's resources
    (``sign`` 1), its end gives them back (-1); a row that does not exist stays absent.
    ``used`` never goes below 0: a give-back past it is a bookkeeping bug, logged."""
    for resource, amount in row.resources.items():
        quota = quota_sql.quota(db, row.pool_id, row.tenant_id, resource)
        if quota is None:
            continue
        used = at_least_zero(
            quota.used + sign * amount,
            "quota used would go below zero",
            reservation=row.id,
            pool=row.pool_id,
            tenant=row.tenant_id,
            resource=resource,
            used=quota.used,
            released=amount,
        )
        quota_sql.set_used(db, row.pool_id, row.tenant_id, resource, used, at)


def release(db: Database, row: ReservationRow) -> list[BookingRow]:
    """Give back everything the reservation booked (atoms, pinned CPUs and node_resources
    rows): its host confirmed the release (D7), or the node is gone. Returns its bookings.
    A row never goes below 0 booked: a release past it is a bookkeeping bug, logged."""
    booked = res_sql.bookings_of(db, row.id)
    res_sql.free_atoms(db, row.id)
    for booking in booked:
        allocated = res_sql.row_allocated(db, booking.node_id, booking.resource)
        if allocated is None:  # an atom booking: no node_resources row
            continue
        left = at_least_zero(
            allocated - booking.amount,
            "booked amount would go below zero",
            reservation=row.id,
            node=booking.node_id,
            resource=booking.resource,
            allocated=allocated,
            released=booking.amount,
        )
        res_sql.set_row_allocated(db, booking.node_id, booking.resource, left)
    res_sql.mark_releasing(db, row.id, False)
    nodes = {b.node_id for b in booked}
    node_sql.count_free_atoms(db, nodes)
    pool = pool_sql.get_pool(db, row.pool_id)
    if pool is not None and pool.sharing != "exclusive":
        # its GPUs may take their new layout or sharing now (U3, H4)
        node_sql.mark_stale(db, {b.node_id for b in booked if b.resource in ATOMS.values()})
    return booked


def finish(
    db: Database, row: ReservationRow, state: str, reason: str | None, message: str
) -> ReservationRow:
    """End or fail a live reservation: its quota comes back and its GPU hours are metered at
    once; what it booked on a node stays held, ``releasing``, until the host confirms the
    release (D7)."""
    at = now()
    pool = pool_sql.get_pool(db, row.pool_id)
    assert pool is not None
    booked = res_sql.bookings_of(db, row.id)
    if row.state in res_sql.LIVE:
        count_used(db, row, -1, at)
    meter = meter_of(pool.gpu_model)
    if row.placed_at and meter:
        share = sum(
            gpu_equivalents(b.resource, b.amount, row.mig_profile, pool.replicas) for b in booked
        )
        hours = share * max(0.0, time.time() - epoch(row.placed_at)) / 3600
        if hours:
            budget_sql.add_spent(db, row.tenant_id, meter, hours, at)
    fields: dict[str, Any] = {"state": state, "reason": reason, "updated_at": at, "ended_at": at}
    if booked:
        res_sql.mark_releasing(db, row.id, True)
        fields.update(delivery_state="releasing", delivery_reason=None, delivery_at=at)
    res_sql.update(db, row.id, fields)
    done = msgspec.structs.replace(row, **fields)
    if row.node_id is not None and booked:
        delivery.refresh_bookings(db, row.node_id)
    reservation_event(
        db,
        "ended" if state == "ended" else "failed",
        done,
        pool.owner_tenant_id,
        reason=reason,
        message=message,
    )
    return done


def place(db: Database, row: ReservationRow, pool: PoolRow) -> Placement:
    """Book the reservation where it fits best (D2, D3): atoms, pinned CPUs and rows on one
    ready host node. A reservation no node's topology fits under ``strict`` keeps waiting
    with that reason."""
    fit = placer.find(db, row, pool)
    if isinstance(fit, str):
        if row.reason != fit:
            res_sql.update(db, row.id, {"reason": fit, "updated_at": now()})
        return Placement.NOT_PLACED
    if fit is None:
        return Placement.NOT_PLACED
    _book(db, row, pool, fit)
    return Placement.PLACED


def _book(db: Database, row: ReservationRow, pool: PoolRow, fit: placer.Fit) -> None:
    """Write the booking ``fit`` describes, in the caller's transaction."""
    node_id = fit.node_id
    if fit.atoms:
        booked = res_sql.book_devices(db, node_id, fit.atoms, row.id)
        if booked != len(fit.atoms):  # the candidate read said they were free in this txn
            raise RuntimeError(f"booked {booked} of {len(fit.atoms)} {fit.atom} atoms on {node_id}")
        res_sql.insert_booking(db, row.id, node_id, fit.atom, len(fit.atoms))
        node_sql.take_free_atoms(db, node_id, len(fit.atoms))
        if pool.sharing != "exclusive":  # the spec lists booked GPUs (U3, H4): render anew
            node_sql.mark_stale(db, [node_id])
    if fit.pinned:
        res_sql.pin_cpus(db, node_id, fit.pinned, row.id)
    for resource, amount in fit.rows.items():
        if not res_sql.book_row(db, node_id, resource, amount):
            raise RuntimeError(f"{resource} on {node_id} was free a moment ago in this transaction")
        res_sql.insert_booking(db, row.id, node_id, resource, amount)
    at = now()
    fields = {
        "state": "placed",
        "node_id": node_id,
        "placed_at": at,
        "updated_at": at,
        "reason": None,
        "placement": msgspec.json.encode(fit.placement).decode(),
        "delivery_state": "pending",
        "delivery_reason": None,
        "delivery_at": at,
    }
    res_sql.update(db, row.id, fields)
    delivery.refresh_bookings(db, node_id)
    placed = msgspec.structs.replace(
        row, **{("placement_json" if k == "placement" else k): v for k, v in fields.items()}
    )
    reservation_event(db, "placed", placed, pool.owner_tenant_id, nodeId=node_id)


def retry_pending(db: Database, row: ReservationRow, at: str) -> Placement:
    """The placer's pass over one pending reservation: PoolGone, Expired, or another try to
    place it; it moved unless NOT_PLACED."""
    pool = pool_sql.get_pool(db, row.pool_id)
    assert pool is not None
    offered = pool_sql.authz_row_exists(db, row.tenant_id, pool.id)
    if pool.archived_at is not None or not offered or row.reason == "PoolGone":
        message = "the pool is archived" if pool.archived_at else "the pool is no longer offered"
        finish(db, row, "failed", "PoolGone", message)
        return Placement.FAILED
    if row.expires_at and row.expires_at <= at:
        finish(db, row, "failed", "Expired", "not placed within the pool's maxPending")
        return Placement.FAILED
    return place(db, row, pool)
