"""Admission plus placement in a pool of many nodes: reservations/create latency and placements/s.

Run: ``.venv/bin/python bench/reservations.py [--nodes 10000] [--creates 2000]``

A real SQLite database in a temporary directory holds one pool (hostReserve {8, 64},
overcommit {vcpu: 2}) of N nodes with the recorded DGX H100's inventory; one reconciler
pass gives them their rows and 8 GPU atoms each. Then, on the real service code
(`create_reservation`: IAM, quota, admission, first-fit placement, all in one writer
transaction, awaited like an HTTP handler awaits it), it times N creates asking
`{gpu: 1, vcpu: 8}` one after the other, as the pool fills from its first nodes.
Baseline in the same run: an empty write transaction through the same writer (the
least any mutation costs). Target: p99 under 10 ms.
"""

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from reconciler import populate  # bench/reconciler.py: the same 100k-node builder

from controlplane.api.dispatch import invoke
from controlplane.api.routes import ALL_METHODS
from controlplane.capacity.liveness import Liveness
from controlplane.iam.decide import Principal
from controlplane.reconciler import reconcile_pass
from controlplane.services.call import Env
from controlplane.storage.db import Store, now
from shared import schemas as s

ROOT = Principal("bench", "root", None)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q / 100))]


async def measure(store: Store, creates: int) -> tuple[list[float], list[float], int]:
    baseline, latencies, placed = [], [], 0
    for _ in range(200):
        started = time.perf_counter()
        await store.write(lambda db: None)
        baseline.append(time.perf_counter() - started)
    ask = s.ReservationsCreate(
        tenant_id="root", pool_id="pool_1", resources=s.ReservationResources(gpu=1, vcpu=8)
    )
    create = next(m for m in ALL_METHODS if m.path.endswith("/reservations/create"))
    env = Env(Liveness())
    for _ in range(creates):
        started = time.perf_counter()
        answer = await invoke(create, store, env, ROOT, ask)
        latencies.append(time.perf_counter() - started)
        placed += answer.state == "placed"
    return baseline, latencies, placed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--creates", type=int, default=2_000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-reservations-") as tmp:
        store = Store(Path(tmp) / "bc.db")
        populate(store, args.nodes)
        store.transact(
            lambda db: db.execute(
                "INSERT INTO quotas (pool_id, tenant_id, resource, max, used, updated_at) "
                "VALUES ('pool_1', 'root', 'gpu', 1000000, 0, ?), ('pool_1', 'root', 'vcpu', 10000000, 0, ?)",
                [now(), now()],
            )
        )
        store.transact(
            lambda db: db.execute(
                "INSERT INTO pool_authz (tenant_id, pool_id, gpu_model, class, sharing, region, owned) "
                "VALUES ('root', 'pool_1', 'H100', 'metal-host', 'exclusive', 'eu', 1)"
            )
        )
        started = time.perf_counter()
        store.transact(lambda db: reconcile_pass(db, Liveness(), 3600, True))
        # H1: each node's agent reports its NodeSpec applied, so every node is ready.
        store.transact(
            lambda db: db.execute(
                "UPDATE nodes SET state = 'ready', state_reason = NULL, "
                "applied_version = spec_version, "
                "applied = json_object('version', spec_version, 'units', json('[]'))"
            )
        )
        print(f"{args.nodes} nodes with rows and atoms in {time.perf_counter() - started:.1f} s")
        started = time.perf_counter()
        baseline, latencies, placed = asyncio.run(measure(store, args.creates))
        elapsed = sum(latencies)
        store.close()
    print(f"{'':<34} {'p50 ms':>8} {'p99 ms':>8}")
    print(
        f"{'empty write transaction (baseline)':<34} {statistics.median(baseline) * 1000:>8.2f} {percentile(baseline, 99) * 1000:>8.2f}"
    )
    print(
        f"{'reservations/create (admit+place)':<34} {statistics.median(latencies) * 1000:>8.2f} {percentile(latencies, 99) * 1000:>8.2f}"
    )
    print(f"placed {placed} of {args.creates}: {placed / elapsed:.0f} placements/s")
    p99 = percentile(latencies, 99) * 1000
    print(f"reservations/create p99 < 10 ms: {'PASS' if p99 < 10 else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
