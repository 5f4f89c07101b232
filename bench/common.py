"""What the HTTP benchmarks share: the processes, the bare baseline, the load clients, figures.

``bench/api.py`` and ``bench/fleet.py`` import it (both put this folder on ``sys.path`` first, so
it also loads when they are loaded by path, as ``bench/crash.py`` and ``bench/backends.py`` load
``api.py``). Run as a script, it is the baseline server::

    python bench/common.py --serve-bare PORT

a bare aiohttp app with one POST handler answering ``{"ok": true}``: the least any method of the
daemon can cost over the same HTTP stack, measured in the same run as the daemon.

Two load clients:

- ``aiohttp``: ``load`` drives one endpoint from this process with a fixed number of concurrent
  workers over keep-alive connections, for a bounded time and request count;
- ``wrk`` (when installed: ``shutil.which("wrk")``): ``run_wrk`` drives one POST endpoint with
  ``wrk --latency`` and a small Lua script (``wrk.method``, ``wrk.body``, ``wrk.headers``) and
  parses its Requests/sec and latency distribution. wrk is C and far lighter than the Python
  client, so on a small machine its figures leave the servers more of the CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psutil  # type: ignore[import-untyped]
from aiohttp import web

from agent.inventory import collect_inventory

HOST = "127.0.0.1"
BARE_PATH = "/bare"
DGX_FIXTURE = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
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
    # Each request's body made distinct by its JSON whitespace (``fresh_body``), so that no two
    # requests of the run are the same: the daemon's answer cache (keyed by the body) never hits.
    fresh: bool = False


# Bodies made fresh: the aiohttp client numbers them 1, 2, ...; wrk run k numbers them from
# k * 2**32 up (``wrk_script``), so the two never meet below 2**32 aiohttp requests.
_FRESH = itertools.count(1)
_WRK_RUNS = itertools.count(1)
_WHITESPACE = b" \t\n\r"


def whitespace(n: int) -> bytes:
    """n in base 4 over JSON's four whitespace bytes, lowest digit first: distinct per n."""
    digits = bytearray()
    while n > 0:
        n, digit = divmod(n, 4)
        digits.append(_WHITESPACE[digit])
    return bytes(digits)


def fresh_body(body: bytes) -> bytes:
    """body (a JSON object) with a run of whitespace after its ``{`` that no other has had."""
    return body[:1] + whitespace(next(_FRESH)) + body[1:]


# --- the baseline server ------------------------------------------------------------------------


async def _bare_handler(request: web.Request) -> web.Response:
    await request.read()
    return web.Response(body=b'{"ok":true}', content_type="application/json")


def serve_bare(port: int) -> None:
    """Run the baseline: a bare aiohttp app with one POST handler (runs in its own process)."""
    app = web.Application()
    app.router.add_post(BARE_PATH, _bare_handler)
    web.run_app(app, host=HOST, port=port, access_log=None, print=None)


def bare_argv(port: int) -> list[str]:
    """The command line that serves the baseline on port."""
    return [sys.executable, str(Path(__file__).resolve()), "--serve-bare", str(port)]


# --- processes ----------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """count distinct free ports."""
    ports: set[int] = set()
    while len(ports) < count:
        ports.add(free_port())
    return sorted(ports)


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


def daemon_argv(directory: Path, port: int, *extra: str) -> list[str]:
    """``serve`` on directory/db.sqlite with its root token in directory/root.token."""
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


@dataclass(frozen=True)
class Spawned:
    proc: subprocess.Popen[bytes]
    port: int
    log: Path

    @property
    def base(self) -> str:
        return f"http://{HOST}:{self.port}"

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise SetupError(
                f"{self.proc.args!r} exited with {self.proc.returncode} during the run; "
                f"log {self.log}:\n{log_tail(self.log)}"
            )


def cpu_seconds(process: psutil.Process) -> float:
    """The process's CPU time so far (user + system, every thread)."""
    times = process.cpu_times()
    return float(times.user + times.system)


# --- HTTP helpers -------------------------------------------------------------------------------


def encode(body: dict[str, Any]) -> bytes:
    return msgspec.json.encode(body)


def headers(token: str | None) -> dict[str, str]:
    result = {"Content-Type": "application/json"}
    if token is not None:
        result["Authorization"] = f"Bearer {token}"
    return result


async def bound_port(proc: subprocess.Popen[bytes], log_path: Path) -> int:
    """The port a daemon started with ``--listen HOST:0`` bound, from its "serving" line
    (``--log-format json``): no port is chosen first and left free for another process (a
    parallel test's) to take meanwhile."""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SetupError(
                f"{proc.args!r} exited with {proc.returncode} before it was serving; "
                f"log {log_path}:\n{log_tail(log_path)}"
            )
        text = await asyncio.to_thread(log_path.read_text, errors="replace")
        for line in text.splitlines():
            if '"serving"' not in line:
                continue
            with contextlib.suppress(ValueError):
                fields = json.loads(line)
                if fields.get("event") == "serving" and isinstance(fields.get("url"), str):
                    return int(fields["url"].rsplit(":", 1)[1])
        await asyncio.sleep(0.05)
    raise SetupError(f"{proc.args!r} was not serving after {READY_TIMEOUT_S:.0f} s; log {log_path}")


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


# --- the aiohttp client -------------------------------------------------------------------------


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
    data = endpoint.body(i)
    if endpoint.fresh:
        data = fresh_body(data)
    try:
        async with session.post(endpoint.url, data=data, headers=headers(endpoint.token)) as resp:
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


async def warm_up(
    session: aiohttp.ClientSession,
    endpoint: Endpoint,
    concurrency: int,
    requests: int = WARMUP_REQUESTS,
) -> None:
    """Open the keep-alive connections and warm caches; these requests are not measured."""
    await load(session, endpoint, seconds=2.0, concurrency=concurrency, max_requests=requests)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list (0 when empty)."""
    if not sorted_values:
        return 0.0
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


# --- the wrk client -----------------------------------------------------------------------------


def wrk_path() -> str | None:
    """wrk's path when it is installed (Debian/Ubuntu package ``wrk``)."""
    return shutil.which("wrk")


@dataclass(frozen=True)
class WrkResult:
    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int  # non-2xx/3xx answers plus socket errors (connect, read, write, timeout)
    first_error: str | None


_UNITS_MS = {"us": 1e-3, "ms": 1.0, "s": 1e3, "m": 6e4, "h": 3.6e6}


def _latency_ms(text: str) -> float:
    found = re.fullmatch(r"([0-9.]+)(us|ms|s|m|h)", text)
    if found is None:
        raise ValueError(f"not a wrk latency: {text!r}")
    return float(found.group(1)) * _UNITS_MS[found.group(2)]


def parse_wrk(output: str) -> WrkResult:
    """Requests/sec, the --latency distribution's 50% and 99%, and the errors wrk reports."""
    distribution = dict(re.findall(r"^\s+(50|99)(?:\.0+)?%\s+(\S+)\s*$", output, re.M))
    total = re.search(r"^\s*(\d+) requests in ([0-9.]+)(us|ms|s|m|h)", output, re.M)
    rate = re.search(r"^Requests/sec:\s+([0-9.]+)", output, re.M)
    if total is None or rate is None or "50" not in distribution or "99" not in distribution:
        raise SetupError(f"could not read wrk's output:\n{output}")
    errors, reasons = 0, []
    non_2xx = re.search(r"Non-2xx or 3xx responses:\s+(\d+)", output)
    if non_2xx:
        errors += int(non_2xx.group(1))
        reasons.append(f"{non_2xx.group(1)} non-2xx/3xx answers")
    socket_errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    if socket_errors:
        counts = [int(n) for n in socket_errors.groups()]
        if sum(counts):
            errors += sum(counts)
            reasons.append(socket_errors.group(0))
    return WrkResult(
        requests=int(total.group(1)),
        seconds=_latency_ms(f"{total.group(2)}{total.group(3)}") / 1e3,
        rps=float(rate.group(1)),
        p50_ms=_latency_ms(distribution["50"]),
        p99_ms=_latency_ms(distribution["99"]),
        errors=errors,
        first_error="; ".join(reasons) or None,
    )


def _lua_string(value: str) -> str:
    """value as a Lua long-bracket string literal (no escaping inside)."""
    level = 0
    while f"]{'=' * level}]" in value:
        level += 1
    return f"[{'=' * level}[{value}]{'=' * level}]"


# With a fresh endpoint, each request's body gets the whitespace of its own number
# (run * 2**28 + request) * 16 + thread, built as ``whitespace`` builds it; the run comes in as
# the script's argument (``run_wrk``), the thread from ``setup``.
_FRESH_LUA = """
local head, tail = wrk.body:sub(1, 1), wrk.body:sub(2)
local spaces = {" ", "\\t", "\\n", "\\r"}
local threads = 0
function setup(thread)
  thread:set("tid", threads)
  threads = threads + 1
end
local run, count = 0, 0
function init(args)
  run = tonumber(args[1]) or 0
end
function request()
  count = count + 1
  local n = (run * 268435456 + count) * 16 + tid
  local pad = {}
  while n > 0 do
    pad[#pad + 1] = spaces[n % 4 + 1]
    n = math.floor(n / 4)
  end
  return wrk.format(nil, nil, nil, head .. table.concat(pad) .. tail)
end
"""


def wrk_script(directory: Path, endpoint: Endpoint) -> Path:
    """A Lua script for wrk that POSTs endpoint's body as JSON with its bearer token (a fresh
    body each request for a fresh endpoint), in directory."""
    lines = [
        'wrk.method = "POST"',
        f"wrk.body = {_lua_string(endpoint.body(0).decode())}",
        'wrk.headers["Content-Type"] = "application/json"',
    ]
    if endpoint.token is not None:
        lines.append(f'wrk.headers["Authorization"] = {_lua_string("Bearer " + endpoint.token)}')
    if endpoint.fresh:
        lines.append(_FRESH_LUA)
    fd, name = tempfile.mkstemp(suffix=".lua", prefix="wrk-", dir=directory)
    with os.fdopen(fd, "w") as handle:
        handle.write("\n".join(lines) + "\n")
    return Path(name)


async def run_wrk(
    url: str,
    script: Path,
    *,
    connections: int,
    seconds: float,
    threads: int | None = None,
    timeout_s: float = REQUEST_TIMEOUT_S,
) -> WrkResult:
    """One wrk run: ``-t threads -c connections -d seconds --latency -s script``; threads
    default to min(2, connections) (32 connections: ``-t 2 -c 32``)."""
    wrk = wrk_path()
    if wrk is None:
        raise SetupError("wrk is not installed")
    threads = threads or min(2, connections)
    argv = [
        wrk,
        "-t",
        str(threads),
        "-c",
        str(connections),
        "-d",
        f"{max(1, round(seconds))}s",
        "--timeout",
        f"{timeout_s:g}s",
        "--latency",
        "-s",
        str(script),
        url,
        "--",
        str(next(_WRK_RUNS)),  # a fresh script's run k: its numbers start at k * 2**32
    ]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    if proc.returncode != 0:
        raise SetupError(f"{' '.join(argv)} exited with {proc.returncode}:\n{text}")
    return parse_wrk(text)


# --- figures ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Spread:
    """One figure over the rounds of a run: the median and the range."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Spread:
        if not values:
            return cls(0.0, 0.0, 0.0)
        return cls(statistics.median(values), min(values), max(values))

    def show(self, digits: int = 2) -> str:
        """``median [low-high]``."""
        return f"{self.median:.{digits}f} [{self.low:.{digits}f}-{self.high:.{digits}f}]"


def table(columns: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Text lines: the first column left-aligned, the others right-aligned."""
    widths = [max(len(c), *(len(row[k]) for row in rows)) for k, c in enumerate(columns)]

    def line(cells: Sequence[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join((first, *rest)).rstrip()

    return [line(columns), "  ".join("-" * w for w in widths), *(line(row) for row in rows)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the bare aiohttp baseline server")
    parser.add_argument("--serve-bare", type=int, metavar="PORT", required=True)
    args = parser.parse_args(argv)
    serve_bare(args.serve_bare)
    return 0


if __name__ == "__main__":
    sys.exit(main())
