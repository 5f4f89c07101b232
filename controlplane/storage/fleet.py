"""SQL for the fleet gauges of /metrics (M1): grouped counts, one row per pool and state.

Nothing here reads a row per object: nodes are counted by (pool, state) and reservations only
in their live states (an index range of ``reservations_queue``), never the ended history.
"""

from controlplane.storage.reservations import LIVE
from controlplane.storage.sql import Database


def gauged_pools(db: Database) -> list[tuple[str, str]]:
    """(pool id, owner) of every pool that is not archived or still holds a node."""
    found = db.execute(
        "SELECT id, owner_tenant_id FROM pools WHERE archived_at IS NULL "
        "OR id IN (SELECT pool_id FROM nodes WHERE removed_at IS NULL) ORDER BY id"
    ).fetchall()
    return [(pool_id, owner) for pool_id, owner in found]


def nodes_by_state(db: Database) -> list[tuple[str, str, int]]:
    """(pool id, state, nodes) over the nodes not removed."""
    found = db.execute(
        "SELECT pool_id, state, count(*) FROM nodes WHERE removed_at IS NULL "
        "GROUP BY pool_id, state"
    ).fetchall()
    return [(pool_id, state, int(n)) for pool_id, state, n in found]


def live_reservations_by_state(db: Database) -> list[tuple[str, str, int]]:
    """(pool id, state, reservations) over pending, placed and active reservations."""
    found = db.execute(
        f"SELECT pool_id, state, count(*) FROM reservations "
        f"WHERE state IN ({', '.join('?' * len(LIVE))}) GROUP BY pool_id, state",
        LIVE,
    ).fetchall()
    return [(pool_id, state, int(n)) for pool_id, state, n in found]
