"""SQL for join tokens, nodes, node_resources rows and GPU atoms (node_devices)."""

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from controlplane.storage.paging import merged
from controlplane.storage.rows import one, rows
from controlplane.storage.sql import Database
from shared.nodespec import NodeSpecUnits

# --- join tokens -----------------------------------------------------------


def insert_join_token(db: Database, row: dict[str, Any]) -> None:
    db.execute(
        "INSERT INTO join_tokens (id, pool_id, token_hash, expires_at, max_uses, created_at) "
        "VALUES (:id, :pool_id, :token_hash, :expires_at, :max_uses, :created_at)",
        row,
    )


def join_token(db: Database, hashed: bytes) -> dict[str, Any] | None:
    return one(db, "SELECT * FROM join_tokens WHERE token_hash = ?", [hashed])


def use_join_token(db: Database, token_id: str) -> None:
    db.execute("UPDATE join_tokens SET uses = uses + 1 WHERE id = ?", [token_id])


# --- nodes -----------------------------------------------------------------

# H2: a node the placer may book on (nodes as n): ready, not cordoned, not being drained.
SCHEDULABLE = (
    "(n.state = 'ready' AND n.cordon_reason IS NULL AND n.drain_state IS NULL "
    "AND n.removed_at IS NULL)"
)

FACTS = ("logical_cpus", "memory_total_bytes", "hugepages_2mi", "hugepages_1gi", "disk_total_bytes")


def node_by_identity(db: Database, identity: str) -> dict[str, Any] | None:
    return one(db, "SELECT * FROM nodes WHERE identity = ?", [identity])


def get_node(db: Database, node_id: str) -> dict[str, Any] | None:
    return one(db, "SELECT * FROM nodes WHERE id = ?", [node_id])


def node_for_token(db: Database, hashed: bytes) -> dict[str, Any] | None:
    """What a report needs to decide it has nothing to write: one indexed read."""
    return one(
        db,
        "SELECT id, pool_id, state, inventory_hash, applied, spec_version FROM nodes "
        "WHERE token_hash = ?",
        [hashed],
    )


def insert_node(db: Database, row: dict[str, Any]) -> None:
    columns = ", ".join(row)
    values = ", ".join(f":{name}" for name in row)
    db.execute(f"INSERT INTO nodes ({columns}) VALUES ({values})", row)


def update_node(db: Database, node_id: str, fields: dict[str, Any]) -> None:
    assignments = ", ".join(f"{name} = :{name}" for name in fields)
    db.execute(
        f"UPDATE nodes SET {assignments} WHERE id = :node_id", {**fields, "node_id": node_id}
    )


def nodes_of_pool(db: Database, pool_id: str) -> list[dict[str, Any]]:
    return rows(
        db,
        "SELECT * FROM nodes WHERE pool_id = ? AND removed_at IS NULL ORDER BY hostname, id",
        [pool_id],
    )


def nodes_of_pools(
    db: Database,
    pool_ids: Sequence[str],
    states: Sequence[str] | None,
    after: str,
    limit: int,
) -> list[dict[str, Any]]:
    """H7: the live nodes of several pools in id order after ``after`` (a keyset page): one
    arm a pool, each a range of the (pool, id) index of live nodes, merged in id order (B1)."""
    wanted = f" AND state IN ({', '.join('?' * len(states))})" if states else ""
    arms = [
        (
            f"SELECT * FROM nodes WHERE pool_id = ? AND removed_at IS NULL AND id > ?{wanted}",
            [pool_id, after, *(states or [])],
        )
        for pool_id in pool_ids
    ]
    return merged(db, arms, limit)


def draining(db: Database) -> list[dict[str, Any]]:
    """Nodes being drained (a partial index), with their pool's owner for the events."""
    return rows(
        db,
        "SELECT n.*, p.owner_tenant_id FROM nodes n JOIN pools p ON p.id = n.pool_id "
        "WHERE n.drain_state = 'draining' AND n.removed_at IS NULL",
    )


def remove(db: Database, node_id: str, at: str) -> None:
    """H3: the node's rows and atoms go, its credential and machine identity are freed."""
    db.execute("DELETE FROM node_resources WHERE node_id = ?", [node_id])
    db.execute("DELETE FROM node_devices WHERE node_id = ?", [node_id])
    db.execute(
        "UPDATE nodes SET removed_at = ?, updated_at = ?, identity = NULL, token_hash = NULL, "
        "cordon_reason = NULL, cordoned_at = NULL, drain_reason = NULL, drain_state = NULL, "
        "drain_started_at = NULL, drain_deadline = NULL WHERE id = ?",
        [at, at, node_id],
    )


def mark_bookings_lost(db: Database, node_ids: Iterable[str]) -> None:
    db.executemany(
        "UPDATE reservations SET reason = 'NodeLost' WHERE node_id = ? AND state IN ('placed', 'active')",
        [(node_id,) for node_id in node_ids],
    )


# The nodes the lost-node check watches (nodes as n): live ones, not removed.
WATCHED = "(n.state IN ('ready', 'configuring', 'quarantined') AND n.removed_at IS NULL)"
AMONG_CHUNK = 500  # ids per statement, far below either backend's limit on parameters


def silent_nodes(
    db: Database, before: str, among: Sequence[str] | None = None
) -> list[dict[str, Any]]:
    """Watched nodes whose ``last_seen_at`` is older than ``before`` (indexed on state, time);
    with ``among``, only those of these ids, each found by its key: the few that the check
    off the writer found silent (storage/liveness.py)."""
    sql = (
        "SELECT n.id, n.pool_id, n.hostname, n.last_seen_at, p.owner_tenant_id FROM nodes n "
        f"JOIN pools p ON p.id = n.pool_id WHERE {WATCHED} AND n.last_seen_at < ?"
    )
    if among is None:
        return rows(db, sql, [before])
    found = []
    for start in range(0, len(among), AMONG_CHUNK):
        ids = among[start : start + AMONG_CHUNK]
        found += rows(db, f"{sql} AND n.id IN ({', '.join('?' * len(ids))})", [before, *ids])
    return found


def mark_lost(db: Database, node_ids: Iterable[str], at: str) -> None:
    db.executemany(
        "UPDATE nodes SET state = 'lost', state_reason = NULL, updated_at = ? WHERE id = ?",
        [(at, node_id) for node_id in node_ids],
    )


_RECONCILE = (
    "SELECT n.id, n.pool_id, n.hostname, n.state, n.state_reason, n.inventory, n.inventory_rev, "
    "n.spec_version, n.applied, n.applied_version, n.pending_reboot, n.applied_units, "
    f"{', '.join('n.' + f for f in FACTS)}, p.version AS pool_version, p.class, p.sharing, "
    "p.policy, p.gpu_model, p.owner_tenant_id FROM nodes n JOIN pools p ON p.id = n.pool_id "
)


def stale_nodes(db: Database) -> list[dict[str, Any]]:
    """Nodes whose rows were computed from an older inventory or pool version, or are held."""
    return rows(
        db,
        _RECONCILE
        + "WHERE (n.rows_inventory_rev != n.inventory_rev OR n.rows_pool_version != p.version) "
        "AND n.removed_at IS NULL",
    )


def reconcile_row(db: Database, node_id: str) -> list[dict[str, Any]]:
    return rows(db, _RECONCILE + "WHERE n.id = ?", [node_id])


def mark_stale(db: Database, node_ids: Iterable[str]) -> None:
    """The node is reconciled (and its spec rendered) again at the next pass: its bookings
    moved, which a MIG layout (U3) and drain-gated units (H4) depend on."""
    db.executemany(
        "UPDATE nodes SET rows_pool_version = -1 WHERE id = ?", [(node_id,) for node_id in node_ids]
    )


def mark_rows_current(db: Database, node_id: str, inventory_rev: int, pool_version: int) -> None:
    db.execute(
        "UPDATE nodes SET rows_inventory_rev = ?, rows_pool_version = ? WHERE id = ?",
        [inventory_rev, pool_version, node_id],
    )


def booked_gpus(db: Database, node_id: str) -> frozenset[str]:
    """GPUs with a booked atom: their MIG layout stays until they are idle (U3)."""
    found = db.execute(
        "SELECT DISTINCT gpu_uuid FROM node_devices WHERE node_id = ? AND allocated = 1", [node_id]
    )
    return frozenset(row[0] for row in found)


def spec_of(db: Database, node_id: str) -> NodeSpecUnits | None:
    """The node's stored NodeSpec units, if it has one."""
    found = db.execute("SELECT spec FROM nodes WHERE id = ?", [node_id]).fetchone()
    return msgspec.json.decode(found[0], type=NodeSpecUnits) if found and found[0] else None


def put_spec(db: Database, node_id: str, spec: str, version: str) -> None:
    db.execute("UPDATE nodes SET spec = ?, spec_version = ? WHERE id = ?", [spec, version, node_id])


# --- node_resources and node_devices ---------------------------------------


def resource_rows(db: Database, node_id: str) -> dict[str, dict[str, Any]]:
    found = rows(db, "SELECT * FROM node_resources WHERE node_id = ?", [node_id])
    return {row["resource"]: row for row in found}


def resource_rows_of(db: Database, node_ids: Sequence[str]) -> list[dict[str, Any]]:
    marks = ", ".join("?" * len(node_ids))
    return rows(
        db,
        f"SELECT * FROM node_resources WHERE node_id IN ({marks}) ORDER BY node_id, resource",
        list(node_ids),
    )


def put_resource(db: Database, node_id: str, resource: str, capacity: int, ratio: float) -> None:
    db.execute(
        "INSERT INTO node_resources (node_id, resource, capacity, allocated, ratio) "
        "VALUES (?, ?, ?, 0, ?) ON CONFLICT (node_id, resource) DO UPDATE SET "
        "capacity = excluded.capacity, ratio = excluded.ratio",
        [node_id, resource, capacity, ratio],
    )


def delete_resource(db: Database, node_id: str, resource: str) -> bool:
    """Delete an unallocated row; False when the row is still allocated (N5: it stays)."""
    return (
        db.execute(
            "DELETE FROM node_resources WHERE node_id = ? AND resource = ? AND allocated = 0",
            [node_id, resource],
        ).rowcount
        > 0
    )


def devices(db: Database, node_id: str) -> dict[str, dict[str, Any]]:
    found = rows(db, "SELECT * FROM node_devices WHERE node_id = ?", [node_id])
    return {row["device_id"]: row for row in found}


def devices_of(db: Database, node_ids: Sequence[str]) -> list[dict[str, Any]]:
    marks = ", ".join("?" * len(node_ids))
    return rows(
        db,
        f"SELECT * FROM node_devices WHERE node_id IN ({marks}) ORDER BY node_id, device_id",
        list(node_ids),
    )


def set_device_flags(
    db: Database, node_id: str, device_id: str, unhealthy: bool, held: bool
) -> None:
    """H5, H4: an atom out of placement for an unhealthy GPU or a drain-gated unit."""
    db.execute(
        "UPDATE node_devices SET unhealthy = ?, held = ? WHERE node_id = ? AND device_id = ?",
        [int(unhealthy), int(held), node_id, device_id],
    )


def insert_device(
    db: Database,
    node_id: str,
    device_id: str,
    resource: str,
    gpu_uuid: str,
    profile: str | None,
) -> None:
    db.execute(
        "INSERT INTO node_devices (node_id, device_id, resource, gpu_uuid, profile) "
        "VALUES (?, ?, ?, ?, ?)",
        [node_id, device_id, resource, gpu_uuid, profile],
    )


def delete_device(db: Database, node_id: str, device_id: str) -> bool:
    """Delete an unbooked atom; False when it is booked (it stays until the booking ends)."""
    return (
        db.execute(
            "DELETE FROM node_devices WHERE node_id = ? AND device_id = ? AND allocated = 0",
            [node_id, device_id],
        ).rowcount
        > 0
    )
