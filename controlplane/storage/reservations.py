"""SQL for reservations and their bookings (atoms and node_resources rows)."""

from collections.abc import Sequence
from typing import Any

from controlplane.storage.ledger_types import BookingRow
from controlplane.storage.nodes import SCHEDULABLE
from controlplane.storage.paging import merged
from controlplane.storage.rows import one, rows
from controlplane.storage.sql import Database
from controlplane.storage.types import ReservationRow, reservation_columns, reservation_row

LIVE = ("pending", "placed", "active")  # what counts against quota; placed and active hold bookings
STATES = (*LIVE, "ended", "failed")


def insert(db: Database, row: ReservationRow) -> None:
    columns = reservation_columns(row)
    names = ", ".join(columns)
    values = ", ".join(f":{name}" for name in columns)
    db.execute(f"INSERT INTO reservations ({names}) VALUES ({values})", columns)


def get(db: Database, reservation_id: str) -> ReservationRow | None:
    found = one(db, "SELECT * FROM reservations WHERE id = ?", [reservation_id])
    return None if found is None else reservation_row(found)


def update(db: Database, reservation_id: str, fields: dict[str, Any]) -> None:
    assignments = ", ".join(f"{name} = :{name}" for name in fields)
    db.execute(
        f"UPDATE reservations SET {assignments} WHERE id = :rid", {**fields, "rid": reservation_id}
    )


def of_tenant(
    db: Database,
    tenant_id: str,
    pool_id: str | None,
    states: Sequence[str] | None,
    after: str,
    limit: int,
) -> list[ReservationRow]:
    """B1: the tenant's reservations (of a pool, in some states) in id order after ``after``,
    at most ``limit``, O(page) from any cursor whatever the tenant's history: one arm a state,
    each a range of the (tenant, state, id) index, or (tenant, pool, state, id) with a pool,
    merged in id order."""
    keys = "tenant_id = ? AND pool_id = ?" if pool_id is not None else "tenant_id = ?"
    scope = [tenant_id, *([] if pool_id is None else [pool_id])]
    arms = [
        (
            f"SELECT * FROM reservations WHERE {keys} AND state = ? AND id > ?",
            [*scope, state, after],
        )
        for state in dict.fromkeys(states or STATES)
    ]
    return [reservation_row(row) for row in merged(db, arms, limit)]


def _select(db: Database, where: str, params: list[Any] | None = None) -> list[ReservationRow]:
    """Reservation rows ``WHERE …`` (with its ORDER BY), typed."""
    found = rows(db, f"SELECT * FROM reservations {where}", params or [])
    return [reservation_row(row) for row in found]


def live_of_tenant(db: Database, tenant_id: str) -> list[ReservationRow]:
    return _select(
        db,
        "WHERE tenant_id = ? AND state IN ('pending', 'placed', 'active') ORDER BY id",
        [tenant_id],
    )


def placed(db: Database) -> list[ReservationRow]:
    return _select(db, "WHERE state = 'placed'")


def pending(db: Database) -> list[ReservationRow]:
    """Pending reservations, oldest first: the placer's queue."""
    return _select(db, "WHERE state = 'pending' ORDER BY created_at, id")


# --- the placer's reads and writes -----------------------------------------


def nodes_with_free_atoms(
    db: Database,
    pool_id: str,
    resource: str,
    profile: str | None,
    count: int,
    limit: int,
    after: str = "",
) -> list[str]:
    """Ready nodes of the pool after ``after`` with at least ``count`` free atoms, in node order.

    The index on (resource, allocated, node_id) streams free atoms node by node, so the
    scan stops at the first nodes that fit.
    """
    profile_filter = "AND d.profile = ?" if profile is not None else ""
    params: list[Any] = [
        resource,
        after,
        *([profile] if profile is not None else []),
        pool_id,
        count,
        limit,
    ]
    found = db.execute(
        "SELECT d.node_id FROM node_devices d JOIN nodes n ON n.id = d.node_id "
        f"WHERE d.resource = ? AND d.allocated = 0 AND d.node_id > ? {profile_filter} "
        "AND d.unhealthy = 0 AND d.held = 0 AND n.pool_id = ? AND " + SCHEDULABLE + " "
        "GROUP BY d.node_id HAVING count(*) >= ? ORDER BY d.node_id LIMIT ?",
        params,
    )
    return [row[0] for row in found]


def ready_nodes(db: Database, pool_id: str, limit: int, after: str = "") -> list[str]:
    found = db.execute(
        "SELECT id FROM nodes n WHERE pool_id = ? AND " + SCHEDULABLE + " AND id > ? "
        "ORDER BY id LIMIT ?",
        [pool_id, after, limit],
    )
    return [row[0] for row in found]


def free_rows(db: Database, node_id: str) -> dict[str, int]:
    found = db.execute(
        "SELECT resource, capacity - allocated FROM node_resources WHERE node_id = ?", [node_id]
    )
    return {row[0]: row[1] for row in found}


def book_atoms(
    db: Database,
    node_id: str,
    resource: str,
    profile: str | None,
    count: int,
    reservation_id: str,
) -> int:
    """Book ``count`` free, placeable atoms (healthy, not held: H2, H4, H5) of the node for
    the reservation; returns how many were booked."""
    profile_filter = "AND profile = ?" if profile is not None else ""
    params: list[Any] = [
        reservation_id,
        node_id,
        resource,
        *([profile] if profile is not None else []),
        count,
    ]
    return db.execute(
        "UPDATE node_devices SET allocated = 1, reservation_id = ? WHERE node_id = ? AND device_id IN ("
        "SELECT device_id FROM node_devices WHERE node_id = ? AND resource = ? AND allocated = 0 "
        f"AND unhealthy = 0 AND held = 0 {profile_filter} ORDER BY device_id LIMIT ?)",
        [reservation_id, node_id, *params[1:]],
    ).rowcount


def book_row(db: Database, node_id: str, resource: str, amount: int) -> bool:
    """Book ``amount`` of a row, never beyond its capacity."""
    return (
        db.execute(
            "UPDATE node_resources SET allocated = allocated + ? "
            "WHERE node_id = ? AND resource = ? AND capacity - allocated >= ?",
            [amount, node_id, resource, amount],
        ).rowcount
        == 1
    )


def insert_booking(
    db: Database, reservation_id: str, node_id: str, resource: str, amount: int
) -> None:
    db.execute(
        "INSERT INTO bookings (reservation_id, node_id, resource, amount) VALUES (?, ?, ?, ?)",
        [reservation_id, node_id, resource, amount],
    )


def bookings_of(db: Database, reservation_id: str) -> list[BookingRow]:
    found = rows(db, "SELECT * FROM bookings WHERE reservation_id = ?", [reservation_id])
    return [BookingRow.from_row(row) for row in found]


def free_atoms(db: Database, reservation_id: str) -> None:
    """The atoms booked for the reservation are free again."""
    db.execute(
        "UPDATE node_devices SET allocated = 0, reservation_id = NULL WHERE reservation_id = ?",
        [reservation_id],
    )


def row_allocated(db: Database, node_id: str, resource: str) -> int | None:
    """How much of a node_resources row is booked; None when the node has no such row."""
    found = db.execute(
        "SELECT allocated FROM node_resources WHERE node_id = ? AND resource = ?",
        [node_id, resource],
    ).fetchone()
    return None if found is None else int(found[0])


def set_row_allocated(db: Database, node_id: str, resource: str, allocated: int) -> None:
    db.execute(
        "UPDATE node_resources SET allocated = ? WHERE node_id = ? AND resource = ?",
        [allocated, node_id, resource],
    )


def mark_pool_gone(db: Database, pool_id: str, tenant_id: str | None = None) -> None:
    """O6, A1: pending reservations of the pool (of one tenant, on an unoffer) fail with PoolGone
    at their next retry, even if the pool is offered again before it."""
    sql = "UPDATE reservations SET reason = 'PoolGone' WHERE pool_id = ? AND state = 'pending'"
    params: list[Any] = [pool_id]
    if tenant_id is not None:
        sql += " AND tenant_id = ?"
        params.append(tenant_id)
    db.execute(sql, params)


def live_on_node(db: Database, node_id: str) -> list[ReservationRow]:
    """Placed and active reservations booked on a node."""
    return _select(db, "WHERE node_id = ? AND state IN ('placed', 'active') ORDER BY id", [node_id])


def flag_unhealthy_bookings(db: Database, node_id: str) -> None:
    """H5: live bookings holding an atom of an unhealthy GPU are flagged (they stay booked);
    the flag goes once every GPU they hold is healthy again."""
    db.execute(
        "UPDATE reservations SET reason = CASE WHEN EXISTS (SELECT 1 FROM node_devices d "
        "WHERE d.reservation_id = reservations.id AND d.unhealthy = 1) THEN 'GpuUnhealthy' "
        "ELSE NULL END WHERE node_id = ? AND state IN ('placed', 'active') "
        "AND (reason IS NULL OR reason = 'GpuUnhealthy')",
        [node_id],
    )


def clear_node_lost(db: Database, node_id: str) -> None:
    """The node is back: its bookings lose the NodeLost mark (and keep GpuUnhealthy, H5)."""
    db.execute(
        "UPDATE reservations SET reason = NULL WHERE node_id = ? AND reason = 'NodeLost'", [node_id]
    )
    flag_unhealthy_bookings(db, node_id)


def in_use(db: Database, pool_id: str, tenant_id: str) -> dict[str, int]:
    """Per resource, what the tenant's placed and active reservations on the pool hold."""
    found = db.execute(
        "SELECT j.key, CAST(sum(CAST(j.value AS BIGINT)) AS BIGINT) FROM reservations r, "
        f"{db.dialect.json_int_entries('r.resources')} "
        "WHERE r.pool_id = ? AND r.tenant_id = ? AND r.state IN ('placed', 'active') "
        "GROUP BY j.key",
        [pool_id, tenant_id],
    ).fetchall()
    return {resource: int(amount) for resource, amount in found}
