"""A simulated day of 1/2/4/8-GPU bookings: bin-packing with topology against first fit.

Run: ``.venv/bin/python bench/packing.py [--quick] [--hosts 100] [--arrivals 2000]
[--load 1.0] [--patience 900] [--seed 7] [--days 1] [--fleet dgx|l40s|both]``

A real SQLite database in a temporary directory holds a pool of ``--hosts`` hosts joined
and reported ready through the real service code (``nodes/join``, ``nodes/report``), each
the recorded DGX H100 (8 GPUs, all NVSwitch-joined, on two NUMA nodes) made its own
machine (machine id, hostname, GPU UUIDs). Requests arrive as a seeded Poisson process,
``--arrivals`` in a simulated day after 6 h of warm-up arrivals that fill the fleet (not
counted), asking ``{gpu: n, vcpu: 16 n}`` with n = 1, 2, 4, 8 (40/25/20/15 %), each held
for an exponentially drawn time (at least 5 min) set so the requests ask ``--load`` of the
fleet's GPU time. The pool books vCPUs as exclusive cores (no vCPU overcommit, D3). Every
event goes through the service code in process (``controlplane.api.dispatch.invoke``) as
the tenant and the host's agent would call it:

- an arrival is ``reservations/create``; a placed one is delivered by its host
  (``nodes/report`` with the booking ``delivered``); one not placed waits in the placer's
  queue, and after ``--patience`` simulated seconds still pending the tenant ends it;
- an end is ``reservations/end``, then the host reports the booking ``released``
  (``nodes/report``), so its GPUs and CPUs return (D7), then, while requests wait, one
  reconciler pass (the placer's retries, oldest first).

The same arrivals run twice, each on a fresh fleet: the pool's ``placement.topology:
preferred`` (D2: within a page of the fullest nodes that fit, the node whose best GPU set
ranks best, then the fewest free GPUs: bin-packing) and ``none`` (first fit by node id and
GPU index). Printed side by side with their ratio: whole-host (8-GPU) requests placed at
arrival and placed at all (waiting included), all requests placed, multi-GPU bookings all
on one NVLink domain (every DGX H100 set is, through NVSwitch) and on one NUMA node (the
telling topology figure), pinned CPUs on their GPUs' NUMA nodes, the fleet's GPU
utilization and the run time. ``--fleet l40s`` runs the 4-GPU-host variant on the recorded
L40S host (PCIe, no NVLink, two NUMA nodes) with 1/2/4-GPU requests (45/30/25 %); ``both``
(the default) runs the two. ``--days N`` sums N independent days (seeds) for a steadier
ratio.

Target (D9): bin-packing places more whole-host requests at arrival than first fit (ratio
> 1; waiting lets either policy catch up as hosts drain, so that figure is printed too).
The default run takes about two minutes on 2 cores; ``--quick`` (20 DGX hosts, 400
arrivals) a few seconds.
"""

import argparse
import asyncio
import heapq
import random
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from agent.inventory import collect_inventory
from controlplane.api.dispatch import invoke
from controlplane.api.routes import ALL_METHODS
from controlplane.capacity.liveness import Liveness
from controlplane.iam.decide import Principal
from controlplane.reconciler import reconcile_pass
from controlplane.services import iam, reports
from controlplane.services.call import Caller, Env
from controlplane.storage.db import Store
from controlplane.storage.node_types import NodeRow
from shared import cpulist
from shared import schemas as s
from shared.inventory import Inventory

FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
ROOT = Principal("bench", "root", None)
METHODS = {
    method.path.rsplit("/", 2)[-2] + "/" + method.path.rsplit("/", 1)[-1]: method
    for method in ALL_METHODS
}
DAY = 86_400.0
WARMUP = 6 * 3600.0  # arrivals before the day fill the fleet; they are not counted
VCPU_PER_GPU = 16
MODES = ("preferred", "none")


@dataclass(frozen=True)
class Fleet:
    name: str
    fixture_host: str
    gpu_model: str
    sizes: dict[int, float]  # GPUs asked: share of the requests


FLEETS = {
    "dgx": Fleet(
        "DGX H100 (8 GPUs, NVSwitch, 2 NUMA)",
        "dgx-h100-01",
        "H100",
        {1: 0.40, 2: 0.25, 4: 0.20, 8: 0.15},
    ),
    "l40s": Fleet(
        "L40S (4 GPUs, PCIe, 2 NUMA)", "l40s-node-03", "L40S", {1: 0.45, 2: 0.30, 4: 0.25}
    ),
}


@dataclass(frozen=True)
class Request:
    at: float  # simulated seconds from the start of the day (negative: warm-up)
    gpus: int
    duration: float


def arrivals(
    fleet: Fleet, count: int, hosts: int, gpus_per_host: int, load: float, seed: int
) -> list[Request]:
    """``count`` arrivals a day (Poisson), plus the warm-up's, sized and timed so that the
    requests offer ``load`` of the fleet's GPUs on average."""
    rng = random.Random(seed)
    rate = count / DAY
    sizes, weights = list(fleet.sizes), list(fleet.sizes.values())
    mean_size = sum(n * w for n, w in fleet.sizes.items()) / sum(weights)
    mean_duration = load * hosts * gpus_per_host / (rate * mean_size)
    made: list[Request] = []
    at = -WARMUP
    while True:
        at += rng.expovariate(rate)
        if at >= DAY:
            return made
        size = rng.choices(sizes, weights)[0]
        made.append(Request(at, size, max(300.0, rng.expovariate(1 / mean_duration))))


async def call(store: Store, env: Env, method: str, caller: Caller, body: Any) -> Any:
    """A method in process, decided as a request is (``group/verb``)."""
    return await invoke(METHODS[method], store, env, caller, body)


@dataclass
class Host:
    node: NodeRow  # the node's authenticated row, as the report handler gets it
    token: str
    inventory: Inventory


def machine(base: Inventory, n: int) -> Inventory:
    """The recorded host made its own machine: machine id, hostname and GPU UUIDs."""
    gpus = [
        msgspec.structs.replace(g, uuid=f"GPU-{n:08x}-0000-0000-0000-{i:012x}")
        for i, g in enumerate(base.gpus)
    ]
    return msgspec.structs.replace(
        base, machine_id=f"m{n:04d}", hostname=f"host-{n:04d}", gpus=gpus
    )


async def host_reports(
    store: Store,
    env: Env,
    host: Host,
    bookings: Sequence[s.BookingReport] | None = None,
    applied: bool = False,
) -> None:
    """The host's agent reports: its spec applied (``applied``) or what it did with bookings."""
    body: dict[str, Any] = {"node_id": host.node.id, "inventory": host.inventory}
    if applied:
        spec = await call(store, env, "nodes/spec", host.node, s.NodesSpec(node_id=host.node.id))
        units = [{"id": u.id, "status": "applied"} for u in spec.units]
        body["applied"] = {"version": spec.version, "units": units}
    if bookings is not None:
        body["bookings"] = list(bookings)
    await call(store, env, "nodes/report", host.node, s.NodesReport(**body))
    with store.snapshot() as db:
        host.node = reports.authenticate_node(db, host.token) or host.node


async def fleet_of(
    store: Store, env: Env, tmp: Path, fleet: Fleet, hosts: int, mode: str
) -> tuple[str, dict[str, Host], int]:
    """The pool (its placement mode), its hosts joined and ready; the pool id, the hosts by
    node id and the GPUs per host."""
    iam.bootstrap(store, tmp / "root.token")
    site = await call(
        store,
        env,
        "sites/create",
        ROOT,
        s.SitesCreate(tenant_id="root", name="f", region="r", kind="shared"),
    )
    policy = {"hostReserve": {"vcpu": 8, "memoryGiB": 64}, "placement": {"topology": mode}}
    pool = await call(
        store,
        env,
        "pools/create",
        ROOT,
        s.PoolsCreate(
            tenant_id="root",
            site_id=site.id,
            pool_class="metal-host",
            gpu_model=fleet.gpu_model,
            policy=policy,
            owner_quota={"gpu": 1_000_000, "vcpu": 100_000_000},
        ),
    )
    token = await call(
        store,
        env,
        "joinTokens/create",
        ROOT,
        s.JoinTokensCreate(tenant_id="root", pool_id=pool.id, max_uses=hosts),
    )
    base = collect_inventory(fixture=FIXTURES, fixture_host=fleet.fixture_host)
    by_node: dict[str, Host] = {}
    for n in range(hosts):
        inventory = machine(base, n)
        join = s.NodesJoin(
            join_token=token.token,
            attestor="join-token",
            hostname=inventory.hostname,
            inventory=inventory,
        )
        joined = await call(store, env, "nodes/join", None, join)
        with store.snapshot() as db:
            row = reports.authenticate_node(db, joined.token)
        assert row is not None
        host = Host(row, joined.token, inventory)
        await host_reports(store, env, host, applied=True)  # H1: ready
        by_node[row.id] = host
    with store.snapshot() as db:
        ready = db.execute("SELECT count(*) FROM nodes WHERE state = 'ready'").fetchone()[0]
    assert ready == hosts, f"{ready} of {hosts} hosts ready"
    return pool.id, by_node, len(base.gpus)


@dataclass
class Outcome:
    """What runs came to; counts are over the days' arrivals (warm-up excluded)."""

    asked: Counter[int] = field(default_factory=Counter)  # by GPUs asked
    at_arrival: Counter[int] = field(default_factory=Counter)
    placed: Counter[int] = field(default_factory=Counter)  # at arrival or after waiting
    nvlink: Counter[int] = field(default_factory=Counter)  # every pair NVLink-joined
    one_numa: Counter[int] = field(default_factory=Counter)  # GPUs on one NUMA node
    whole_at_arrival: set[tuple[int, int]] = field(default_factory=set)  # (day, request)
    near: int = 0  # pinned CPUs all on their GPUs' NUMA nodes
    pinned: int = 0
    gpu_seconds: float = 0.0  # booked within the day
    gave_up: int = 0
    passes: int = 0
    calls: int = 0
    seconds: float = 0.0


async def simulate(
    fleet: Fleet,
    mode: str,
    day: int,
    requests: list[Request],
    hosts: int,
    patience: float,
    out: Outcome,
) -> int:
    """One day of the arrivals on a fresh database, added to ``out``; the GPUs per host."""
    env = Env(Liveness())
    with tempfile.TemporaryDirectory(prefix="bench-packing-") as tmp:
        store = Store(Path(tmp) / "bc.db")
        try:
            pool_id, by_node, per_host = await fleet_of(store, env, Path(tmp), fleet, hosts, mode)
            started = time.perf_counter()
            await run_day(store, env, pool_id, by_node, day, requests, patience, per_host, out)
            out.seconds += time.perf_counter() - started
        finally:
            store.close()
    return per_host


async def run_day(
    store: Store,
    env: Env,
    pool_id: str,
    by_node: dict[str, Host],
    day: int,
    requests: list[Request],
    patience: float,
    per_host: int,
    out: Outcome,
) -> None:
    # (simulated time, order, kind, request index); kinds: 0 end, 1 give up, 2 arrival
    events: list[tuple[float, int, int, int]] = [(r.at, n, 2, n) for n, r in enumerate(requests)]
    heapq.heapify(events)
    order = len(requests)
    reservation: dict[int, str] = {}  # request index -> reservation id
    node_of: dict[int, str] = {}
    waiting: dict[str, int] = {}  # pending reservation id -> request index

    async def placed(index: int, view: s.ReservationView, now_at: float, first_try: bool) -> None:
        nonlocal order
        assert view.placement is not None
        request = requests[index]
        node_of[index] = view.placement.node_id
        host = by_node[view.placement.node_id]
        delivered = s.BookingReport(reservation_id=view.id, state="delivered")
        await host_reports(store, env, host, [delivered])
        out.calls += 1
        end = now_at + request.duration
        heapq.heappush(events, (end, order, 0, index))
        order += 1
        out.gpu_seconds += request.gpus * max(0.0, min(end, DAY) - max(now_at, 0.0))
        if request.at < 0:
            return
        size = request.gpus
        if first_try:
            out.at_arrival[size] += 1
            if size == per_host:
                out.whole_at_arrival.add((day, index))
        out.placed[size] += 1
        where = view.placement
        out.nvlink[size] += bool(where.topology.nvlink)
        out.one_numa[size] += len(where.topology.numa_nodes) == 1
        if where.cpu_quota is None and where.cpus:
            out.pinned += 1
            gpu_numa = {g.numa_node for g in where.gpus}
            out.near += set(cpulist.parse(where.memory_nodes or "")) == gpu_numa

    async def end(rid: str) -> None:
        body = s.ReservationsEnd(tenant_id="root", reservation_id=rid)
        await call(store, env, "reservations/end", ROOT, body)
        out.calls += 1

    while events:
        at, _, kind, index = heapq.heappop(events)
        if at >= DAY:
            break
        request = requests[index]
        if kind == 2:  # arrival
            if request.at >= 0:
                out.asked[request.gpus] += 1
            asked = s.ReservationResources(gpu=request.gpus, vcpu=VCPU_PER_GPU * request.gpus)
            ask = s.ReservationsCreate(tenant_id="root", pool_id=pool_id, resources=asked)
            view = await call(store, env, "reservations/create", ROOT, ask)
            out.calls += 1
            reservation[index] = view.id
            if view.state == "placed":
                await placed(index, view, at, True)
            else:
                waiting[view.id] = index
                heapq.heappush(events, (at + patience, order, 1, index))
                order += 1
        elif kind == 1:  # the tenant stops waiting
            rid = reservation[index]
            if waiting.pop(rid, None) is not None:
                await end(rid)
                out.gave_up += request.at >= 0
        else:  # the booking ends; its host releases it (D7), then the waiting may place
            rid = reservation[index]
            await end(rid)
            released = s.BookingReport(reservation_id=rid, state="released")
            await host_reports(store, env, by_node[node_of[index]], [released])
            out.calls += 1
            if not waiting:
                continue
            await store.write(lambda db: reconcile_pass(db, Liveness(), 3600, False))
            out.passes += 1
            ids = list(waiting)
            marks = ", ".join("?" for _ in ids)
            with store.snapshot() as db:
                found = db.execute(
                    f"SELECT id FROM reservations WHERE state = 'placed' AND id IN ({marks})", ids
                )
                moved = [r for (r,) in found]
            for rid in sorted(moved, key=lambda r: waiting[r]):
                body = s.ReservationsGet(tenant_id="root", reservation_id=rid)
                view = await call(store, env, "reservations/get", ROOT, body)
                await placed(waiting.pop(rid), view, at, False)
    with store.snapshot() as db:  # every ended booking was released: booked = live
        booked = db.execute("SELECT count(*) FROM node_devices WHERE allocated = 1").fetchone()[0]
        live = db.execute(
            "SELECT coalesce(sum(json_extract(resources, '$.gpu')), 0) FROM reservations "
            "WHERE state IN ('placed', 'active')"
        ).fetchone()[0]
    assert booked == live, f"{booked} GPUs booked, {live} held by live reservations"


def share(part: int, whole: int) -> str:
    return f"{part:>5}/{whole:<5} {100 * part / whole:5.1f}%" if whole else f"{'-':>18}"


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else ("inf" if a else "-")


def report(fleet: Fleet, hosts: int, per_host: int, days: int, runs: dict[str, Outcome]) -> bool:
    """The side-by-side table; True when bin-packing placed more whole-host requests at
    arrival than first fit."""
    packed, first = runs["preferred"], runs["none"]
    whole = per_host
    sizes = sorted(fleet.sizes)
    multi = [n for n in sizes if n > 1]
    numa_sizes = [n for n in multi if n <= per_host // 2]  # sizes that fit on one NUMA node
    asked = sum(packed.asked.values())
    print()
    print(
        f"{fleet.name}: {hosts} hosts, {hosts * per_host} GPUs, {days} simulated day(s), "
        f"{asked} requests counted"
    )
    print(f"{'':<46} {'bin-packing (preferred)':>24} {'first fit (none)':>24} {'ratio':>6}")

    def row(name: str, a: tuple[int, int], b: tuple[int, int]) -> None:
        ra = a[0] / a[1] if a[1] else 0.0
        rb = b[0] / b[1] if b[1] else 0.0
        print(f"{name:<46} {share(*a):>24} {share(*b):>24} {ratio(ra, rb):>6}")

    def of(out: Outcome, part: str, among: str, keys: Sequence[int]) -> tuple[int, int]:
        counts: Counter[int] = getattr(out, part)
        of_these: Counter[int] = getattr(out, among)
        return sum(counts[n] for n in keys), sum(of_these[n] for n in keys)

    lines = [
        (f"{whole}-GPU (whole-host) placed at arrival", "at_arrival", "asked", [whole]),
        (f"{whole}-GPU (whole-host) placed, waiting included", "placed", "asked", [whole]),
        ("all requests placed at arrival", "at_arrival", "asked", sizes),
        ("all requests placed, waiting included", "placed", "asked", sizes),
        ("multi-GPU bookings on one NVLink domain", "nvlink", "placed", multi),
        *((f"{n}-GPU bookings on one NUMA node", "one_numa", "placed", [n]) for n in numa_sizes),
    ]
    if len(numa_sizes) > 1:
        both = "/".join(map(str, numa_sizes))
        lines.append((f"{both}-GPU bookings on one NUMA node", "one_numa", "placed", numa_sizes))
    for name, part, among, keys in lines:
        row(name, of(packed, part, among, keys), of(first, part, among, keys))
    row(
        "bookings' pinned CPUs on their GPUs' NUMA nodes",
        (packed.near, packed.pinned),
        (first.near, first.pinned),
    )
    gpu_time = hosts * per_host * DAY * days
    use = packed.gpu_seconds / gpu_time, first.gpu_seconds / gpu_time
    print(
        f"{'GPU utilization over the day(s)':<46} {100 * use[0]:>23.1f}% {100 * use[1]:>23.1f}% {ratio(*use):>6}"
    )
    print(f"{'requests that gave up waiting':<46} {packed.gave_up:>24} {first.gave_up:>24}")
    calls = f"{packed.calls} / {packed.passes}", f"{first.calls} / {first.passes}"
    print(f"{'service calls / reconciler passes':<46} {calls[0]:>24} {calls[1]:>24}")
    print(
        f"{'run time of the simulated day(s) (s)':<46} {packed.seconds:>24.1f} {first.seconds:>24.1f}"
    )
    only_packed = len(packed.whole_at_arrival - first.whole_at_arrival)
    only_first = len(first.whole_at_arrival - packed.whole_at_arrival)
    print(
        f"whole-host requests placed at arrival by one policy only: bin-packing {only_packed}, "
        f"first fit {only_first}"
    )
    a, b = packed.at_arrival[whole], first.at_arrival[whole]
    ok = a > b
    print(
        f"{fleet.name}: whole-host requests placed at arrival, bin-packing / first fit = "
        f"{ratio(a, b)} (D9, > 1: {'PASS' if ok else 'FAIL'})"
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20 DGX hosts, 400 arrivals")
    parser.add_argument("--hosts", type=int, default=100)
    parser.add_argument("--arrivals", type=int, default=2000, help="arrivals in a simulated day")
    parser.add_argument("--load", type=float, default=1.0, help="GPUs asked, share of the fleet's")
    parser.add_argument("--patience", type=float, default=900.0, help="simulated s a request waits")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--days", type=int, default=1, help="independent days (seeds) summed")
    parser.add_argument("--fleet", choices=("dgx", "l40s", "both"), default="both")
    args = parser.parse_args()
    if args.quick:
        args.hosts, args.arrivals, args.fleet = 20, 400, "dgx"
    ok = True
    started = time.perf_counter()
    for key in ("dgx", "l40s") if args.fleet == "both" else (args.fleet,):
        fleet = FLEETS[key]
        per_host = len(collect_inventory(fixture=FIXTURES, fixture_host=fleet.fixture_host).gpus)
        runs = {mode: Outcome() for mode in MODES}
        for day in range(args.days):
            requests = arrivals(
                fleet, args.arrivals, args.hosts, per_host, args.load, args.seed + day
            )
            for mode in MODES:  # the same arrivals under each placement
                asyncio.run(
                    simulate(fleet, mode, day, requests, args.hosts, args.patience, runs[mode])
                )
        ok = report(fleet, args.hosts, per_host, args.days, runs) and ok
    verdict = "PASS" if ok else "FAIL"
    print(f"\nwhole run {time.perf_counter() - started:.0f} s; D9 whole-host ratio > 1: {verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
