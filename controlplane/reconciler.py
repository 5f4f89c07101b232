"""The reconciler: every --reconcile-interval, one pass over the fleet in one writer transaction:
liveness stamps and lost nodes, stale nodes' rows and atoms (each in its own savepoint, R5),
then the placer's retries and placed → active. It sits on top of capacity/ and services/.

Liveness: reports stamp memory only. A pass looks at the nodes whose stored
stamp is older than the grace period; those seen since (in memory) get their
stamp written, the others are lost. So a live node's stamp is written about
once per grace period, and none at all in a pass where no stamp is that old.
No node is marked lost during the first grace period after a start, when
memory has not seen the fleet yet.
"""

import asyncio
import functools
import time
from dataclasses import dataclass

import structlog
from prometheus_client import Counter

from controlplane.capacity.bookings import activate, retry_pending
from controlplane.capacity.liveness import Liveness
from controlplane.capacity.nodes import Failed, isolated, reconcile_isolated
from controlplane.services.node_ops import progress_drain
from controlplane.storage import events
from controlplane.storage import nodes as node_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import Store, now, timestamp
from controlplane.storage.leader import Leadership
from controlplane.storage.sql import Database

log = structlog.get_logger("controlplane.reconciler")


@dataclass
class PassStats:
    nodes_recomputed: int = 0
    rows_written: int = 0
    nodes_lost: int = 0
    stamps_written: int = 0
    reservations_moved: int = 0
    failures: int = 0  # nodes and reservations that could not be reconciled (R5)


def reconcile_pass(
    db: Database, liveness: Liveness, lost_after: float, may_mark_lost: bool
) -> PassStats:
    """One pass: refresh old liveness stamps, mark silent nodes lost, recompute stale nodes."""
    stats = PassStats()
    cutoff = time.time() - lost_after
    seen, silent = [], []
    for node in node_sql.silent_nodes(db, timestamp(cutoff)):
        last = liveness.last_epoch(node["id"])
        if last is not None and last >= cutoff:
            seen.append((timestamp(last), node["id"]))
        elif may_mark_lost:
            silent.append(node)
    node_sql.touch(db, seen)
    stats.stamps_written = len(seen)
    node_sql.mark_lost(db, [node["id"] for node in silent], now())
    # A lost node's bookings are marked, not silently freed: they run on if it comes back.
    node_sql.mark_bookings_lost(db, [node["id"] for node in silent])
    for node in silent:
        events.append(
            db,
            "node.lost",
            pool_id=node["pool_id"],
            data={
                "nodeId": node["id"],
                "hostname": node["hostname"],
                "lastSeenAt": node["last_seen_at"],
            },
            audience=[node["owner_tenant_id"]],
        )
    stats.nodes_lost = len(silent)
    for node in node_sql.stale_nodes(db):
        written = reconcile_isolated(db, node)
        if isinstance(written, Failed):
            stats.failures += 1
        else:
            stats.rows_written += written
            stats.nodes_recomputed += 1
    # After the rows, so new capacity places first; each reservation in its own savepoint.
    at = now()
    moves = [
        *(isolated(db, "reservation", r.id, retry_pending, db, r, at) for r in res_sql.pending(db)),
        *(
            isolated(db, "reservation", r.id, activate, db, r, liveness.last_epoch)
            for r in res_sql.placed(db)
        ),
    ]
    # H3: draining nodes, once the retries above could no longer land on them.
    moves += [isolated(db, "node", n["id"], progress_drain, db, n) for n in node_sql.draining(db)]
    stats.reservations_moved += sum(1 for moved in moves if moved is True)
    stats.failures += sum(1 for moved in moves if isinstance(moved, Failed))
    return stats


async def run_reconciler(
    store: Store,
    liveness: Liveness,
    interval: float,
    lost_after: float,
    started: float,
    failures: Counter,
    leadership: Leadership,
) -> None:
    """Every ``interval`` seconds, one pass on the leader; a failed pass is logged and the
    next one retries. A replica that does not lead writes the liveness stamps of the nodes
    that report to it, so the leader's lost-node check sees them (B4)."""
    while True:
        await asyncio.sleep(interval)
        if not leadership.holds():
            due = liveness.due(lost_after / 3)
            if due:
                try:
                    await store.write(functools.partial(node_sql.touch, seen=due))
                except Exception:
                    log.exception("liveness flush failed")
            continue
        may_mark_lost = time.monotonic() - started >= lost_after
        work = functools.partial(
            reconcile_pass, liveness=liveness, lost_after=lost_after, may_mark_lost=may_mark_lost
        )
        try:
            stats = await store.write(work)
        except Exception:
            failures.inc()
            log.exception("reconciler pass failed")
            continue
        failures.inc(stats.failures)
        if stats.nodes_recomputed or stats.nodes_lost or stats.reservations_moved:
            log.info(
                "reconciled",
                nodes=stats.nodes_recomputed,
                rows_written=stats.rows_written,
                lost=stats.nodes_lost,
                stamps=stats.stamps_written,
            )
