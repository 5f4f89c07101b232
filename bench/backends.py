"""The two storage backends side by side: the same API calls on SQLite and on PostgreSQL.

Run: ``.venv/bin/python bench/backends.py [--requests 1000] [--concurrency 8]``

Starts a PostgreSQL server from the machine's binaries (the test harness's tests/postgres.py,
a throwaway cluster as an unprivileged user), then two real daemons: one on a SQLite file, one
on a fresh PostgreSQL database (both with synchronous commits, the default). On each, over HTTP
as root: a read (``pools/get``) and a mutation (``pools/offer``, re-offering one pool with a
varying quota: one transaction with its event), N requests at a fixed concurrency. Prints
p50/p99 and req/s per backend and the ratio PostgreSQL / SQLite, rounds interleaved.
"""

import argparse
import asyncio
import importlib.util
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from tests.postgres import PostgresServer  # noqa: E402


def _bench_api() -> Any:
    spec = importlib.util.spec_from_file_location("bench_api", ROOT / "bench" / "api.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_api"] = module
    spec.loader.exec_module(module)
    return module


api = _bench_api()


async def timed(
    session: aiohttp.ClientSession, base: str, token: str, calls: list[Any], n: int
) -> list[float]:
    latencies: list[float] = []
    queue = list(range(n))

    async def worker() -> None:
        while queue:
            i = queue.pop()
            path, body = calls[i % len(calls)](i)
            started = time.perf_counter()
            await api.call(session, base, path, token, body)
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(worker() for _ in range(8)))
    return sorted(latencies)


async def setup(session: aiohttp.ClientSession, base: str, root: str) -> dict[str, str]:
    await api.call(session, base, "iam/tenants/create", root, {"tenantId": "acme"})
    site = await api.call(
        session,
        base,
        "compute/sites/create",
        root,
        {"tenantId": "root", "name": "b", "region": "eu", "kind": "shared"},
    )
    pool = await api.call(
        session,
        base,
        "compute/pools/create",
        root,
        {"tenantId": "root", "siteId": site["id"], "class": "metal-host", "gpuModel": "H100"},
    )
    return {"pool": pool["id"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    server = PostgresServer()
    server.start()
    try:
        with tempfile.TemporaryDirectory(dir=Path.cwd()) as tmp:
            return asyncio.run(run(Path(tmp), server.new_database(), args))
    finally:
        server.stop()


async def run(tmp: Path, url: str, args: argparse.Namespace) -> int:
    daemons: dict[str, Any] = {}
    with (
        api.spawned(
            [
                api.daemon_executable(),
                "serve",
                "--db",
                str(tmp / "bc.db"),
                "--listen",
                f"127.0.0.1:{(p1 := api.free_port())}",
                "--log-level",
                "warning",
            ],
            tmp / "sqlite.log",
        ) as sqlite_proc,
        api.spawned(
            [
                api.daemon_executable(),
                "serve",
                "--db",
                url,
                "--root-token-file",
                str(tmp / "pg.token"),
                "--listen",
                f"127.0.0.1:{(p2 := api.free_port())}",
                "--log-level",
                "warning",
            ],
            tmp / "pg.log",
        ) as pg_proc,
    ):
        async with aiohttp.ClientSession() as session:
            for name, port, proc, token_file in (
                ("sqlite", p1, sqlite_proc, tmp / "root.token"),
                ("postgresql", p2, pg_proc, tmp / "pg.token"),
            ):
                base = f"http://127.0.0.1:{port}"
                await api.wait_ready(session, "GET", f"{base}/readyz", proc, tmp / f"{name}.log")
                root = token_file.read_text().strip()
                daemons[name] = (base, root, await setup(session, base, root))
            results: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.rounds):
                for name, (base, root, world) in daemons.items():
                    get = [
                        lambda i, w=world: (
                            "compute/pools/get",
                            {"tenantId": "root", "poolId": w["pool"]},
                        )
                    ]
                    offer = [
                        lambda i, w=world: (
                            "compute/pools/offer",
                            {
                                "tenantId": "root",
                                "poolId": w["pool"],
                                "toTenantId": "acme",
                                "quota": {"gpu": 1 + i % 100},
                            },
                        )
                    ]
                    for kind, calls in (("pools/get", get), ("pools/offer", offer)):
                        got = await timed(session, base, root, calls, args.requests // args.rounds)
                        results.setdefault((kind, name), []).extend(got)
    print(
        f"backends: {args.requests} requests per endpoint and backend, concurrency 8, {args.rounds} interleaved rounds"
    )
    print(f"{'endpoint':<12} {'backend':<11} {'p50 ms':>7} {'p99 ms':>7}")
    for (kind, name), values in sorted(results.items()):
        values.sort()
        p50 = values[len(values) // 2] * 1000
        p99 = values[min(len(values) - 1, int(len(values) * 0.99))] * 1000
        print(f"{kind:<12} {name:<11} {p50:7.2f} {p99:7.2f}")
    for kind in ("pools/get", "pools/offer"):
        ratio = statistics.median(results[(kind, "postgresql")]) / statistics.median(
            results[(kind, "sqlite")]
        )
        print(f"{kind}: PostgreSQL / SQLite median latency {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
