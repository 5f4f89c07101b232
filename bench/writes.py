"""Writes across replicas (F10, B5): joins/s and reports/s with 1, 2 and 3 replicas on PostgreSQL.

Run: ``.venv/bin/python bench/writes.py [--hosts 600] [--concurrency 48] [--replicas 1,2,3]``,
or ``--sqlite``: one daemon on its SQLite file, whose node reports and first joins share group
commits when they wait for the writer together (``--baseline`` a checkout from before them
measures what the groups bring).

For each replica count, in one run: a throwaway PostgreSQL server from the machine's binaries
(tests/postgres.py), a fresh database, that many real daemons (``better-compute-controlplane
serve``) on it, and, over HTTP from this process's aiohttp client, spread round-robin over the
replicas at a fixed concurrency:

- joins: ``--hosts`` distinct hosts (the recorded DGX H100's inventory, each with its own
  machine id, hostname and GPU UUIDs) join one pool with one join token: one write each (the
  node, its rows and atoms, the token's use, ``node.joined``);
- reports: each host then reports ``--reports`` times with its inventory digest (F9) and an
  ``applied`` that moved: one write each of its own node's row and no booking.

It prints joins/s and reports/s per replica count, and each over the one-replica figure of the
same run. ``--baseline DIR`` runs the same on another checkout's ``controlplane`` package (the
code as it was before a change) beside this one, in every round, each going first in turn,
and prints this one over it. ``--durable`` starts PostgreSQL with its own durable defaults
(fsync and synchronous commits on, as a production server runs; the tests' server turns them
off), so that each commit waits for its WAL flush, as a write under a lock held to its commit
does. The daemons, PostgreSQL and this client share the machine's cores: on a small machine
the CPU, not the database's locks, may be what caps the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from common import (  # noqa: E402
    DGX_FIXTURE,
    call,
    daemon_argv,
    free_port,
    spawned,
    wait_ready,
)

from agent.inventory import collect_inventory  # noqa: E402
from tests.postgres import PostgresServer  # noqa: E402

DURABLE = ("listen_addresses=127.0.0.1", "max_connections=200")  # PostgreSQL's own defaults else


def hosts(count: int) -> list[dict[str, Any]]:
    """``count`` inventories like the recorded DGX H100's, each its own machine."""
    base = collect_inventory(fixture=DGX_FIXTURE, fixture_host="dgx-h100-01")
    made = []
    for n in range(count):
        gpus = [msgspec.structs.replace(g, uuid=f"{g.uuid[:-6]}{n:06d}") for g in base.gpus]
        host = msgspec.structs.replace(
            base, machine_id=f"bench{n:06d}", hostname=f"dgx-{n:06d}", gpus=gpus
        )
        made.append(msgspec.to_builtins(host))
    return made


async def spread(jobs: list[Any], concurrency: int) -> float:
    """Run the coroutines ``concurrency`` at a time; the seconds it took."""
    queue = list(reversed(jobs))
    started = time.perf_counter()

    async def worker() -> None:
        while queue:
            await queue.pop()

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return time.perf_counter() - started


async def post(session: aiohttp.ClientSession, url: str, token: str | None, body: Any) -> Any:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    async with session.post(url, json=body, headers=headers) as response:
        answer = await response.json()
        if response.status != 200:
            raise RuntimeError(f"{url}: HTTP {response.status} {answer}")
        return answer


@contextmanager
def replicas(
    tmp: Path, url: str | None, count: int, code: Path | None
) -> Iterator[list[tuple[str, Any, Path]]]:
    """``count`` daemons on the database at ``url`` (None: the one daemon's SQLite file in its
    workdir): (base URL, process, workdir) each."""
    with ExitStack() as stack:
        running = []
        for n in range(count):
            port = free_port()
            workdir = tmp / f"replica{n}"
            workdir.mkdir()
            argv = daemon_argv(workdir, port, "--log-level", "warning")
            if url is not None:
                argv[argv.index("--db") + 1] = url
            if code is not None:  # the other checkout's package, through the same entry point
                entry = f"import sys; sys.path.insert(0, {str(code)!r}); "
                argv[:1] = [
                    sys.executable,
                    "-c",
                    entry + "from controlplane.main import cli; cli()",
                ]
            proc = stack.enter_context(spawned(argv, workdir / "daemon.log"))
            running.append((f"http://127.0.0.1:{port}", proc, workdir))
            deadline = time.monotonic() + 60
            while n == 0 and not (workdir / "root.token").exists():  # migrated, bootstrapped
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError((workdir / "daemon.log").read_text())
                time.sleep(0.1)
        yield running


async def measure(
    urls: list[str], root: str, inventories: list[dict[str, Any]], reports: int, concurrency: int
) -> tuple[float, float]:
    """Joins/s, then reports/s, spread round-robin over the replicas at ``urls``."""
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:
        base = urls[0]
        site = await call(
            session,
            base,
            "compute/sites/create",
            root,
            {"tenantId": "root", "name": "fra1", "region": "eu", "kind": "shared"},
        )
        pool = await call(
            session,
            base,
            "compute/pools/create",
            root,
            {"tenantId": "root", "siteId": site["id"], "class": "metal-host", "gpuModel": "H100"},
        )
        token = await call(
            session,
            base,
            "compute/joinTokens/create",
            root,
            {"tenantId": "root", "poolId": pool["id"], "maxUses": len(inventories)},
        )
        nodes: list[Any] = [None] * len(inventories)

        async def join(n: int) -> None:
            body = {
                "joinToken": token["token"],
                "attestor": "join-token",
                "hostname": inventories[n]["hostname"],
                "inventory": inventories[n],
            }
            nodes[n] = await post(
                session, f"{urls[n % len(urls)]}/api/compute/nodes/join", None, body
            )

        joined = await spread([join(n) for n in range(len(inventories))], concurrency)

        async def report(n: int, r: int) -> None:
            node = nodes[n]
            body = {
                "nodeId": node["nodeId"],
                "inventoryDigest": node["inventoryDigest"],
                "applied": {"version": "", "units": [], "run": r},
            }
            url = f"{urls[(n + r) % len(urls)]}/api/compute/nodes/report"
            await post(session, url, node["token"], body)

        jobs = [report(n, r) for r in range(reports) for n in range(len(inventories))]
        reported = await spread(jobs, concurrency)
        return len(inventories) / joined, len(jobs) / reported


def one_run(
    server: PostgresServer | None,
    count: int,
    code: Path | None,
    args: argparse.Namespace,
    hosts: Any,
) -> tuple[float, float]:
    """Joins/s and reports/s of ``count`` replicas running ``code`` on a fresh database (a
    fresh SQLite file without ``server``)."""
    url = None if server is None else server.new_database()
    try:
        with (
            tempfile.TemporaryDirectory() as tmp,
            replicas(Path(tmp), url, count, code) as running,
        ):

            async def run() -> tuple[float, float]:
                async with aiohttp.ClientSession() as session:
                    for base, proc, workdir in running:
                        log = workdir / "daemon.log"
                        await wait_ready(session, "GET", f"{base}/readyz", proc, log)
                root = (running[0][2] / "root.token").read_text().strip()
                urls = [base for base, _, _ in running]
                return await measure(urls, root, hosts, args.reports, args.concurrency)

            return asyncio.run(run())
    finally:
        if server is not None and url is not None:
            server.drop_database(url)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=600)
    parser.add_argument("--reports", type=int, default=2, help="reports per host")
    parser.add_argument("--concurrency", type=int, default=48)
    parser.add_argument("--replicas", default="1,2,3")
    parser.add_argument("--rounds", type=int, default=1, help="interleaved rounds")
    parser.add_argument("--durable", action="store_true", help="fsync and synchronous commits on")
    parser.add_argument(
        "--baseline", type=Path, help="another checkout, measured beside this one in each round"
    )
    parser.add_argument("--sqlite", action="store_true", help="one daemon on a SQLite file")
    args = parser.parse_args()
    counts = [1] if args.sqlite else [int(c) for c in args.replicas.split(",")]
    inventories = hosts(args.hosts)
    codes: dict[str, Path | None] = {"this": None}
    if args.baseline is not None:
        codes["baseline"] = args.baseline
    server: PostgresServer | None = None
    if not args.sqlite:
        server = PostgresServer(settings=DURABLE) if args.durable else PostgresServer()
    if server is not None:
        server.start()
    figures: dict[tuple[str, int], list[tuple[float, float]]] = {}
    try:
        for number in range(args.rounds):
            for count in counts:
                names = list(codes)
                if (number + count) % 2:  # each code goes first in turn
                    names.reverse()
                for name in names:
                    found = one_run(server, count, codes[name], args, inventories)
                    figures.setdefault((name, count), []).append(found)
    finally:
        if server is not None:
            server.stop()
    backend = "SQLite" if args.sqlite else f"PostgreSQL{' (durable)' if args.durable else ''}"
    print(
        f"writes: {args.hosts} joins, then {args.reports} reports per host, concurrency "
        f"{args.concurrency}, {backend}, {args.rounds} "
        f"round(s); baseline: {args.baseline or 'none'}; medians"
    )
    print(f"{'code':<9} {'replicas':>8} {'joins/s':>9} {'x one':>6} {'reports/s':>10} {'x one':>6}")
    medians = {
        key: tuple(statistics.median(f[i] for f in found) for i in (0, 1))
        for key, found in figures.items()
    }
    for (name, count), (joins, reports) in sorted(medians.items()):
        one = medians[(name, counts[0])]
        print(
            f"{name:<9} {count:>8} {joins:9.1f} {joins / one[0]:6.2f} "
            f"{reports:10.1f} {reports / one[1]:6.2f}"
        )
    if args.baseline is not None:
        for count in counts:
            this, base = medians[("this", count)], medians[("baseline", count)]
            print(
                f"{count} replicas, this / baseline: joins {this[0] / base[0]:.2f} x, "
                f"reports {this[1] / base[1]:.2f} x"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
