"""API throughput benchmark: the control plane against a bare aiohttp handler.

Run it with ``make bench`` (which runs ``.venv/bin/python bench/api.py``) or directly::

    .venv/bin/python bench/api.py [--seconds 5] [--rounds 5] [--concurrency 32] [--max-requests N]
        [--json]

What it does, in one run:

1. Starts the real daemon (``better-compute-controlplane serve``) on a fresh SQLite database in a
   temporary directory, on a free port of 127.0.0.1, with its output sent to a log file there.
2. Populates it over HTTP as root: tenant ``acme``, one shared site, 50 ``metal-host`` pools, each
   offered to ``acme`` with a quota, and a credential for ``acme``.
3. Starts a baseline server in a second subprocess (``bench/common.py --serve-bare``): a bare
   aiohttp app with one POST handler that answers ``{"ok": true}``.
4. Loads each endpoint in turn from this process (the client) with one aiohttp session, a fixed
   number of concurrent workers over keep-alive connections, for a bounded time and request count:

   - ``bare``        POST to the baseline handler;
   - ``pools/get``   ``compute/pools/get`` as acme, one pool;
   - ``pools/list``  ``compute/pools/list`` as acme, 50 pools visible;
   - ``pools/offer`` ``compute/pools/offer`` as root, re-offering one pool with a varying quota;
   - ``nodes/report`` ``compute/nodes/report`` as a joined node (the recorded DGX H100), with
     its inventory unchanged;
   - ``pools/get:nolog`` ``compute/pools/get`` on a second daemon, populated the same way, that
     runs with ``--log-level warning`` (no per-request log line).

5. Prints requests, req/s, p50 and p99 latency, errors (any answer but HTTP 200, or a transport
   failure), the ratio of each endpoint's req/s to the bare handler's (the median of the
   per-round ratios, the rounds interleaving every endpoint, and their range) and the serving
   process's
   CPU time per request (``cpu us``, read with psutil around each load), then the informational
   targets ``pools/get`` and ``nodes/report`` ``ratio >= 0.5 x bare`` (at 32 connections, the
   default concurrency), then the cost of the request log line (M5: one
   whole-line write per request): the median per-round ratio of ``pools/get`` with logs to
   ``pools/get:nolog``, and that difference per request in microseconds, from the rates and from
   the daemons' CPU time (the steadier figure when client and servers share few cores).

The servers and the client share the machine's cores, so absolute numbers depend on the host; the
ratio to the bare handler, measured under the same conditions, is the figure to compare. The exit
status is 0 unless a request failed (1) or the setup failed (2); the target does not affect it.
``bench/fleet.py`` measures the same two ratios with wrk as well, on a fleet-sized database.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

import aiohttp
import psutil  # type: ignore[import-untyped]

# bench/common.py, also when this file is loaded by path (bench/crash.py, bench/backends.py).
sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    BARE_PATH,
    REQUEST_TIMEOUT_S,
    Endpoint,
    Sample,
    SetupError,
    Spawned,
    Spread,
    bare_argv,
    call,
    cpu_seconds,
    daemon_argv,
    encode,
    free_ports,
    join_dgx,
    load,
    percentile,
    spawned,
    table,
    wait_ready,
    warm_up,
)

# Re-exported: bench/crash.py and bench/backends.py use them as this module's.
from common import HOST as HOST
from common import daemon_executable as daemon_executable
from common import free_port as free_port
from common import headers as headers
from common import log_tail as log_tail
from common import stop as stop

POOLS = 50
# Targets: pools/get and an unchanged nodes/report (one control plane for 300k hosts
# reporting every 30 s) at half the bare handler's rate or better.
TARGETS = {"pools/get": 0.5, "nodes/report": 0.5}
NOLOG = "pools/get:nolog"  # pools/get on the daemon that writes no request lines


@dataclass(frozen=True)
class Result:
    endpoint: str
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    ratio: float
    ratio_low: float  # the lowest and highest per-round ratio
    ratio_high: float
    first_error: str | None
    server_cpu_us: float  # the server process's CPU time (user + system) per request


@dataclass(frozen=True)
class Fixture:
    acme_token: str
    pool_ids: list[str]
    node_token: str
    report_body: bytes


async def populate(session: aiohttp.ClientSession, base: str, root: str) -> Fixture:
    """Tenant acme, one shared site, POOLS pools each offered to acme, and acme's credential."""
    await call(session, base, "iam/tenants/create", root, {"tenantId": "acme"})
    site = await call(
        session,
        base,
        "compute/sites/create",
        root,
        {"tenantId": "root", "name": "fra1", "region": "eu-central", "kind": "shared"},
    )
    pool_ids: list[str] = []
    for _ in range(POOLS):
        pool = await call(
            session,
            base,
            "compute/pools/create",
            root,
            {
                "tenantId": "root",
                "siteId": site["id"],
                "class": "metal-host",
                "gpuModel": "H100",
                "policy": {"maxPending": "6h"},
            },
        )
        pool_ids.append(pool["id"])
    for pool_id in pool_ids:
        await call(
            session,
            base,
            "compute/pools/offer",
            root,
            {"tenantId": "root", "poolId": pool_id, "toTenantId": "acme", "quota": {"gpu": 32}},
        )
    credential = await call(session, base, "iam/credentials/create", root, {"tenantId": "acme"})
    node_token, report_body = await join_dgx(session, base, root, site["id"])
    fixture = Fixture(
        acme_token=credential["token"],
        pool_ids=pool_ids,
        node_token=node_token,
        report_body=report_body,
    )
    visible = await call(
        session, base, "compute/pools/list", fixture.acme_token, {"tenantId": "acme"}
    )
    if len(visible["items"]) != POOLS:
        raise SetupError(f"acme sees {len(visible['items'])} pools, expected {POOLS}")
    return fixture


# --- load ---------------------------------------------------------------------------------------


def summarise(
    name: str, sample: Sample, elapsed: float, ratios: list[float], cpu_seconds: float
) -> Result:
    """Totals over all rounds; the ratio is the median of the per-round ratios to bare."""
    ratio = Spread.of(ratios)
    latencies = sorted(sample.latencies)
    rps = len(latencies) / elapsed if elapsed > 0 else 0.0
    return Result(
        endpoint=name,
        requests=len(latencies),
        seconds=round(elapsed, 3),
        rps=round(rps, 1),
        p50_ms=round(percentile(latencies, 50) * 1000, 2),
        p99_ms=round(percentile(latencies, 99) * 1000, 2),
        errors=sample.errors,
        ratio=round(ratio.median, 3),
        ratio_low=round(ratio.low, 3),
        ratio_high=round(ratio.high, 3),
        first_error=sample.first_error,
        server_cpu_us=round(cpu_seconds / len(latencies) * 1e6, 1) if latencies else 0.0,
    )


def endpoints(bare_base: str, api_base: str, root: str, fixture: Fixture) -> list[Endpoint]:
    pool_id = fixture.pool_ids[0]
    get_body = encode({"tenantId": "acme", "poolId": pool_id})
    list_body = encode({"tenantId": "acme"})
    offers = [
        encode(
            {
                "tenantId": "root",
                "poolId": pool_id,
                "toTenantId": "acme",
                "quota": {"gpu": 32 + k},
            }
        )
        for k in range(5)
    ]
    return [
        Endpoint("bare", f"{bare_base}{BARE_PATH}", None, lambda i: b"{}"),
        Endpoint(
            "pools/get", f"{api_base}/api/compute/pools/get", fixture.acme_token, lambda i: get_body
        ),
        Endpoint(
            "pools/list",
            f"{api_base}/api/compute/pools/list",
            fixture.acme_token,
            lambda i: list_body,
        ),
        Endpoint(
            "pools/offer", f"{api_base}/api/compute/pools/offer", root, lambda i: offers[i % 5]
        ),
        Endpoint(
            "nodes/report",
            f"{api_base}/api/compute/nodes/report",
            fixture.node_token,
            lambda i: fixture.report_body,
        ),
    ]


# --- the run ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    seconds: float
    rounds: int
    concurrency: int
    max_requests: int
    as_json: bool


@dataclass(frozen=True)
class LogCost:
    """pools/get with the request log line against pools/get without it."""

    ratio: float  # the median over rounds of req/s with logs / req/s without
    us_per_request: float  # 1e6 / req/s with logs - 1e6 / req/s without, over all rounds
    cpu_us_per_request: float  # the daemons' CPU time per request, with logs - without


def log_cost(results: list[Result], ratios: dict[str, list[float]]) -> LogCost:
    """From one interleaved run: each round's two rates were measured minutes apart at most."""
    logged = next(r for r in results if r.endpoint == "pools/get")
    quiet = next(r for r in results if r.endpoint == NOLOG)
    per_round = [a / b for a, b in zip(ratios["pools/get"], ratios[NOLOG], strict=True) if b]
    extra = 1e6 / logged.rps - 1e6 / quiet.rps if logged.rps and quiet.rps else 0.0
    return LogCost(
        ratio=round(statistics.median(per_round), 3) if per_round else 0.0,
        us_per_request=round(extra, 1),
        cpu_us_per_request=round(logged.server_cpu_us - quiet.server_cpu_us, 1),
    )


async def measure(
    options: Options, workdir: Path, api: Spawned, quiet: Spawned, bare: Spawned
) -> tuple[list[Result], LogCost]:
    api_base, quiet_base, bare_base = api.base, quiet.base, bare.base
    connector = aiohttp.TCPConnector(limit=options.concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await wait_ready(session, "GET", f"{api_base}/readyz", api.proc, api.log)
        await wait_ready(session, "GET", f"{quiet_base}/readyz", quiet.proc, quiet.log)
        await wait_ready(session, "POST", f"{bare_base}{BARE_PATH}", bare.proc, bare.log)
        root = (workdir / "root.token").read_text().strip()
        fixture = await populate(session, api_base, root)
        quiet_root = (workdir / "quiet" / "root.token").read_text().strip()
        quiet_fixture = await populate(session, quiet_base, quiet_root)
        quiet_get = encode({"tenantId": "acme", "poolId": quiet_fixture.pool_ids[0]})
        targets = [
            *endpoints(bare_base, api_base, root, fixture),
            Endpoint(
                NOLOG,
                f"{quiet_base}/api/compute/pools/get",
                quiet_fixture.acme_token,
                lambda i: quiet_get,
            ),
        ]
        for endpoint in targets:
            await warm_up(session, endpoint, options.concurrency)
        # Rounds interleave the baseline with every endpoint, so a change in the machine's
        # state (the other core, the CPU clock) hits both sides of each ratio alike.
        samples = {e.name: Sample(latencies=[]) for e in targets}
        elapsed = dict.fromkeys(samples, 0.0)
        cpu = dict.fromkeys(samples, 0.0)
        servers = {
            e.name: psutil.Process(
                (bare if e.name == "bare" else quiet if e.name == NOLOG else api).proc.pid
            )
            for e in targets
        }
        ratios: dict[str, list[float]] = {name: [] for name in samples}
        for _ in range(options.rounds):
            bare_rps = 0.0
            for endpoint in targets:
                cpu_before = cpu_seconds(servers[endpoint.name])
                sample, seconds = await load(
                    session,
                    endpoint,
                    seconds=options.seconds / options.rounds,
                    concurrency=options.concurrency,
                    max_requests=options.max_requests,
                )
                cpu[endpoint.name] += cpu_seconds(servers[endpoint.name]) - cpu_before
                rps = len(sample.latencies) / seconds if seconds > 0 else 0.0
                bare_rps = bare_rps or rps
                ratios[endpoint.name].append(rps / bare_rps if bare_rps else 0.0)
                merged = samples[endpoint.name]
                merged.latencies += sample.latencies
                merged.errors += sample.errors
                merged.first_error = merged.first_error or sample.first_error
                elapsed[endpoint.name] += seconds
        results = [
            summarise(name, samples[name], elapsed[name], ratios[name], cpu[name])
            for name in samples
        ]
        for server in (api, quiet, bare):
            server.check_alive()
        return results, log_cost(results, ratios)


def run(options: Options) -> tuple[list[Result], LogCost]:
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        workdir = Path(tmp)
        (workdir / "quiet").mkdir()
        api_port, quiet_port, bare_port = free_ports(3)
        api_log, bare_log = workdir / "controlplane.log", workdir / "bare.log"
        quiet_log = workdir / "quiet" / "controlplane.log"
        api_argv = daemon_argv(workdir, api_port)
        quiet_argv = daemon_argv(workdir / "quiet", quiet_port, "--log-level", "warning")
        with (
            spawned(api_argv, api_log) as api,
            spawned(quiet_argv, quiet_log) as quiet,
            spawned(bare_argv(bare_port), bare_log) as bare,
        ):
            return asyncio.run(
                measure(
                    options,
                    workdir,
                    Spawned(api, api_port, api_log),
                    Spawned(quiet, quiet_port, quiet_log),
                    Spawned(bare, bare_port, bare_log),
                )
            )


def target_lines(results: list[Result]) -> list[tuple[str, float, bool]]:
    """One line per target: (text, minimum ratio, met)."""
    lines = []
    for endpoint, minimum in TARGETS.items():
        ratio = next(r.ratio for r in results if r.endpoint == endpoint)
        passed = ratio >= minimum
        text = f"{endpoint} ratio >= {minimum} x bare: {'PASS' if passed else 'FAIL'}"
        lines.append((text, minimum, passed))
    return lines


def print_table(results: list[Result], cost: LogCost, options: Options, out: TextIO) -> None:
    print(
        f"{options.seconds:g}s per endpoint in {options.rounds} interleaved rounds, concurrency "
        f"{options.concurrency}, client aiohttp (this process), {os.cpu_count()} CPUs shared by "
        "client and servers; ratio: the median of the per-round ratios to bare, and their range",
        file=out,
    )
    columns = (
        "endpoint",
        "requests",
        "req/s",
        "p50 ms",
        "p99 ms",
        "errors",
        "ratio",
        "ratio range",
        "cpu us",
    )
    rows = [
        (
            r.endpoint,
            str(r.requests),
            f"{r.rps:.1f}",
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            str(r.errors),
            f"{r.ratio:.3f}",
            f"{r.ratio_low:.3f}-{r.ratio_high:.3f}",
            f"{r.server_cpu_us:.1f}",
        )
        for r in results
    ]
    for line in table(columns, rows):
        print(line, file=out)
    for text, _, _ in target_lines(results):
        print(text, file=out)
    print(
        f"request log line: pools/get with logs at {cost.ratio:.3f} x the rate without "
        f"({NOLOG}): {cost.us_per_request:.1f} us per request from the rates, "
        f"{cost.cpu_us_per_request:.1f} us of the daemon's CPU time per request",
        file=out,
    )
    for r in results:
        if r.first_error is not None:
            print(f"{r.endpoint}: {r.errors} errors, first: {r.first_error}", file=out)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=5.0, help="load time per endpoint")
    parser.add_argument(
        "--rounds", type=int, default=5, help="interleaved rounds the load time is split into"
    )
    parser.add_argument("--concurrency", type=int, default=32, help="concurrent requests")
    parser.add_argument(
        "--max-requests", type=int, default=500_000, help="request cap per endpoint"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.seconds <= 0:
        parser.error("--seconds must be positive")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    if args.concurrency < 1:
        parser.error("--concurrency must be at least 1")
    if args.max_requests < 1:
        parser.error("--max-requests must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    options = Options(
        seconds=args.seconds,
        rounds=args.rounds,
        concurrency=args.concurrency,
        max_requests=args.max_requests,
        as_json=args.json,
    )
    try:
        results, cost = run(options)
    except SetupError as exc:
        print(f"bench: setup failed: {exc}", file=sys.stderr)
        return 2
    if options.as_json:
        targets = target_lines(results)
        document = {
            "seconds": options.seconds,
            "concurrency": options.concurrency,
            "max_requests": options.max_requests,
            "cpus": os.cpu_count(),
            "results": [asdict(r) for r in results],
            "targets": [
                {"endpoint": endpoint, "min_ratio": minimum, "passed": passed, "line": text}
                for endpoint, (text, minimum, passed) in zip(TARGETS, targets, strict=True)
            ],
            "log_cost": asdict(cost),
        }
        print(json.dumps(document, indent=2))
    else:
        print_table(results, cost, options, sys.stdout)
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
