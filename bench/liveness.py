"""Node liveness at fleet scale: what the stamps of 100,000 reporting nodes cost the writer.

Run: ``.venv/bin/python bench/liveness.py [--nodes 100000] [--rounds 5] [--postgres [URL]]``

Builds a real SQLite database with bench/reconciler.py's ``populate`` (one pool, N nodes with
the recorded DGX H100's inventory: the wide ``nodes`` rows), whose rows' stamps are old (the
nodes joined long ago), and a ``Liveness`` in which every node has reported since, its stamp
due. Then, in interleaved rounds, per reconcile pass:

a. writer: the pass's liveness part in a writer transaction (``mark_silent`` over the nodes
   the check below found silent: none, as all report) — what liveness costs the writer now;
b. off the writer: ``Liveness.due`` (memory; the daemon runs it on the liveness store's
   thread), the write of the N due stamps to the liveness store (one statement, commits not
   synced: the stamps are disposable), and the check that finds the silent nodes (one join);
c. baseline, the old way: the same N stamps as ``executemany UPDATE nodes SET last_seen_at``
   in a writer transaction, its commit synced as every mutation's (R7), with stamps that keep
   the rows older than the grace period, so the check of (b) still has every row to look at;
d. a one-row mutation issued just after a flush starts: how long it waits for the writer,
   with the flush the old way (queued on the writer) and the new (beside it).

Prints each figure's range and median over the rounds and the ratios old / new. The target
(DESIGN §9, lost nodes at fleet scale): writer time for liveness per pass under 100 ms at 100,000 nodes.

``--postgres`` runs the same on PostgreSQL too: on URL's database (it must be empty), or
without one on a throwaway server (the test harness's tests/postgres.py). There each round's
baseline leaves 100,000 dead row versions that the daemon no longer makes; a VACUUM after it
(untimed) gives the check the table as autovacuum keeps it.
"""

import argparse
import asyncio
import functools
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from reconciler import populate  # noqa: E402

from controlplane.capacity.liveness import Liveness  # noqa: E402
from controlplane.reconciler import mark_silent  # noqa: E402
from controlplane.storage.db import Store, connect, now  # noqa: E402
from controlplane.storage.liveness import LivenessStore  # noqa: E402
from controlplane.storage.sql import Database  # noqa: E402
from tests.postgres import PostgresServer  # noqa: E402

LOST_AFTER = 90.0  # the daemon's default --node-lost-after
TARGET_S = 0.100


def old_flush(stamps: list[tuple[str, str]]) -> Callable[[Database], None]:
    """The old way: every due stamp written to its node's row, in the writer."""
    return lambda db: db.executemany("UPDATE nodes SET last_seen_at = ? WHERE id = ?", stamps)


def one_row(db: Database) -> None:
    db.execute("UPDATE pools SET updated_at = ? WHERE id = 'pool_1'", [now()])


def timed(fn: Callable[..., Any], *args: Any) -> float:
    started = time.perf_counter()
    fn(*args)
    return time.perf_counter() - started


async def waits(store: Store, flush: Callable[[], Any]) -> float:
    """Seconds a one-row mutation issued just after ``flush`` started waits to commit."""
    flushing = asyncio.ensure_future(flush())
    await asyncio.sleep(0.005)  # the flush is under way
    started = time.perf_counter()
    await store.write(one_row)
    waited = time.perf_counter() - started
    await flushing
    return waited


def measure(location: str | Path, nodes: int, rounds: int) -> dict[str, list[float]]:
    store = Store(location)
    started = time.perf_counter()
    populate(store, nodes)
    print(f"  populated {nodes} nodes in {time.perf_counter() - started:.1f} s", flush=True)
    store.transact(
        lambda db: db.execute("UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z'")
    )
    ids = [row[0] for row in store.reader.execute("SELECT id FROM nodes")]
    stamps, liveness = LivenessStore(location), Liveness()
    vacuum = connect(location) if store.postgres else None
    liveness.stored = stamps
    figures: dict[str, list[float]] = {}

    def keep(name: str, seconds: float) -> None:
        figures.setdefault(name, []).append(seconds)

    try:
        for r in range(rounds):
            old = [(f"2000-01-01T00:00:{r % 60:02d}.000Z", node_id) for node_id in ids]
            keep("c. old: writer, UPDATE nodes", timed(store.transact, old_flush(old)))
            if vacuum is not None:  # the rows as autovacuum keeps them when nothing rewrites them
                vacuum.execute("VACUUM ANALYZE nodes")
            for node_id in ids:
                liveness.seen(node_id)
            started = time.perf_counter()
            due = liveness.due(0)
            keep("b. new: Liveness.due (memory)", time.perf_counter() - started)
            batch = {node_id: at + r for node_id, at in due.items()}  # each round's are later
            keep("b. new: flush, off the writer", timed(stamps.write, batch))
            started = time.perf_counter()
            silent = stamps.silent(time.time() - LOST_AFTER)
            keep("b. new: check, off the writer", time.perf_counter() - started)
            assert not silent, f"{len(silent)} nodes found silent"
            part = functools.partial(
                mark_silent,
                liveness=liveness,
                lost_after=LOST_AFTER,
                may_mark_lost=True,
                candidates=silent,
            )
            keep("a. new: writer, the pass's part", timed(store.transact, part))
            flushes = {
                "old": functools.partial(store.write, old_flush(old)),
                "new": functools.partial(stamps.run, stamps.write, batch),
            }
            for way, flush in flushes.items():
                keep(f"d. {way}: a mutation waits", asyncio.run(waits(store, flush)))
    finally:
        liveness.stored = None
        stamps.close()
        store.close()
        if vacuum is not None:
            vacuum.close()
    return figures


def report(backend: str, figures: dict[str, list[float]]) -> bool:
    print(f"{backend}: {'figure':<34} {'min ms':>9} {'median':>9} {'max ms':>9}")
    for name, values in sorted(figures.items()):
        low, mid, high = min(values), statistics.median(values), max(values)
        print(f"{backend}: {name:<34} {low * 1e3:>9.2f} {mid * 1e3:>9.2f} {high * 1e3:>9.2f}")
    median = {name: statistics.median(values) for name, values in figures.items()}
    writer_new, writer_old = (
        median["a. new: writer, the pass's part"],
        median["c. old: writer, UPDATE nodes"],
    )
    print(
        f"{backend}: writer time for liveness per pass: new {writer_new * 1e3:.2f} ms, old "
        f"{writer_old * 1e3:.1f} ms: old/new {writer_old / writer_new:.0f}x"
    )
    flush_new = median["b. new: flush, off the writer"] + median["b. new: check, off the writer"]
    print(
        f"{backend}: off the writer, flush + check {flush_new * 1e3:.1f} ms: "
        f"{writer_old / flush_new:.1f}x faster than the old flush, and beside mutations"
    )
    waited_old, waited_new = median["d. old: a mutation waits"], median["d. new: a mutation waits"]
    print(
        f"{backend}: a mutation during a flush waits {waited_new * 1e3:.2f} ms (old way "
        f"{waited_old * 1e3:.1f} ms: old/new {waited_old / waited_new:.0f}x)"
    )
    ok = writer_new < TARGET_S
    print(f"{backend}: writer time < {TARGET_S * 1e3:.0f} ms: {'PASS' if ok else 'FAIL'}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--postgres", nargs="?", const="", metavar="URL")
    args = parser.parse_args()
    print(f"liveness: {args.nodes} nodes, {args.rounds} rounds, --node-lost-after {LOST_AFTER}")
    with tempfile.TemporaryDirectory(prefix="bench-liveness-") as tmp:
        ok = report("sqlite", measure(Path(tmp) / "bc.db", args.nodes, args.rounds))
    if args.postgres is not None:
        server = None if args.postgres else PostgresServer()
        if server is not None:
            server.start()
        try:
            url = args.postgres if server is None else server.new_database()
            ok = report("postgresql", measure(url, args.nodes, args.rounds)) and ok
        finally:
            if server is not None:
                server.stop()
    print(f"liveness: {'PASS' if ok else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
