"""SQL for reservations and their bookings (atoms and node_resources rows)."""

from collections.abc import Sequence
from typing import Any, NamedTuple

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


def live_ids(db: Database, reservation_ids: set[str]) -> set[str]:
    """Which of these reservations are live (pending, placed or active)."""
    if not reservation_ids:
        return set()
    marks = ", ".join("?" * len(reservation_ids))
    found = db.execute(
        f"SELECT id FROM reservations WHERE id IN ({marks}) "
        "AND state IN ('pending', 'placed', 'active')",
        sorted(reservation_ids),
    )
    return {reservation_id for (reservation_id,) in found}


def timed_up(db: Database, at: str) -> list[ReservationRow]:
    """C4: live reservations whose duration ran out at ``at``, the first to end first."""
    return _select(
        db,
        "WHERE ends_at IS NOT NULL AND ends_at <= ? AND state IN ('pending', 'placed', 'active') "
        "ORDER BY ends_at, id",
        [at],
    )


def pending(db: Database) -> list[ReservationRow]:
    """Pending reservations, oldest first: the placer's queue."""
    return _select(db, "WHERE state = 'pending' ORDER BY created_at, id")


# --- the placer's reads and writes -----------------------------------------


class Candidate(NamedTuple):
    """A node the placer weighs: its free placeable atoms and what it knows of its topology."""

    node_id: str
    hostname: str
    free_atoms: int
    topology: str | None
    logical_cpus: int


CANDIDATE_COLUMNS = "n.id, n.hostname, n.free_atoms, n.topology, n.logical_cpus"


def packed_candidates(
    db: Database, pool_id: str, count: int, after: tuple[int, str], limit: int
) -> list[Candidate]:
    """D2: schedulable nodes of the pool with at least ``count`` free placeable atoms, the
    fewest free first (bin-packing), then by id, after ``after`` (free, id): the index on
    (pool, free_atoms, id) streams them."""
    found = db.execute(
        f"SELECT {CANDIDATE_COLUMNS} FROM nodes n WHERE n.pool_id = ? AND n.removed_at IS NULL "
        # a row comparison: PostgreSQL walks the index from the cursor on, not from ``count``
        "AND n.free_atoms >= ? AND (n.free_atoms, n.id) > (?, ?) AND "
        + SCHEDULABLE
        + " ORDER BY n.free_atoms, n.id LIMIT ?",
        [pool_id, count, after[0], after[1], limit],
    )
    return [Candidate(*row) for row in found]


def first_fit_candidates(
    db: Database, pool_id: str, count: int, after: str, limit: int
) -> list[Candidate]:
    """D2 ``none``: schedulable nodes with at least ``count`` free atoms in id order."""
    found = db.execute(
        f"SELECT {CANDIDATE_COLUMNS} FROM nodes n WHERE n.pool_id = ? AND n.removed_at IS NULL "
        "AND n.free_atoms >= ? AND n.id > ? AND " + SCHEDULABLE + " ORDER BY n.id LIMIT ?",
        [pool_id, count, after, limit],
    )
    return [Candidate(*row) for row in found]


def free_atoms_of(
    db: Database, node_ids: Sequence[str], resource: str, profile: str | None
) -> dict[str, list[tuple[str, str]]]:
    """Per node, its free placeable atoms of ``resource`` (and MIG ``profile``) as
    (device id, GPU UUID) in device order."""
    if not node_ids:
        return {}
    marks = ", ".join("?" for _ in node_ids)
    profile_filter = "AND profile = ?" if profile is not None else ""
    found = db.execute(
        f"SELECT node_id, device_id, gpu_uuid FROM node_devices WHERE node_id IN ({marks}) "
        f"AND resource = ? AND allocated = 0 AND unhealthy = 0 AND held = 0 {profile_filter} "
        "ORDER BY node_id, device_id",
        [*node_ids, resource, *([profile] if profile is not None else [])],
    )
    free: dict[str, list[tuple[str, str]]] = {node_id: [] for node_id in node_ids}
    for node_id, device_id, gpu_uuid in found:
        free[node_id].append((device_id, gpu_uuid))
    return free


def book_devices(db: Database, node_id: str, device_ids: Sequence[str], reservation_id: str) -> int:
    """Book these atoms of the node for the reservation, each only while it is free and
    placeable (H2, H4, H5); returns how many were booked."""
    marks = ", ".join("?" for _ in device_ids)
    return db.execute(
        "UPDATE node_devices SET allocated = 1, reservation_id = ? WHERE node_id = ? "
        f"AND device_id IN ({marks}) AND allocated = 0 AND unhealthy = 0 AND held = 0",
        [reservation_id, node_id, *device_ids],
    ).rowcount


def pinned_cpus(db: Database, node_id: str) -> set[int]:
    """D3: the node's CPUs a live or releasing booking holds exclusively."""
    found = db.execute("SELECT cpu FROM node_cpus WHERE node_id = ?", [node_id])
    return {int(row[0]) for row in found}


def pin_cpus(db: Database, node_id: str, cpus: Sequence[int], reservation_id: str) -> None:
    """D3, D8: the CPUs are the reservation's alone (the primary key refuses a second)."""
    db.executemany(
        "INSERT INTO node_cpus (node_id, cpu, reservation_id) VALUES (?, ?, ?)",
        [(node_id, cpu, reservation_id) for cpu in cpus],
    )


def row_ratio(db: Database, node_id: str, resource: str) -> float | None:
    found = db.execute(
        "SELECT ratio FROM node_resources WHERE node_id = ? AND resource = ?",
        [node_id, resource],
    ).fetchone()
    return None if found is None else float(found[0])


def free_rows_of(db: Database, node_ids: Sequence[str]) -> dict[str, dict[str, int]]:
    """Per node, per resource, what its node_resources rows have left to book."""
    marks = ", ".join("?" for _ in node_ids)
    found = db.execute(
        "SELECT node_id, resource, capacity - allocated FROM node_resources "
        f"WHERE node_id IN ({marks})",
        list(node_ids),
    )
    free: dict[str, dict[str, int]] = {}
    for node_id, resource, left in found:
        free.setdefault(node_id, {})[resource] = int(left)
    return free


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
    """The atoms and pinned CPUs booked for the reservation are free again."""
    db.execute(
        "UPDATE node_devices SET allocated = 0, reservation_id = NULL WHERE reservation_id = ?",
        [reservation_id],
    )
    db.execute("DELETE FROM node_cpus WHERE reservation_id = ?", [reservation_id])


def mark_releasing(db: Database, reservation_id: str, releasing: bool) -> None:
    """D7: the reservation's bookings are held for the host to confirm their release."""
    db.execute(
        "UPDATE bookings SET releasing = ? WHERE reservation_id = ?",
        [int(releasing), reservation_id],
    )


HELD = "(state IN ('placed', 'active') OR delivery_state IN ('releasing', 'release-blocked'))"


def held_on_node(db: Database, node_id: str) -> list[ReservationRow]:
    """D5, D7: the node's live and releasing reservations: what its NodeSpec carries."""
    return _select(db, f"WHERE node_id = ? AND {HELD} ORDER BY id", [node_id])


def held_on_nodes(db: Database, node_ids: Sequence[str]) -> list[ReservationRow]:
    """``held_on_node`` for many nodes at once (a page of nodes/list)."""
    if not node_ids:
        return []
    marks = ", ".join("?" for _ in node_ids)
    return _select(db, f"WHERE node_id IN ({marks}) AND {HELD} ORDER BY id", list(node_ids))


def releasing_on_node(db: Database, node_id: str) -> list[ReservationRow]:
    return _select(
        db,
        "WHERE node_id = ? AND delivery_state IN ('releasing', 'release-blocked') ORDER BY id",
        [node_id],
    )


def undelivered(db: Database) -> list[ReservationRow]:
    """D6: placed reservations whose host has not yet delivered them."""
    return _select(db, "WHERE state = 'placed' AND delivery_state = 'pending' ORDER BY id")


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
