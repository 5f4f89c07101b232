"""SQL for join tokens, nodes, node_resources rows and GPU atoms (node_devices), read into
the typed rows of storage/node_types.py."""

from collections.abc import Iterable, Sequence
from typing import Any, cast

from controlplane.storage.node_types import (
    DEVICE_COLUMNS,
    HEAD_COLUMNS,
    NODE_COLUMNS,
    POOL_COLUMNS,
    RESOURCE_COLUMNS,
    DeviceRow,
    JoinTokenRow,
    NewAtom,
    NodeHead,
    NodePool,
    NodeRow,
    ReconcileRow,
    ResourceRow,
    SilentRow,
    device_row,
    node_head,
    node_pool,
    node_row,
    reconcile_row,
    resource_row,
)
from controlplane.storage.paging import merged
from controlplane.storage.sql import Database, values_of

# --- join tokens -----------------------------------------------------------


def insert_join_token(db: Database, row: dict[str, Any]) -> None:
    db.execute(
        "INSERT INTO join_tokens (id, pool_id, token_hash, expires_at, max_uses, created_at) "
        "VALUES (:id, :pool_id, :token_hash, :expires_at, :max_uses, :created_at)",
        row,
    )


def join_token(db: Database, hashed: bytes) -> JoinTokenRow | None:
    found = db.execute(
        "SELECT id, pool_id, expires_at, max_uses, uses FROM join_tokens WHERE token_hash = ?",
        [hashed],
    ).fetchone()
    if found is None:
        return None
    token_id, pool_id, expires_at, max_uses, uses = found
    return JoinTokenRow(
        id=token_id, pool_id=pool_id, expires_at=expires_at, max_uses=max_uses, uses=uses
    )


def use_join_token(db: Database, token_id: str) -> bool:
    """Spend one use of the token; False when none is left. Joins running side by side (B5)
    wait here for each other's commit, so no use is spent twice."""
    spent = db.execute(
        "UPDATE join_tokens SET uses = uses + 1 WHERE id = ? AND uses < max_uses", [token_id]
    )
    return bool(spent.rowcount)


# --- nodes -----------------------------------------------------------------

# H2: a node the placer may book on (nodes as n): ready, not cordoned, not being drained.
SCHEDULABLE = (
    "(n.state = 'ready' AND n.cordon_reason IS NULL AND n.drain_state IS NULL "
    "AND n.removed_at IS NULL)"
)

FACTS = ("logical_cpus", "memory_total_bytes", "hugepages_2mi", "hugepages_1gi", "disk_total_bytes")
_NODE = ", ".join(NODE_COLUMNS)
_N_NODE = ", ".join(f"n.{column}" for column in NODE_COLUMNS)
_P_POOL = ", ".join(f"p.{column}" for column in POOL_COLUMNS)


def _node(db: Database, where: str, params: Sequence[Any]) -> NodeRow | None:
    found = db.execute(f"SELECT {_NODE} FROM nodes WHERE {where}", params).fetchone()
    return None if found is None else node_row(found)


def node_by_identity(db: Database, identity: str) -> NodeRow | None:
    return _node(db, "identity = ?", [identity])


def get_node(db: Database, node_id: str) -> NodeRow | None:
    return _node(db, "id = ?", [node_id])


def node_for_token(db: Database, hashed: bytes) -> NodeRow | None:
    """The node of a node credential: one indexed read, the row a report or a spec then uses."""
    return _node(db, "token_hash = ?", [hashed])


_HEAD_FOR_TOKEN = f"SELECT {', '.join(HEAD_COLUMNS)} FROM nodes WHERE token_hash = ?"


def head_for_token(db: Database, hashed: bytes) -> NodeHead | None:
    """The small columns of a node credential's node (F9): one indexed read that leaves the
    row's large columns (its ~8 KB inventory: SQLite's overflow pages) unread."""
    found = db.execute(_HEAD_FOR_TOKEN, [hashed]).fetchone()
    return None if found is None else node_head(found)


def insert_node(db: Database, row: dict[str, Any]) -> None:
    columns = ", ".join(row)
    values = ", ".join(f":{name}" for name in row)
    db.execute(f"INSERT INTO nodes ({columns}) VALUES ({values})", row)


def update_node(db: Database, node_id: str, fields: dict[str, Any]) -> None:
    assignments = ", ".join(f"{name} = :{name}" for name in fields)
    db.execute(
        f"UPDATE nodes SET {assignments} WHERE id = :node_id", {**fields, "node_id": node_id}
    )


def nodes_of_pools(
    db: Database,
    pool_ids: Sequence[str],
    states: Sequence[str] | None,
    after: str,
    limit: int,
) -> list[NodeRow]:
    """H7: the live nodes of several pools in id order after ``after`` (a keyset page): one
    arm a pool, each a range of the (pool, id) index of live nodes, merged in id order (B1)."""
    wanted = f" AND state IN ({', '.join('?' * len(states))})" if states else ""
    arms = [
        (
            f"SELECT {_NODE} FROM nodes WHERE pool_id = ? AND removed_at IS NULL AND id > ?"
            f"{wanted}",
            [pool_id, after, *(states or [])],
        )
        for pool_id in pool_ids
    ]
    return [node_row([row[c] for c in NODE_COLUMNS]) for row in merged(db, arms, limit)]


def pool_of_node(db: Database, pool_id: str) -> NodePool | None:
    """What a node's reconcile reads of its pool, for a node already read (a report's); read
    once in a group commit (``Database.pools_read``)."""
    held = db.pools_read
    if held is not None and pool_id in held:
        return cast(NodePool | None, held[pool_id])
    found = db.execute(
        f"SELECT {', '.join(POOL_COLUMNS)} FROM pools WHERE id = ?", [pool_id]
    ).fetchone()
    pool = None if found is None else node_pool(found)
    if held is not None:
        held[pool_id] = pool
    return pool


_WITH_POOL = f"SELECT {_N_NODE}, {_P_POOL} FROM nodes n JOIN pools p ON p.id = n.pool_id "


def draining(db: Database) -> list[ReconcileRow]:
    """Nodes being drained (a partial index), with their pool (its owner for the events)."""
    found = db.execute(
        _WITH_POOL + "WHERE n.drain_state = 'draining' AND n.removed_at IS NULL"
    ).fetchall()
    return [reconcile_row(row) for row in found]


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


def silent_nodes(db: Database, before: str, among: Sequence[str] | None = None) -> list[SilentRow]:
    """Watched nodes whose ``last_seen_at`` is older than ``before`` (indexed on state, time);
    with ``among``, only those of these ids, each found by its key: the few that the check
    off the writer found silent (storage/liveness.py)."""
    sql = (
        "SELECT n.id, n.pool_id, n.hostname, n.last_seen_at, p.owner_tenant_id FROM nodes n "
        f"JOIN pools p ON p.id = n.pool_id WHERE {WATCHED} AND n.last_seen_at < ?"
    )
    if among is None:
        found = db.execute(sql, [before]).fetchall()
    else:
        found = []
        for start in range(0, len(among), AMONG_CHUNK):
            ids = among[start : start + AMONG_CHUNK]
            marks = ", ".join("?" * len(ids))
            found += db.execute(f"{sql} AND n.id IN ({marks})", [before, *ids]).fetchall()
    return [
        SilentRow(id=i, pool_id=pool, hostname=host, last_seen_at=seen, owner_tenant_id=owner)
        for i, pool, host, seen, owner in found
    ]


def mark_lost(db: Database, node_ids: Iterable[str], at: str) -> None:
    db.executemany(
        "UPDATE nodes SET state = 'lost', state_reason = NULL, updated_at = ? WHERE id = ?",
        [(at, node_id) for node_id in node_ids],
    )


def stale_nodes(db: Database) -> list[ReconcileRow]:
    """Nodes whose rows were computed from an older inventory or pool version, or are held."""
    found = db.execute(
        _WITH_POOL
        + "WHERE (n.rows_inventory_rev != n.inventory_rev OR n.rows_pool_version != p.version) "
        "AND n.removed_at IS NULL"
    ).fetchall()
    return [reconcile_row(row) for row in found]


def reconcile_row_of(db: Database, node_id: str) -> ReconcileRow | None:
    found = db.execute(_WITH_POOL + "WHERE n.id = ?", [node_id]).fetchone()
    return None if found is None else reconcile_row(found)


def count_free_atoms(db: Database, node_ids: Iterable[str]) -> None:
    """The nodes' ``free_atoms`` (the bin-packing order) follow their atoms."""
    db.executemany(
        "UPDATE nodes SET free_atoms = (SELECT count(*) FROM node_devices d "
        "WHERE d.node_id = nodes.id AND d.allocated = 0 AND d.unhealthy = 0 AND d.held = 0) "
        "WHERE id = ?",
        [(node_id,) for node_id in node_ids],
    )


def take_free_atoms(db: Database, node_id: str, booked: int) -> None:
    """``booked`` of the node's free, placeable atoms were just booked."""
    db.execute("UPDATE nodes SET free_atoms = free_atoms - ? WHERE id = ?", [booked, node_id])


STALE = -1  # rows_pool_version of a node the next pass reconciles whatever moved
UNWRITTEN = 0  # rows_pool_version of a node that joined: it has no rows nor atoms yet


def mark_stale(db: Database, node_ids: Iterable[str]) -> None:
    """The node is reconciled (and its spec rendered) again at the next pass: its bookings
    moved, which a MIG layout (U3) and drain-gated units (H4) depend on."""
    db.executemany(
        f"UPDATE nodes SET rows_pool_version = {STALE} WHERE id = ?",
        [(node_id,) for node_id in node_ids],
    )


# --- node_resources and node_devices ---------------------------------------


def resource_rows(db: Database, node_id: str) -> dict[str, ResourceRow]:
    found = db.execute(
        f"SELECT {', '.join(RESOURCE_COLUMNS)} FROM node_resources WHERE node_id = ?", [node_id]
    )
    return {row.resource: row for row in map(resource_row, found)}


def resource_rows_of(db: Database, node_ids: Sequence[str]) -> list[ResourceRow]:
    marks = ", ".join("?" * len(node_ids))
    found = db.execute(
        f"SELECT {', '.join(RESOURCE_COLUMNS)} FROM node_resources WHERE node_id IN ({marks}) "
        "ORDER BY node_id, resource",
        list(node_ids),
    )
    return [resource_row(row) for row in found]


def put_resources(db: Database, node_id: str, rows: Sequence[tuple[str, int, float]]) -> None:
    """The node's rows ``(resource, capacity, ratio)``, written or rewritten, in one statement
    (each resource once)."""
    if not rows:
        return
    values, params = values_of(
        [(node_id, resource, capacity, ratio) for resource, capacity, ratio in rows],
        "(?, ?, ?, 0, ?)",
    )
    db.execute(
        "INSERT INTO node_resources (node_id, resource, capacity, allocated, ratio) "
        f"VALUES {values} ON CONFLICT (node_id, resource) DO UPDATE SET "
        "capacity = excluded.capacity, ratio = excluded.ratio",
        params,
    )


def delete_resource(db: Database, node_id: str, resource: str) -> None:
    db.execute("DELETE FROM node_resources WHERE node_id = ? AND resource = ?", [node_id, resource])


def devices(db: Database, node_id: str) -> dict[str, DeviceRow]:
    found = db.execute(
        f"SELECT {', '.join(DEVICE_COLUMNS)} FROM node_devices WHERE node_id = ?", [node_id]
    )
    return {row.device_id: row for row in map(device_row, found)}


def devices_of(db: Database, node_ids: Sequence[str]) -> list[DeviceRow]:
    marks = ", ".join("?" * len(node_ids))
    found = db.execute(
        f"SELECT {', '.join(DEVICE_COLUMNS)} FROM node_devices WHERE node_id IN ({marks}) "
        "ORDER BY node_id, device_id",
        list(node_ids),
    )
    return [device_row(row) for row in found]


def set_device_flags(db: Database, node_id: str, flags: Sequence[tuple[str, bool, bool]]) -> None:
    """H5, H4: atoms ``(device_id, unhealthy, held)`` out of placement (or back) for an
    unhealthy GPU or a drain-gated unit."""
    db.executemany(
        "UPDATE node_devices SET unhealthy = ?, held = ? WHERE node_id = ? AND device_id = ?",
        [(int(unhealthy), int(held), node_id, atom) for atom, unhealthy, held in flags],
    )


def insert_devices(db: Database, node_id: str, atoms: Sequence[NewAtom]) -> None:
    """New atoms of the node, not booked, in one statement."""
    if not atoms:
        return
    values, params = values_of(
        [
            (node_id, a.device_id, a.resource, a.gpu_uuid, a.profile, int(a.unhealthy), int(a.held))
            for a in atoms
        ],
        "(?, ?, ?, ?, ?, ?, ?)",
    )
    db.execute(
        "INSERT INTO node_devices (node_id, device_id, resource, gpu_uuid, profile, unhealthy, "
        f"held) VALUES {values}",
        params,
    )


def delete_devices(db: Database, node_id: str, device_ids: Iterable[str]) -> None:
    db.executemany(
        "DELETE FROM node_devices WHERE node_id = ? AND device_id = ?",
        [(node_id, device_id) for device_id in device_ids],
    )
