"""API throughput benchmark: the control plane against a bare aiohttp handler.

Run it with ``make bench`` (which runs ``.venv/bin/python bench/api.py``) or directly::

    .venv/bin/python bench/api.py [--seconds 5] [--concurrency 16] [--max-requests N] [--json]

What it does, in one run:

1. Starts the real daemon (``better-compute-controlplane serve``) on a fresh SQLite database in a
   temporary directory, on a free port of 127.0.0.1, with its output sent to a log file there.
2. Populates it over HTTP as root: tenant ``acme``, one shared site, 50 ``metal-host`` pools, each
   offered to ``acme`` with a quota, and a credential for ``acme``.
3. Starts a baseline server in a second subprocess: a bare aiohttp app with one POST handler that
   answers ``{"ok": true}``.
4. Loads each endpoint in turn from this process (the client) with one aiohttp session, a fixed
   number of concurrent workers over keep-alive connections, for a bounded time and request count:

   - ``bare``        POST to the baseline handler;
   - ``pools/get``   ``compute/pools/get`` as acme, one pool;
   - ``pools/list``  ``compute/pools/list`` as acme, 50 pools visible;
   - ``pools/offer`` ``compute/pools/offer`` as root, re-offering one pool with a varying quota;
   - ``pools/get:nolog`` ``compute/pools/get`` on a second daemon, populated the same way, that
     runs with ``--log-level warning`` (no per-request log line).

5. Prints requests, req/s, p50 and p99 latency, errors (any answer but HTTP 200, or a transport
   failure), the ratio of each endpoint's req/s to the bare handler's and the serving process's
   CPU time per request (``cpu us``, read with psutil around each load), then the informational
   target ``pools/get ratio >= 0.5 x bare``, then the cost of the request log line (M5: one
   whole-line write per request): the median per-round ratio of ``pools/get`` with logs to
   ``pools/get:nolog``, and that difference per request in microseconds, from the rates and from
   the daemons' CPU time (the steadier figure when client and servers share few cores).

The servers and the client share the machine's cores, so absolute numbers depend on the host; the
ratio to the bare handler, measured under the same conditions, is the figure to compare. The exit
status is 0 unless a request failed (1) or the setup failed (2); the target does not affect it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import aiohttp
import msgspec
import psutil  # type: ignore[import-untyped]
from aiohttp import web

from agent.inventory import collect_inventory

HOST = "127.0.0.1"
POOLS = 50
BARE_PATH = "/bare"
DGX_FIXTURE = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
# Targets: pools/get (issue 2) and an unchanged nodes/report (issue 3: one control plane
# for 300k hosts reporting every 30 s) at half the bare handler's rate or better.
TARGETS = {"pools/get": 0.5, "nodes/report": 0.5}
NOLOG = "pools/get:nolog"  # pools/get on the daemon that writes no request lines
READY_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0
REQUEST_TIMEOUT_S = 30.0
WARMUP_REQUESTS = 50

# A request body for the i-th request of an endpoint.
BodyFactory = Callable[[int], bytes]


class SetupError(RuntimeError):
    """The servers could not be started or populated."""


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    token: str | None
    body: BodyFactory


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
    first_error: str | None
    server_cpu_us: float  # the server process's CPU time (user + system) per request


# --- the baseline server ------------------------------------------------------------------------


async def _bare_handler(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=b'{"ok":true}', content_type="application/json")


def serve_bare(port: int) -> None:
    """Run the baseline: a bare aiohttp app with one POST handler (runs in its own process)."""
    app = web.Application()
    app.router.add_post(BARE_PATH, _bare_handler)
    web.run_app(app, host=HOST, port=port, access_log=None, print=None)


# --- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def daemon_executable() -> str:
    beside = Path(sys.executable).with_name("better-compute-controlplane")
    if beside.exists():
        return str(beside)
    repo_venv = Path(__file__).resolve().parent.parent / ".venv/bin/better-compute-controlplane"
    if repo_venv.exists():
        return str(repo_venv)
    found = shutil.which("better-compute-controlplane")
    if found is None:
        raise SetupError("better-compute-controlplane not found; run `make bench` to install it")
    return found


@contextlib.contextmanager
def spawned(argv: list[str], log_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    """Run argv with its output in log_path; SIGTERM it (then SIGKILL) on the way out."""
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        yield proc
    finally:
        stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def log_tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError as exc:
        return f"(could not read {path}: {exc})"


# --- HTTP helpers -------------------------------------------------------------------------------


def encode(body: dict[str, Any]) -> bytes:
    return msgspec.json.encode(body)


def headers(token: str | None) -> dict[str, str]:
    result = {"Content-Type": "application/json"}
    if token is not None:
        result["Authorization"] = f"Bearer {token}"
    return result


async def wait_ready(
    session: aiohttp.ClientSession,
    method: str,
    url: str,
    proc: subprocess.Popen[bytes],
    log_path: Path,
) -> None:
    """Poll url until it answers 200; fail if the process exits or the deadline passes."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SetupError(
                f"{proc.args!r} exited with {proc.returncode} before it was ready; "
                f"log {log_path}:\n{log_tail(log_path)}"
            )
        try:
            async with session.request(method, url, data=b"{}", headers=headers(None)) as resp:
                await resp.read()
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except (aiohttp.ClientError, OSError) as exc:
            last = repr(exc)
        await asyncio.sleep(0.1)
    raise SetupError(
        f"{url} not ready after {READY_TIMEOUT_S:.0f}s ({last}); log {log_path}:\n"
        f"{log_tail(log_path)}"
    )


async def call(
    session: aiohttp.ClientSession, base: str, path: str, token: str | None, body: dict[str, Any]
) -> Any:
    """One setup call: POST /api/<path>; anything but 200 is a SetupError."""
    url = f"{base}/api/{path}"
    async with session.post(url, data=encode(body), headers=headers(token)) as resp:
        payload = await resp.read()
        if resp.status != 200:
            raise SetupError(
                f"POST /api/{path} {json.dumps(body)} -> HTTP {resp.status}: "
                f"{payload.decode(errors='replace')}"
            )
        return msgspec.json.decode(payload)


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


async def join_dgx(
    session: aiohttp.ClientSession, base: str, root: str, site_id: str
) -> tuple[str, bytes]:
    """A node joined with the recorded DGX H100's inventory; its token and its report body."""
    pool = await call(
        session,
        base,
        "compute/pools/create",
        root,
        {"tenantId": "root", "siteId": site_id, "class": "metal-host", "gpuModel": "H100"},
    )
    join = await call(
        session, base, "compute/joinTokens/create", root, {"tenantId": "root", "poolId": pool["id"]}
    )
    inventory = msgspec.to_builtins(
        collect_inventory(fixture=DGX_FIXTURE, fixture_host="dgx-h100-01")
    )
    body = {
        "joinToken": join["token"],
        "attestor": "join-token",
        "hostname": "dgx-h100-01",
        "inventory": inventory,
    }
    node = await call(session, base, "compute/nodes/join", None, body)
    return node["token"], encode({"nodeId": node["nodeId"], "inventory": inventory})


# --- load ---------------------------------------------------------------------------------------


@dataclass
class Sample:
    latencies: list[float]
    errors: int = 0
    first_error: str | None = None

    def fail(self, reason: str) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = reason


async def one_request(session: aiohttp.ClientSession, endpoint: Endpoint, i: int) -> str | None:
    """Send the i-th request; None on HTTP 200, else the reason it failed."""
    try:
        async with session.post(
            endpoint.url, data=endpoint.body(i), headers=headers(endpoint.token)
        ) as resp:
            payload = await resp.read()
            if resp.status != 200:
                return f"HTTP {resp.status}: {payload[:300].decode(errors='replace')}"
            return None
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        return repr(exc)


async def load(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    *,
    seconds: float,
    concurrency: int,
    max_requests: int,
) -> tuple[Sample, float]:
    """Drive endpoint with `concurrency` workers until `seconds` pass or `max_requests` are sent."""
    sample = Sample(latencies=[])
    issued = 0
    started = time.perf_counter()
    deadline = started + seconds

    async def worker() -> None:
        nonlocal issued
        while issued < max_requests and time.perf_counter() < deadline:
            i = issued
            issued += 1
            t0 = time.perf_counter()
            failure = await one_request(session, endpoint, i)
            sample.latencies.append(time.perf_counter() - t0)
            if failure is not None:
                sample.fail(failure)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sample, time.perf_counter() - started


async def warm_up(session: aiohttp.ClientSession, endpoint: Endpoint, concurrency: int) -> None:
    """Open the keep-alive connections and warm caches; these requests are not measured."""
    await load(
        session, endpoint, seconds=2.0, concurrency=concurrency, max_requests=WARMUP_REQUESTS
    )


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def summarise(
    name: str, sample: Sample, elapsed: float, ratio: float, cpu_seconds: float
) -> Result:
    """Totals over all rounds; the ratio is the median of the per-round ratios to bare."""
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
        ratio=round(ratio, 3),
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
class Spawned:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"


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


def cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)


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
            summarise(
                name, samples[name], elapsed[name], statistics.median(ratios[name]), cpu[name]
            )
            for name in samples
        ]
        for server in (api, quiet, bare):
            if server.proc.poll() is not None:
                raise SetupError(
                    f"{server.proc.args!r} exited with {server.proc.returncode} during the run; "
                    f"log {server.log}:\n{log_tail(server.log)}"
                )
        return results, log_cost(results, ratios)


def run(options: Options) -> tuple[list[Result], LogCost]:
    with tempfile.TemporaryDirectory(prefix="bench-api-") as tmp:
        workdir = Path(tmp)
        (workdir / "quiet").mkdir()
        api_port, quiet_port, bare_port = free_port(), free_port(), free_port()
        while len({api_port, quiet_port, bare_port}) < 3:
            quiet_port, bare_port = free_port(), free_port()
        api_log, bare_log = workdir / "controlplane.log", workdir / "bare.log"
        quiet_log = workdir / "quiet" / "controlplane.log"

        def daemon_argv(directory: Path, port: int, *extra: str) -> list[str]:
            return [
                daemon_executable(),
                "serve",
                "--db",
                str(directory / "db.sqlite"),
                "--listen",
                f"{HOST}:{port}",
                "--root-token-file",
                str(directory / "root.token"),
                "--log-format",
                "json",
                *extra,
            ]

        api_argv = daemon_argv(workdir, api_port)
        quiet_argv = daemon_argv(workdir / "quiet", quiet_port, "--log-level", "warning")
        bare_argv = [sys.executable, str(Path(__file__).resolve()), "--serve-bare", str(bare_port)]
        with (
            spawned(api_argv, api_log) as api,
            spawned(quiet_argv, quiet_log) as quiet,
            spawned(bare_argv, bare_log) as bare,
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
        f"{options.seconds:g}s per endpoint, concurrency {options.concurrency}, "
        f"{os.cpu_count()} CPUs shared by client and servers",
        file=out,
    )
    columns = ("endpoint", "requests", "req/s", "p50 ms", "p99 ms", "errors", "ratio", "cpu us")
    rows = [
        (
            r.endpoint,
            str(r.requests),
            f"{r.rps:.1f}",
            f"{r.p50_ms:.2f}",
            f"{r.p99_ms:.2f}",
            str(r.errors),
            f"{r.ratio:.3f}",
            f"{r.server_cpu_us:.1f}",
        )
        for r in results
    ]
    widths = [max(len(c), *(len(row[k]) for row in rows)) for k, c in enumerate(columns)]

    def line(cells: tuple[str, ...]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join((first, *rest))

    print(line(columns), file=out)
    print("  ".join("-" * w for w in widths), file=out)
    for row in rows:
        print(line(row), file=out)
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
    parser.add_argument("--concurrency", type=int, default=16, help="concurrent requests")
    parser.add_argument(
        "--max-requests", type=int, default=500_000, help="request cap per endpoint"
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--serve-bare", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_bare is None:
        if args.seconds <= 0:
            parser.error("--seconds must be positive")
        if args.concurrency < 1:
            parser.error("--concurrency must be at least 1")
        if args.max_requests < 1:
            parser.error("--max-requests must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.serve_bare is not None:
        serve_bare(args.serve_bare)
        return 0
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
