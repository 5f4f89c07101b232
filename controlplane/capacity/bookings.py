"""Bookings: the placer (first fit over ready, schedulable nodes, booking atoms and rows in the
caller's transaction), quota ``used`` following live reservations, and a live reservation's
end (bookings, quota and GPU hours given back), with the reservation events they write.

The placer returns what each try came to (``Placement``); the layer above counts it.
"""

import enum
import time
from collections.abc import Callable
from typing import Any

import msgspec
import structlog

from controlplane.capacity.meters import gpu_equivalents, meter_of
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

ATOMS = {"exclusive": "gpu", "mig": "gpu.mig", "timeslice": "gpu.slot", "mps": "gpu.slot"}


PLACE_CANDIDATES = 32


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


def _release(db: Database, row: ReservationRow) -> list[BookingRow]:
    """Give back everything the reservation booked (atoms and node_resources rows); returns
    its bookings. A row never goes below 0 booked: a release past it is a bookkeeping bug,
    logged."""
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
    return booked


def finish(
    db: Database, row: ReservationRow, state: str, reason: str | None, message: str
) -> ReservationRow:
    """End or fail a live reservation: release its bookings, its quota and meter its GPU hours."""
    at = now()
    pool = pool_sql.get_pool(db, row.pool_id)
    assert pool is not None
    booked = _release(db, row)
    if pool.sharing != "exclusive":  # its GPUs may take their new layout or sharing now
        node_sql.mark_stale(db, {b.node_id for b in booked if b.resource in ATOMS.values()})
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
    fields = {"state": state, "reason": reason, "updated_at": at, "ended_at": at}
    res_sql.update(db, row.id, fields)
    done = msgspec.structs.replace(row, **fields)
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
    """Book the reservation on the first ready host node it fits (atoms and rows)."""
    resources = row.resources
    atom = ATOMS[pool.sharing]
    wanted_atoms = resources.get(atom, 0)
    rows_asked = {r: a for r, a in resources.items() if r not in ("gpu", "gpu.mig", "gpu.slot")}
    after = ""
    while True:  # keyset pages of candidates, until one fits or the pool has no more
        if wanted_atoms:
            candidates = res_sql.nodes_with_free_atoms(
                db, pool.id, atom, row.mig_profile, wanted_atoms, PLACE_CANDIDATES, after
            )
        else:
            candidates = res_sql.ready_nodes(db, pool.id, PLACE_CANDIDATES, after)
        if not candidates:
            return Placement.NOT_PLACED
        for node_id in candidates:
            if _book_on(db, row, pool, node_id, atom, wanted_atoms, rows_asked):
                return Placement.PLACED
        after = candidates[-1]


def _book_on(
    db: Database,
    row: ReservationRow,
    pool: PoolRow,
    node_id: str,
    atom: str,
    wanted_atoms: int,
    rows_asked: dict[str, int],
) -> bool:
    """Book the reservation on this node if its rows have room; False (nothing written) if not."""
    free = res_sql.free_rows(db, node_id)
    if any(free.get(resource, 0) < amount for resource, amount in rows_asked.items()):
        return False
    if wanted_atoms:
        booked = res_sql.book_atoms(db, node_id, atom, row.mig_profile, wanted_atoms, row.id)
        if booked != wanted_atoms:  # the candidate query said they were free in this transaction
            raise RuntimeError(f"booked {booked} of {wanted_atoms} {atom} atoms on {node_id}")
        res_sql.insert_booking(db, row.id, node_id, atom, wanted_atoms)
        if pool.sharing != "exclusive":  # the spec lists booked GPUs (U3, H4): render anew
            node_sql.mark_stale(db, [node_id])
    for resource, amount in rows_asked.items():
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
    }
    res_sql.update(db, row.id, fields)
    reservation_event(
        db, "placed", msgspec.structs.replace(row, **fields), pool.owner_tenant_id, nodeId=node_id
    )
    return True


def activate(db: Database, row: ReservationRow, seen_since: Callable[[str], float | None]) -> bool:
    """placed → active once the node holding the booking has reported since it was placed:
    the host is known to be up with the booking on it. True if it moved."""
    assert row.node_id is not None and row.placed_at is not None  # a placed reservation
    seen = seen_since(row.node_id)
    if seen is None:  # reported to another replica (B4): its stored stamp says
        stored = node_sql.get_node(db, row.node_id)
        seen = epoch(stored.last_seen_at) if stored and stored.last_seen_at else None
    if seen is None or seen < epoch(row.placed_at):
        return False
    fields = {"state": "active", "updated_at": now()}
    res_sql.update(db, row.id, fields)
    pool = pool_sql.get_pool(db, row.pool_id)
    assert pool is not None
    reservation_event(
        db,
        "active",
        msgspec.structs.replace(row, **fields),
        pool.owner_tenant_id,
        nodeId=row.node_id,
    )
    return True


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
