"""The reconciler: every --reconcile-interval, one pass over the fleet in one writer transaction:
lost nodes, stale nodes' rows and atoms (each in its own savepoint, R5),
then the placer's retries and placed → active. It sits on top of capacity/, and counts in
metrics what the passes it runs return.

Liveness: reports stamp memory only. Every replica writes its nodes' stamps to its
liveness store (storage/liveness.py), off the writer, each about every sixth of the grace
period (``STAMPS_PER_GRACE``); before the leader's pass that store finds, also off the writer, the nodes with no
stamp in the grace period, and the pass marks lost those of them that memory has not seen
either. So the writer spends nothing on the stamps of live nodes. No node is marked lost
during the first grace period after a start, when memory has not seen the fleet yet, nor
after a replica takes the lead, when flushes from the others may be on their way (B4), nor
within a grace period of any replica being behind (F10, controlplane/overload.py: shedding,
503s, a late loop, a long pass, a failed flush, a start), which each replica records beside
its stamps: silence the control plane caused is never counted against a node.
"""

import asyncio
import functools
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import structlog

from controlplane.capacity.bookings import Placement, retry_pending
from controlplane.capacity.handover import fail_undelivered
from controlplane.capacity.liveness import STAMPS_PER_GRACE, Liveness
from controlplane.capacity.nodes import Failed, isolated, reconcile_isolated
from controlplane.capacity.states import node_event, progress_drain
from controlplane.metrics import Metrics, count_placement
from controlplane.overload import Overload
from controlplane.services.offers import expire_offer
from controlplane.services.reservations import end_timed_up
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import Store, now, timestamp
from controlplane.storage.leader import Leadership, NotLeading
from controlplane.storage.liveness import LivenessStore
from controlplane.storage.sql import Database

log = structlog.get_logger("controlplane.reconciler")
# F10: a loop that wakes this late, or a pass this much over its interval, is behind
LAG_BOUND_S = 1.0
T = TypeVar("T")


@dataclass
class PassStats:
    nodes_recomputed: int = 0
    rows_written: int = 0
    nodes_lost: int = 0
    stamps_written: int = 0  # alive but stored as old: handed to the next flush (off the writer)
    reservations_moved: int = 0
    failures: int = 0  # nodes and reservations that could not be reconciled (R5)

    @property
    def written(self) -> int:
        """M1 bc_reconcile_rows_written: rows and atoms, stamps, lost nodes and moves."""
        return self.rows_written + self.stamps_written + self.nodes_lost + self.reservations_moved


def mark_silent(
    db: Database,
    liveness: Liveness,
    lost_after: float,
    may_mark_lost: bool,
    candidates: Sequence[str] | None,
) -> tuple[int, int]:
    """The pass's liveness part, in the writer: (stamps owed, nodes marked lost). Of the nodes
    whose stored stamps are older than the grace period (among ``candidates``), those memory
    saw since are alive, their stamps handed to the next flush; the others are lost."""
    cutoff = time.time() - lost_after
    seen, silent = [], []
    for node in node_sql.silent_nodes(db, timestamp(cutoff), candidates):
        last = liveness.last_epoch(node.id)
        if last is not None and last >= cutoff:
            seen.append(node.id)
        elif may_mark_lost:
            # a stored stamp later than the row's is when it was last seen
            at = node.last_seen_at if last is None else max(node.last_seen_at, timestamp(last))
            silent.append((node, at))
    liveness.owe(seen)
    node_sql.mark_lost(db, [node.id for node, _ in silent], now())
    # A lost node's bookings are marked, not silently freed: they run on if it comes back.
    node_sql.mark_bookings_lost(db, [node.id for node, _ in silent])
    for node, at in silent:
        node_event(db, "lost", node, node.owner_tenant_id, lastSeenAt=at)
    return len(seen), len(silent)


def reconcile_pass(
    db: Database,
    liveness: Liveness,
    lost_after: float,
    may_mark_lost: bool,
    candidates: Sequence[str] | None = None,
) -> PassStats:
    """One pass: mark silent nodes lost, recompute stale nodes, the placer's retries.
    ``candidates``: the nodes that the liveness store found silent, off the writer
    (run_reconciler's check); without them the pass reads every node's ``last_seen_at``."""
    stats = PassStats()
    stats.stamps_written, stats.nodes_lost = mark_silent(
        db, liveness, lost_after, may_mark_lost, candidates
    )
    for row in node_sql.stale_nodes(db):
        done = reconcile_isolated(db, row)
        if isinstance(done, Failed):
            stats.failures += 1
        else:
            stats.rows_written += done.writes
            stats.nodes_recomputed += 1
    # After the rows, so new capacity places first; each reservation in its own savepoint.
    at, clock = now(), time.time()
    tries = [
        isolated(db, "reservation", r.id, retry_pending, db, r, at) for r in res_sql.pending(db)
    ]
    for tried in tries:
        if isinstance(tried, Placement):
            count_placement(tried)
    moves = [
        *(t if isinstance(t, Failed) else t is not Placement.NOT_PLACED for t in tries),
        *(
            isolated(db, "reservation", r.id, fail_undelivered, db, r, clock)
            for r in res_sql.undelivered(db)
        ),
    ]
    # H3: draining nodes, once the retries above could no longer land on them.
    moves += [
        isolated(db, "node", r.node.id, progress_drain, db, r.node, r.pool.owner_tenant_id)
        for r in node_sql.draining(db)
    ]
    stats.reservations_moved += sum(1 for moved in moves if moved is True)
    stats.failures += sum(1 for moved in moves if isinstance(moved, Failed))
    return stats


@dataclass
class Ended:
    """What one pass of ends did (C3, C4)."""

    offers: int = 0  # offers withdrawn because their notAfter passed
    reservations: int = 0  # reservations ended TimeUp
    failures: int = 0


def end_terms(db: Database) -> Ended:
    """C3, C4: withdraw every offer whose end has passed, exactly as pools/unoffer does, and
    end every reservation whose duration ran out (TimeUp); each in its own savepoint (R5)."""
    at, ended = now(), Ended()
    for offer in pool_sql.ended_offers(db, at):
        done = isolated(db, "offer", offer.pool_id, expire_offer, db, offer)
        ended.offers += done is True
        ended.failures += isinstance(done, Failed)
    for row in res_sql.timed_up(db, at):
        done = isolated(db, "reservation", row.id, end_timed_up, db, row)
        ended.reservations += done is True
        ended.failures += isinstance(done, Failed)
    return ended


async def run_reconciler(
    store: Store,
    liveness: Liveness,
    interval: float,
    lost_after: float,
    started: float,
    metrics: Metrics,
    leadership: Leadership,
    overload: Overload | None = None,
) -> None:
    """Every ``interval`` seconds: on every replica a flush of the liveness stamps of the
    nodes that report to it, off the writer, so the leader's lost-node check sees them (B4),
    and of when it was last behind (F10); then on the leader one pass (a failed pass is
    logged and the next one retries). The liveness store is open while this runs."""
    stamps = LivenessStore(store.location, store.db_timeout)
    liveness.stored = stamps
    overload = overload or Overload()
    leading_since, following = started, False
    recorded = 0.0  # the last behind time this replica stored
    try:
        while True:
            if overload.behind_at > recorded:
                try:  # first of all at a start: the leader gives every node a grace period
                    await stamps.run(stamps.record_behind, leadership.holder, overload.behind_at)
                    recorded = overload.behind_at
                except Exception:
                    log.exception("could not record that this replica is behind")
            # a follower looks every half interval: a dead leader's lease (1.5 intervals) is
            # taken within two (F2)
            pause = interval if leadership.leader else interval / 2
            woken = time.monotonic() + pause
            await asyncio.sleep(pause)
            if time.monotonic() - woken > LAG_BOUND_S:
                overload.behind()  # the loop itself is late: so may its reports' answers be
            try:
                await stamps.run(flush, stamps, liveness, lost_after / STAMPS_PER_GRACE)
            except Exception:
                overload.behind()  # its nodes' stamps are not where the leader looks
                log.exception("liveness flush failed")
            # F2: its check is a database call, never on the event loop
            if not await asyncio.to_thread(leadership.holds):
                following = True
                continue
            if following:  # B4: taking the lead waits a grace period, as a start does
                leading_since, following = time.monotonic(), False
            may_mark_lost = time.monotonic() - leading_since >= lost_after
            candidates: list[str] = []
            if may_mark_lost:
                cutoff = time.time() - lost_after
                try:
                    behind = await stamps.run(stamps.last_behind, cutoff)
                    # F10: a grace period with no replica behind (this one included)
                    may_mark_lost = behind is None and overload.behind_at < cutoff
                    if may_mark_lost:
                        candidates = await stamps.run(stamps.silent, cutoff)
                except Exception:
                    may_mark_lost = False
                    log.exception("lost-node check failed; no node is marked lost in this pass")
            work = functools.partial(
                reconcile_pass,
                liveness=liveness,
                lost_after=lost_after,
                may_mark_lost=may_mark_lost,
                candidates=candidates,
            )
            began = time.monotonic()
            try:
                with metrics.reconcile_seconds.time():
                    stats = await store.write(functools.partial(fenced, leadership, work))
            except NotLeading as exc:  # F2: another replica took over; this pass wrote nothing
                log.warning("not leading any more; the pass wrote nothing", reason=str(exc))
                following = True
                continue
            except Exception:
                metrics.reconcile_failures.inc()
                log.exception("reconciler pass failed")
                continue
            if time.monotonic() - began > interval + LAG_BOUND_S:
                overload.behind()  # reports waited on the writer behind this pass
            try:  # C3, C4: in a transaction of its own, behind the same lease
                ended = await store.write(functools.partial(fenced, leadership, end_terms))
            except NotLeading:
                following = True
                continue
            except Exception:
                metrics.reconcile_failures.inc()
                log.exception("ending offers and reservations failed")
                ended = Ended()
            metrics.reconcile_failures.inc(stats.failures + ended.failures)
            metrics.rows_written.inc(stats.written)
            if ended.offers or ended.reservations:
                log.info("ended", offers=ended.offers, reservations=ended.reservations)
            if stats.nodes_recomputed or stats.nodes_lost or stats.reservations_moved:
                log.info(
                    "reconciled",
                    nodes=stats.nodes_recomputed,
                    rows_written=stats.rows_written,
                    lost=stats.nodes_lost,
                    stamps=stats.stamps_written,
                )
    finally:
        liveness.stored = None
        stamps.close()


def fenced(leadership: Leadership, work: Callable[[Database], T], db: Database) -> T:
    """The pass in its transaction, behind this replica's lease (F2)."""
    leadership.fence(db)
    return work(db)


def flush(stamps: LivenessStore, liveness: Liveness, every: float) -> None:
    """Write the due stamps (``Liveness.due``) to the liveness store, on its thread; those of
    a flush that fails are due again at the next."""
    due = liveness.due(every)
    try:
        stamps.write(due)
    except Exception:
        liveness.owe(due)
        raise
