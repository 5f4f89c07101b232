"""What durability costs per write: synchronous=FULL (the default, R7) beside NORMAL (relaxed).

Run: ``.venv/bin/python bench/durability.py [--writes 2000] [--rounds 5]``

Two real SQLite databases in WAL mode in one temporary directory on this machine's disk,
one opened ``--durability full`` and one ``relaxed``, each behind the real ``Store``
writer thread. A write is one real mutation as the API makes it: a site insert and its
event, in one ``BEGIN IMMEDIATE`` transaction, awaited as a handler awaits it. Rounds
interleave the two (full, relaxed, full, …) so both see the same disk and noise; the
figure is the per-write p50/p99 of each and the ratio full / relaxed of the medians.
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from controlplane.storage import events
from controlplane.storage import iam as iam_sql
from controlplane.storage import sites as site_sql
from controlplane.storage.db import Durability, Store, now
from controlplane.storage.sql import Database
from shared.ids import new_id


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


def add_site(db: Database) -> None:
    site_id = new_id("site")
    site_sql.insert_site(
        db,
        {
            "id": site_id,
            "owner_tenant_id": "bench",
            "name": site_id[-20:],
            "region": "eu",
            "kind": "custom",
            "created_at": now(),
        },
    )
    events.append(db, "site.created", pool_id=None, data={"siteId": site_id}, audience=["bench"])


async def writes(store: Store, count: int) -> list[float]:
    latencies = []
    for _ in range(count):
        started = time.perf_counter()
        await store.write(add_site)
        latencies.append(time.perf_counter() - started)
    return latencies


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--writes", type=int, default=2000, help="writes per round and mode")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
        stores: dict[Durability, Store] = {}
        for mode in ("full", "relaxed"):
            store = Store(Path(tmp) / f"{mode}.db", mode)  # type: ignore[arg-type]
            store.transact(lambda db: iam_sql.insert_tenant(db, "bench", None, None, now()))
            stores[mode] = store  # type: ignore[index]
        seen: dict[str, list[float]] = {"full": [], "relaxed": []}
        ratios = []
        try:
            for _ in range(args.rounds):
                medians = {}
                for mode, store in stores.items():
                    got = asyncio.run(writes(store, args.writes))
                    seen[mode] += got
                    medians[mode] = statistics.median(got)
                ratios.append(medians["full"] / medians["relaxed"])
        finally:
            for store in stores.values():
                store.close()
    print(f"durability: {args.rounds} rounds × {args.writes} writes per mode (site + event)")
    for mode, got in seen.items():
        print(
            f"  {mode:8s} p50 {percentile(got, 50) * 1000:.3f} ms  "
            f"p99 {percentile(got, 99) * 1000:.3f} ms  {len(got) / sum(got):.0f} writes/s"
        )
    extra = (percentile(seen["full"], 50) - percentile(seen["relaxed"], 50)) * 1e6
    print(
        f"  full / relaxed (median of per-round median ratios): {statistics.median(ratios):.2f}×,"
        f" +{extra:.0f} µs per write at p50"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
