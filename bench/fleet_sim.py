"""Fleet simulator (F7, F10): N simulated agents against the real daemon, end to end.

Run it from the clone's root::

    .venv/bin/python bench/fleet_sim.py --nodes 2000 --seconds 60
    .venv/bin/python bench/fleet_sim.py --backend postgresql --replicas 3 --nodes 2000
    .venv/bin/python bench/fleet_sim.py --knee [--backend postgresql --replicas 3]

The servers: ``--backend sqlite`` runs one ``better-compute-controlplane serve`` on a SQLite file
in a temporary directory; ``--backend postgresql`` runs ``--replicas`` (1-3) ``serve`` replicas
on one durable PostgreSQL server the simulator starts (tests/postgres.py's ``PostgresServer``,
fsync and synchronous_commit on, as bench/crash.py does), or on ``--postgres-url``'s empty
database. Every server binds 127.0.0.1; processes and directories go at the end, Ctrl-C too.

Time is compressed: ``--interval`` real seconds stand for the agent's 30 s (default 10: 3 x),
and the daemons run with the reconcile interval and ``--node-lost-after`` scaled alike
(``--reconcile-interval INTERVAL --node-lost-after 3*INTERVAL``; ``--daemon-arg`` passes more
flags, or overrides these, e.g. ``--daemon-arg=--max-inflight=128``).

Each simulated agent is a host: the recorded DGX H100 (``agent/fixtures/host-fixtures.json``,
``dgx-h100-01``) as the agent's own inventory code reads the fixture (``collect_inventory``),
made a distinct machine (its machine id, hostname, GPU UUIDs and serials). It joins for real
with the pool's join token and keeps its own node credential. It reports as the agent does:
its join carries the whole inventory, and each report after it the ``inventoryDigest`` the last
answer gave (the join's included: F9), or the whole inventory when an answer says
``inventoryWanted: true`` (while answers carry none, or with ``--no-digest``, every time; with
``--whole-first`` at the first report too, as from agents that just started: a power-on, the
heaviest storm). When an answer's ``specVersion`` is not the
spec it holds it fetches ``nodes/spec`` and reports at once what it did: every unit applied,
each live booking ``delivered``, each released one ``released`` (so reservations become active
and their devices come back, D6, D7); those fields are sent until a report carrying them is
taken, then left out (the control plane keeps the last). On 503 with ``Retry-After`` it waits
Retry-After + uniform(0, Retry-After); with no answer in 10 s (the agent's timeout) it backs
off with full jitter as the agent does (uniform(0, min(60, 2^failures)) s).

The client is one asyncio process with one aiohttp session: at most ``--connections`` requests
in flight over keep-alive connections, each agent sticking to one replica (spread evenly);
heartbeat bodies encoded once per digest. A request's latency runs from when it has a
connection slot; the wait for one is reported apart (the client's own queue). The client's CPU
time and its event loop's lag are printed, so a saturated client shows.

Phases, each printed as it ends:

1. joins: every agent joins, ``--join-concurrency`` at a time: joins/s, then (untimed) each
   fetches its NodeSpec, as the agent's first cycle does;
2. first-report storm: every agent's first report at once (as after a control-plane restart):
   the drain time until every node has one report answered 200, requests, 503s, timeouts;
3. steady state: one interval after the storm has drained (each agent's next report comes at
   a random point of the interval after its first, so the fleet's phases spread), for
   ``--seconds``: reports/s against the expected N / interval, report p50/p99, reservations
   created (``--reservations-per-s``, by tenant ``acme``, offered the pool with a quota, each
   ended after 0.5-1.5 intervals) with create p50/p99, 503s and how agents backed off, the CPU
   seconds of the daemons and of PostgreSQL (``/proc/<pid>/stat`` through psutil: each process,
   its live children, and the children it reaped) per 1,000 reports, and the leader's reconcile
   pass time (``bc_reconcile_seconds`` from each replica's ``/metrics``, read as root);
4. audit: every node as root (``nodes/list``) and every ``node.lost`` event: a node lost at
   the end, or marked lost after its agent's first report was answered (its agent kept
   reporting from then on), is wrongly lost (must be 0); nodes marked lost while silent between
   their join and their first report are shown apart (their agents had not reported yet).
   Then the projection: cores for 100,000 hosts at a 30 s interval (3,333 reports/s) from the
   server CPU per 1,000 reports (reports and the reservation load together, as measured).

``--knee`` runs N = 2000, 5000, 10000, 20000 (``--knee-sizes``) in turn, each a fresh fleet,
until report p99 passes 1 s, a node is wrongly lost or one never reported (the storm gives up
after 12 intervals, 60 s or N / 50 s, whichever is longest), and prints one row per run.
``--json`` ends with one line of JSON: the summary of each run.

Exit status: 0; 1 when a node was wrongly lost, a node never reported, or a 503 came without
Retry-After; 2 when the setup failed or a simulated agent died (its node would fall silent, and
the audit could not tell it from a wrongly lost one).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import random
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psutil  # type: ignore[import-untyped]
import psycopg
from prometheus_client.parser import text_string_to_metric_families

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # tests/postgres.py, the agent's inventory code
sys.path.insert(0, str(HERE))  # bench/common.py, also when this file is loaded by path
from common import (  # noqa: E402
    DGX_FIXTURE,
    HOST,
    SetupError,
    bound_port,
    call,
    daemon_argv,
    encode,
    log_tail,
    percentile,
    spawned,
    table,
    wait_ready,
)

from agent.apply import ApplyReport, UnitResult  # noqa: E402
from agent.inventory import collect_inventory  # noqa: E402
from agent.loop import Settings  # noqa: E402
from shared.schemas import BookingReport, NodeSpec  # noqa: E402
from tests.postgres import PostgresServer  # noqa: E402

FIXTURE_HOST = "dgx-h100-01"
AGENT_INTERVAL_S = Settings.interval  # what --interval stands for (30 s)
LOST_AFTER_INTERVALS = 3  # the daemon's default --node-lost-after (90 s) over the agent's 30 s
REQUEST_TIMEOUT_S = 10.0  # the agent's client (shared/client.py)
BACKOFF_BASE_S = Settings.backoff_base
BACKOFF_CAP_S = Settings.backoff_cap
DEFAULT_RETRY_AFTER_S = 1.0  # a 503 without Retry-After (a violation, counted) waits this
TENANT = "acme"
QUOTA_GPUS = 1_000_000
GPUS_ASKED = (1, 1, 2, 4, 8)
PROJECTED_HOSTS = 100_000
KNEE_SIZES = (2000, 5000, 10000, 20000)
KNEE_P99_S = 1.0
# The storm gives up after this many intervals, or 60 s, or N / STORM_DEADLINE_RATE s.
STORM_DEADLINE_INTERVALS = 12
STORM_DEADLINE_RATE = 50.0
JOIN_DEADLINE_S = 600.0
LAG_TICK_S = 0.05
# Reports fall due on a 20 ms clock: those due together share the client's event loop wakeups
# (an isolated request costs the client about twice the CPU of one among others).
TICK_S = 0.02
SPEC_CONCURRENCY = 64
PASS_METRIC = "bc_reconcile_seconds"  # the leader's reconcile passes (controlplane/metrics.py)
# A durable server, as bench/crash.py runs it (the tests' default turns fsync off).
PG_SETTINGS = ("listen_addresses=127.0.0.1", "max_connections=200")


# --- what the answers say ----------------------------------------------------------------------


class JoinAnswer(msgspec.Struct, rename="camel"):
    node_id: str
    token: str
    inventory_digest: str | None = None  # F9: the agent's first report sends it, as the agent


class ReportAnswer(msgspec.Struct, rename="camel"):
    """nodes/report's answer; the F9 fields default to a daemon without heartbeats."""

    spec_version: str
    inventory_digest: str | None = None
    inventory_wanted: bool = False


class CreatedAnswer(msgspec.Struct):
    id: str
    state: str


REPORT_ANSWER = msgspec.json.Decoder(ReportAnswer)
JOIN_ANSWER = msgspec.json.Decoder(JoinAnswer)
SPEC_ANSWER = msgspec.json.Decoder(NodeSpec)
CREATED_ANSWER = msgspec.json.Decoder(CreatedAnswer)


# --- options -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    nodes: int = 2000
    seconds: float = 60.0
    interval: float = 10.0
    backend: str = "sqlite"
    replicas: int = 1
    postgres_url: str | None = None
    reservations_per_s: float = 5.0
    seed: int = 0
    digest: bool = True
    whole_first: bool = False  # the first report whole, as from agents that just started
    connections: int = 1000
    join_concurrency: int = 64
    daemon_args: tuple[str, ...] = ()

    @property
    def mode(self) -> str:
        digest = ("" if self.digest else ", no digest") + (
            ", whole first" if self.whole_first else ""
        )
        if self.backend == "sqlite":
            return f"sqlite{digest}"
        return f"postgresql x{self.replicas}{digest}"

    def daemon_flags(self) -> list[str]:
        """The compressed intervals first, so that --daemon-arg overrides them (click keeps the
        last of a repeated option)."""
        return [
            "--reconcile-interval",
            f"{self.interval:g}",
            "--node-lost-after",
            f"{max(1.0, LOST_AFTER_INTERVALS * self.interval):g}",
            *self.daemon_args,
        ]


# --- the servers -------------------------------------------------------------------------------


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of a process, of its live descendants, and of the children it reaped
    (``/proc/<pid>/stat`` utime, stime, cutime, cstime through psutil): PostgreSQL's
    postmaster counts every backend, gone or not. 0 for a process that is gone."""
    try:
        process = psutil.Process(pid)
        times = process.cpu_times()
        total = times.user + times.system + times.children_user + times.children_system
        for child in process.children(recursive=True):
            with contextlib.suppress(psutil.Error):
                child_times = child.cpu_times()
                total += child_times.user + child_times.system
    except psutil.Error:
        return 0.0
    return float(total)


@dataclass
class Servers:
    """The daemons (one, or replicas) and the PostgreSQL server's postmaster, when known."""

    bases: list[str]
    daemon_pids: list[int]
    root: str
    postgres_pid: int | None = None
    logs: list[Path] = field(default_factory=list)
    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def cpu(self) -> tuple[float, float | None]:
        """(the daemons' CPU seconds, PostgreSQL's or None when not measured)."""
        daemons = sum(tree_cpu_seconds(pid) for pid in self.daemon_pids)
        postgres = None if self.postgres_pid is None else tree_cpu_seconds(self.postgres_pid)
        return daemons, postgres

    def check_alive(self) -> None:
        for proc, log in zip(self.procs, self.logs, strict=True):
            if proc.poll() is not None:
                raise SetupError(
                    f"a daemon exited with {proc.returncode}; its log {log}:\n{log_tail(log)}"
                )


def postmaster_of(url: str) -> int | None:
    """The postmaster of url's server when it runs on this machine: the parent of a backend."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    try:
        return None if row is None else int(psutil.Process(int(row[0])).ppid())
    except psutil.Error:
        return None


@contextlib.asynccontextmanager
async def servers(
    options: Options, workdir: Path, session: aiohttp.ClientSession
) -> AsyncIterator[Servers]:
    """The daemons of the run, ready; stopped (and the PostgreSQL server) on the way out."""
    ports: list[int] = []  # each daemon binds port 0 and says which it bound
    with contextlib.ExitStack() as stack:
        server: PostgresServer | None = None
        url = options.postgres_url
        if options.backend == "postgresql" and url is None:
            server = PostgresServer(settings=PG_SETTINGS)
            stack.callback(server.stop)
            await asyncio.to_thread(server.start)
            url = await asyncio.to_thread(server.new_database)
        procs, logs = [], []
        for n in range(options.replicas):
            argv = daemon_argv(workdir, 0, *options.daemon_flags())
            if url is not None:
                argv[argv.index("--db") + 1] = url  # a replica (B4); all share one token file
            log = workdir / f"daemon{n}.log"
            proc = stack.enter_context(spawned(argv, log))
            procs.append(proc)
            logs.append(log)
            # The first one makes the schema and root's token; then the others start.
            if n == 0:
                ports.append(await bound_port(proc, log))
                await wait_ready(session, "GET", f"http://{HOST}:{ports[0]}/readyz", proc, log)
        for proc, log in zip(procs[1:], logs[1:], strict=True):
            ports.append(await bound_port(proc, log))
        for proc, port, log in zip(procs[1:], ports[1:], logs[1:], strict=True):
            await wait_ready(session, "GET", f"http://{HOST}:{port}/readyz", proc, log)
        postgres_pid = None
        if server is not None:
            postgres_pid = server.postmaster_pid()
        elif url is not None:
            postgres_pid = await asyncio.to_thread(postmaster_of, url)
        yield Servers(
            bases=[f"http://{HOST}:{port}" for port in ports],
            daemon_pids=[proc.pid for proc in procs],
            root=(workdir / "root.token").read_text().strip(),
            postgres_pid=postgres_pid,
            logs=logs,
            procs=procs,
        )


# --- the fleet ---------------------------------------------------------------------------------


def on_tick(at: float) -> float:
    """at, rounded up to the client's clock (TICK_S)."""
    return math.ceil(at / TICK_S) * TICK_S


@dataclass(eq=False)
class SimAgent:
    """One simulated host's agent: its identity, its credential and what it last heard."""

    base: str  # the replica it talks to
    hostname: str
    machine_id: str
    gpus: list[tuple[str, str]]  # (uuid, serial) per GPU
    phase: float  # its first steady report comes this long after its first answered one
    node_id: str = ""
    headers: dict[str, str] = field(default_factory=dict)
    digest: str | None = None
    heartbeat: bytes = b""  # the digest report, encoded once per digest
    wanted: bool = True  # the next report carries the whole inventory
    spec_version: str | None = None
    news: dict[str, Any] | None = None  # applied and bookings, sent until a report takes them
    first_ok: float | None = None  # monotonic
    first_ok_wall: float | None = None  # epoch seconds
    last_ok_wall: float | None = None  # epoch seconds of its latest report answered 200
    failures: int = 0  # requests in a row with no answer
    busy: bool = False  # a report of its is in flight


@dataclass
class Tally:
    """One phase's requests of one kind."""

    latencies: list[float] = field(default_factory=list)  # answered 200
    statuses: Counter[str] = field(default_factory=Counter)
    shed: int = 0  # 503 with Retry-After
    shed_without_retry_after: int = 0
    timeouts: int = 0
    no_answer: int = 0  # connection errors (timeouts apart)
    retry_waits: list[float] = field(default_factory=list)  # waits after a 503
    backoff_waits: list[float] = field(default_factory=list)  # waits after no answer
    queue_waits: list[float] = field(default_factory=list)  # for a connection slot
    first_error: str | None = None

    @property
    def requests(self) -> int:
        return sum(self.statuses.values())

    @property
    def others(self) -> int:
        """Answers neither 200 nor 503 (4xx, 5xx)."""
        answered = len(self.latencies) + self.shed + self.shed_without_retry_after
        return self.requests - answered - self.timeouts - self.no_answer

    def quantiles_ms(self) -> tuple[float, float]:
        ordered = sorted(self.latencies)
        return percentile(ordered, 50) * 1e3, percentile(ordered, 99) * 1e3

    def summary(self) -> dict[str, Any]:
        p50, p99 = self.quantiles_ms()
        waits = sorted(self.queue_waits)
        return {
            "requests": self.requests,
            "ok": len(self.latencies),
            "p50Ms": round(p50, 2),
            "p99Ms": round(p99, 2),
            "shed": self.shed,
            "shedWithoutRetryAfter": self.shed_without_retry_after,
            "timeouts": self.timeouts,
            "noAnswer": self.no_answer,
            "statuses": dict(self.statuses),
            "meanRetryWaitS": round(statistics.fmean(self.retry_waits), 3)
            if self.retry_waits
            else None,
            "meanBackoffWaitS": round(statistics.fmean(self.backoff_waits), 3)
            if self.backoff_waits
            else None,
            "clientQueueP99Ms": round(percentile(waits, 99) * 1e3, 2),
            "firstError": self.first_error,
        }


@dataclass(frozen=True)
class Outcome:
    status: int | None  # None: no answer
    payload: bytes
    retry_after: float | None
    latency: float


class Fleet:
    """The simulated agents and tenants, on one aiohttp session."""

    def __init__(
        self, options: Options, session: aiohttp.ClientSession, srv: Servers, inventory: Any
    ) -> None:
        self.options = options
        self.session = session
        self.srv = srv
        self.template = inventory
        self.rng = random.Random(f"{options.seed}/fleet")
        self.slots = asyncio.Semaphore(options.connections)
        self.agents = [self.agent(n) for n in range(options.nodes)]
        self.pool_id = ""
        self.join_token = ""
        self.tenant_token = ""
        self.window: tuple[float, float] | None = None  # the steady state's (start, end)
        self.tallies: dict[str, Tally] = {}
        self.whole: Counter[str] = Counter()  # reports that carried the inventory, by phase
        self.reported = 0  # agents with a report answered 200
        self.all_reported = asyncio.Event()

    def agent(self, n: int) -> SimAgent:
        gpus = [
            (f"GPU-{uuid.UUID(int=self.rng.getrandbits(128))}", f"{self.rng.getrandbits(40)}")
            for _ in self.template["gpus"]
        ]
        return SimAgent(
            base=self.srv.bases[n % len(self.srv.bases)],
            hostname=f"sim-h100-{n:05d}",
            machine_id=f"fleet-sim-{self.options.seed}-{n:05d}",
            gpus=gpus,
            phase=self.rng.uniform(0.0, self.options.interval) or self.options.interval,
        )

    def tally(self, name: str) -> Tally:
        found = self.tallies.get(name)
        if found is None:
            found = self.tallies[name] = Tally()
        return found

    def inventory_of(self, agent: SimAgent) -> dict[str, Any]:
        """The recorded host as this machine: its identity, hostname and GPUs."""
        inventory = dict(self.template)
        inventory["machineId"] = agent.machine_id
        inventory["hostname"] = agent.hostname
        inventory["gpus"] = [
            {**gpu, "uuid": gpu_uuid, "serial": serial}
            for gpu, (gpu_uuid, serial) in zip(self.template["gpus"], agent.gpus, strict=True)
        ]
        return inventory

    async def post(self, url: str, data: bytes, headers: dict[str, str], tally: Tally) -> Outcome:
        """One request, counted in tally; its latency from when it had a connection slot."""
        queued = time.monotonic()
        async with self.slots:
            sent = time.monotonic()
            tally.queue_waits.append(sent - queued)
            try:
                async with self.session.post(url, data=data, headers=headers) as resp:
                    payload = await resp.read()
                    status = resp.status
                    retry_after = resp.headers.get("Retry-After")
            except TimeoutError:
                tally.timeouts += 1
                tally.statuses["timeout"] += 1
                return Outcome(None, b"", None, time.monotonic() - sent)
            except (aiohttp.ClientError, OSError) as exc:
                tally.no_answer += 1
                tally.statuses["no answer"] += 1
                if tally.first_error is None:
                    tally.first_error = repr(exc)
                return Outcome(None, b"", None, time.monotonic() - sent)
        latency = time.monotonic() - sent
        tally.statuses[str(status)] += 1
        wait: float | None = None
        if status == 200:
            tally.latencies.append(latency)
        elif status == 503:
            try:
                wait = float(retry_after) if retry_after is not None else None
            except ValueError:
                wait = None
            if wait is None:
                tally.shed_without_retry_after += 1
            else:
                tally.shed += 1
        elif tally.first_error is None:
            tally.first_error = f"HTTP {status}: {payload[:300].decode(errors='replace')}"
        return Outcome(status, payload, wait, latency)

    async def back_off(self, agent: SimAgent, outcome: Outcome, tally: Tally) -> None:
        """As the agent: Retry-After + uniform(0, Retry-After) after a 503; full jitter after no
        answer (uniform(0, min(cap, base x 2^failures)))."""
        if outcome.status == 503:
            after = outcome.retry_after or DEFAULT_RETRY_AFTER_S
            wait = after + self.rng.uniform(0, after)
            tally.retry_waits.append(wait)
        else:
            wait = self.rng.uniform(0, min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**agent.failures))
            agent.failures += 1
            tally.backoff_waits.append(wait)
        await asyncio.sleep(wait)

    # --- setup and joins --------------------------------------------------------------------

    async def setup(self) -> None:
        """As root: a site, the metal-host H100 pool and its join token; tenant acme offered
        the pool with a GPU quota, and its credential."""
        base, root = self.srv.bases[0], self.srv.root
        site = await call(
            self.session,
            base,
            "compute/sites/create",
            root,
            {"tenantId": "root", "name": "sim1", "region": "eu-central", "kind": "shared"},
        )
        pool = await call(
            self.session,
            base,
            "compute/pools/create",
            root,
            {"tenantId": "root", "siteId": site["id"], "class": "metal-host", "gpuModel": "H100"},
        )
        self.pool_id = pool["id"]
        join = await call(
            self.session,
            base,
            "compute/joinTokens/create",
            root,
            {"tenantId": "root", "poolId": self.pool_id, "maxUses": self.options.nodes},
        )
        self.join_token = join["token"]
        await call(self.session, base, "iam/tenants/create", root, {"tenantId": TENANT})
        credential = await call(
            self.session, base, "iam/credentials/create", root, {"tenantId": TENANT}
        )
        self.tenant_token = credential["token"]
        offer = {
            "tenantId": "root",
            "poolId": self.pool_id,
            "toTenantId": TENANT,
            "quota": {"gpu": QUOTA_GPUS},
        }
        await call(self.session, base, "compute/pools/offer", root, offer)

    async def join(self, agent: SimAgent, deadline: float) -> None:
        tally = self.tally("join")
        body = encode(
            {
                "joinToken": self.join_token,
                "attestor": "join-token",
                "hostname": agent.hostname,
                "inventory": self.inventory_of(agent),
            }
        )
        plain = {"Content-Type": "application/json"}
        while time.monotonic() < deadline:
            outcome = await self.post(f"{agent.base}/api/compute/nodes/join", body, plain, tally)
            if outcome.status == 200:
                joined = JOIN_ANSWER.decode(outcome.payload)
                agent.node_id = joined.node_id
                if (
                    self.options.digest
                    and not self.options.whole_first
                    and joined.inventory_digest is not None
                ):
                    agent.digest = joined.inventory_digest
                    agent.heartbeat = encode(
                        {"nodeId": agent.node_id, "inventoryDigest": agent.digest}
                    )
                    agent.wanted = False  # the join holds it: the first report is small too
                agent.headers = {
                    "Content-Type": "application/json",
                    "Authorization": f"Bearer {joined.token}",
                }
                agent.failures = 0
                return
            if outcome.status is not None and outcome.status != 503:
                raise SetupError(
                    f"nodes/join of {agent.hostname} -> HTTP {outcome.status}: "
                    f"{outcome.payload[:300].decode(errors='replace')}"
                )
            await self.back_off(agent, outcome, tally)
        raise SetupError(f"nodes/join of {agent.hostname}: no 200 in {JOIN_DEADLINE_S:.0f} s")

    async def joins(self) -> float:
        """Every agent joins, join_concurrency at a time; the seconds it took."""
        queue = iter(self.agents)
        deadline = time.monotonic() + JOIN_DEADLINE_S

        async def worker() -> None:
            for agent in queue:
                await self.join(agent, deadline)

        started = time.monotonic()
        await asyncio.gather(*(worker() for _ in range(self.options.join_concurrency)))
        return time.monotonic() - started

    async def fetch_spec(self, agent: SimAgent, tally: Tally) -> bool:
        """nodes/spec; what the agent did with it becomes the news of its next report."""
        url = f"{agent.base}/api/compute/nodes/spec"
        data = encode({"nodeId": agent.node_id})
        outcome = await self.post(url, data, agent.headers, tally)
        if outcome.status != 200:
            return False
        spec = SPEC_ANSWER.decode(outcome.payload)
        news: dict[str, Any] = {
            "applied": ApplyReport(
                version=spec.version,
                units=[UnitResult(id=unit.id, status="applied") for unit in spec.units],
            )
        }
        if spec.bookings:
            news["bookings"] = [
                BookingReport(
                    reservation_id=booking.reservation_id,
                    state="delivered" if booking.state == "live" else "released",
                )
                for booking in spec.bookings
            ]
        agent.news = news
        agent.spec_version = spec.version
        return True

    async def specs(self) -> None:
        """Every agent fetches its NodeSpec once joined (the agent's first cycle)."""
        queue = iter(self.agents)
        tally = self.tally("spec")

        async def worker() -> None:
            for agent in queue:
                for _ in range(10):
                    if await self.fetch_spec(agent, tally):
                        break
                    await asyncio.sleep(self.rng.uniform(0.1, 1.0))

        await asyncio.gather(*(worker() for _ in range(SPEC_CONCURRENCY)))

    # --- reports --------------------------------------------------------------------------------

    def phase_of(self, agent: SimAgent, at: float) -> str:
        if agent.first_ok is None:
            return "storm"
        if self.window is not None and self.window[0] <= at < self.window[1]:
            return "steady"
        return "between"

    def report_body(self, agent: SimAgent, phase: str) -> bytes:
        if agent.news is None and not agent.wanted and agent.heartbeat:
            return agent.heartbeat
        body: dict[str, Any] = {"nodeId": agent.node_id}
        if agent.wanted or not agent.heartbeat:
            body["inventory"] = self.inventory_of(agent)
            self.whole[phase] += 1
        else:
            body["inventoryDigest"] = agent.digest
        if agent.news is not None:
            body.update(agent.news)
        return encode(body)

    async def report(self, agent: SimAgent) -> tuple[Outcome, bool]:
        """One report (and the spec when the answer names a new one): (outcome, whether to
        report again at once: the agent reports what it did with a new spec)."""
        phase = self.phase_of(agent, time.monotonic())
        tally = self.tally(phase)
        data = self.report_body(agent, phase)
        outcome = await self.post(
            f"{agent.base}/api/compute/nodes/report", data, agent.headers, tally
        )
        if outcome.status != 200:
            return outcome, False
        agent.failures = 0
        agent.last_ok_wall = time.time()
        if agent.first_ok is None:
            agent.first_ok, agent.first_ok_wall = time.monotonic(), time.time()
            self.reported += 1
            if self.reported == len(self.agents):
                self.all_reported.set()
        answer = REPORT_ANSWER.decode(outcome.payload)
        if self.options.digest and answer.inventory_digest is not None:
            if answer.inventory_digest != agent.digest:
                agent.digest = answer.inventory_digest
                agent.heartbeat = encode({"nodeId": agent.node_id, "inventoryDigest": agent.digest})
            agent.wanted = answer.inventory_wanted
        else:
            agent.wanted = True
        if not agent.wanted:
            agent.news = None  # taken with this report
        if answer.spec_version != agent.spec_version:
            return outcome, await self.fetch_spec(agent, self.tally(f"{phase} spec"))
        return outcome, False

    async def life(self, agent: SimAgent, storm_deadline: float) -> None:
        """The agent from the storm on: its first report until answered, then one every
        interval (the first at its own phase within an interval), until the steady state
        ends. Cancelled between reports at the end."""
        while agent.first_ok is None:
            if time.monotonic() >= storm_deadline:
                return
            outcome, _ = await self.report(agent)
            if outcome.status is None or outcome.status == 503:
                await self.back_off(agent, outcome, self.tally("storm"))
            elif outcome.status != 200:
                await asyncio.sleep(self.options.interval)
        due = agent.first_ok + agent.phase
        while True:
            await asyncio.sleep(on_tick(due) - time.monotonic())
            cycle = time.monotonic()
            if self.window is not None and cycle >= self.window[1]:
                return
            agent.busy = True
            try:
                outcome, again = await self.report(agent)
                if again:  # what it did with the new spec, at once
                    outcome, _ = await self.report(agent)
            finally:
                agent.busy = False
            if outcome.status is None or outcome.status == 503:
                await self.back_off(agent, outcome, self.tally(self.phase_of(agent, cycle)))
                due = time.monotonic()
            else:
                due = cycle + self.options.interval

    # --- tenants ----------------------------------------------------------------------------

    async def tenants(
        self, until: float, created: Counter[str], ends: list[asyncio.Task[None]]
    ) -> None:
        """Reservations created at reservations_per_s (on schedule, each on its own task), each
        ended after 0.5-1.5 intervals while the steady state lasts."""
        rate = self.options.reservations_per_s
        if rate <= 0:
            return
        rng = random.Random(f"{self.options.seed}/tenants")
        headers = {
            "Content-Type": "application/json",
            "Authorization": f"Bearer {self.tenant_token}",
        }
        bases = self.srv.bases
        creates = self.tally("reservations/create")
        ended = self.tally("reservations/end")
        tasks: list[asyncio.Task[None]] = []

        async def end_later(base: str, reservation_id: str, lifetime: float) -> None:
            if time.monotonic() + lifetime >= until:
                return  # it outlives the run
            await asyncio.sleep(lifetime)
            body = encode({"tenantId": TENANT, "reservationId": reservation_id})
            await self.post(f"{base}/api/compute/reservations/end", body, headers, ended)

        async def create(k: int) -> None:
            base = bases[k % len(bases)]
            body = encode(
                {
                    "tenantId": TENANT,
                    "poolId": self.pool_id,
                    "resources": {"gpu": rng.choice(GPUS_ASKED)},
                }
            )
            outcome = await self.post(
                f"{base}/api/compute/reservations/create", body, headers, creates
            )
            if outcome.status != 200:
                return
            answer = CREATED_ANSWER.decode(outcome.payload)
            created[answer.state] += 1
            if answer.state in ("pending", "placed", "active"):
                lifetime = rng.uniform(0.5, 1.5) * self.options.interval
                ends.append(asyncio.create_task(end_later(base, answer.id, lifetime)))

        started = time.monotonic()
        for k in range(math.ceil((until - started) * rate)):
            at = started + k / rate
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            tasks.append(asyncio.create_task(create(k)))
        await asyncio.gather(*tasks)


# --- metrics ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PassTimes:
    """bc_reconcile_seconds on one replica: passes, their sum, and the cumulative buckets."""

    count: float
    total: float
    buckets: tuple[tuple[float, float], ...]  # (le, cumulative count)


def parse_pass_times(text: str) -> PassTimes | None:
    """The leader's pass-duration histogram from a /metrics page; None when absent."""
    for family in text_string_to_metric_families(text):
        if family.name != PASS_METRIC:
            continue
        found = {
            sample.name: sample.value for sample in family.samples if "le" not in sample.labels
        }
        buckets = tuple(
            (float(sample.labels["le"]), sample.value)
            for sample in family.samples
            if sample.name == f"{PASS_METRIC}_bucket"
        )
        count, total = found.get(f"{PASS_METRIC}_count"), found.get(f"{PASS_METRIC}_sum")
        if count is not None and total is not None:
            return PassTimes(count, total, buckets)
    return None


async def scrape(session: aiohttp.ClientSession, srv: Servers) -> list[PassTimes | None]:
    """Each replica's pass times (None where /metrics does not answer root or lacks them)."""
    found: list[PassTimes | None] = []
    for base in srv.bases:
        try:
            async with session.get(
                f"{base}/metrics", headers={"Authorization": f"Bearer {srv.root}"}
            ) as resp:
                text = await resp.text()
                found.append(parse_pass_times(text) if resp.status == 200 else None)
        except (aiohttp.ClientError, OSError, TimeoutError):
            found.append(None)
    return found


def pass_summary(before: list[PassTimes | None], after: list[PassTimes | None]) -> dict[str, Any]:
    """The passes run within the window: on the replica that ran them (the leader), their
    count, mean and the p99 bucket's upper bound."""
    best: dict[str, Any] = {"found": any(p is not None for p in after), "passes": 0}
    for n, (a, b) in enumerate(zip(before, after, strict=True)):
        if a is None or b is None or b.count - a.count <= best["passes"]:
            continue
        passes = b.count - a.count
        counts = [(le, cb - ca) for (le, cb), (_, ca) in zip(b.buckets, a.buckets, strict=True)]
        p99 = next((le for le, c in counts if c >= 0.99 * passes), math.inf)
        best = {
            "found": True,
            "replica": n,
            "passes": int(passes),
            "meanMs": round((b.total - a.total) / passes * 1e3, 2),
            "p99UpToMs": None if math.isinf(p99) else p99 * 1e3,
        }
    return best


# --- the audit ----------------------------------------------------------------------------------


def epoch(at: str) -> float:
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


async def listed(
    fleet: Fleet, path: str, token: str, body: dict[str, Any], bound: int
) -> AsyncIterator[dict[str, Any]]:
    """Every item of a list method (B1: limit 1000, then each page's cursor), at most bound
    pages."""
    cursor: str | None = None
    for _ in range(bound):
        page = (
            {**body, "limit": 1000} if cursor is None else {**body, "limit": 1000, "cursor": cursor}
        )
        answer = await call(fleet.session, fleet.srv.bases[0], path, token, page)
        for item in answer["items"]:
            yield item
        cursor = answer["next"]
        if cursor is None:
            return


async def audit(fleet: Fleet) -> dict[str, Any]:
    """Every node's state as root, and every node.lost event, against what the agents did;
    the tenant's reservations by state."""
    root, options = fleet.srv.root, fleet.options
    states: Counter[str] = Counter()
    lost_now: set[str] = set()
    nodes = {"tenantId": "root", "poolId": fleet.pool_id}
    async for node in listed(fleet, "compute/nodes/list", root, nodes, options.nodes // 1000 + 2):
        states[node["state"]] += 1
        if node["state"] == "lost":
            lost_now.add(node["id"])
    by_id = {agent.node_id: agent for agent in fleet.agents}
    wrongly: set[str] = {node for node in lost_now if by_id[node].first_ok is not None}
    silent = 0
    events, after = 0, 0
    for _ in range(options.nodes * 4 // 1000 + 2):
        body = {"tenantId": "root", "types": ["node.lost"], "limit": 1000, "after": after}
        page = await call(fleet.session, fleet.srv.bases[0], "compute/events/list", root, body)
        for event in page["items"]:
            events += 1
            agent = by_id.get(event["data"]["nodeId"])
            if agent is None:
                continue
            if agent.first_ok_wall is not None and epoch(event["at"]) >= agent.first_ok_wall:
                wrongly.add(agent.node_id)
            else:
                silent += 1
        if not page["items"]:
            break
        after = page["next"]
    reservations: Counter[str] = Counter()
    bound = math.ceil(options.reservations_per_s * options.seconds / 1000) + 2
    mine = {"tenantId": TENANT, "poolId": fleet.pool_id}
    async for item in listed(fleet, "compute/reservations/list", fleet.tenant_token, mine, bound):
        reservations[item["state"]] += 1
    return {
        "nodes": sum(states.values()),
        "states": dict(states),
        "reported": sum(agent.first_ok is not None for agent in fleet.agents),
        "lostAtEnd": len(lost_now),
        "lostEvents": events,
        "lostWhileSilentBeforeFirstReport": silent,
        "wronglyLost": len(wrongly),
        "wronglyLostNodes": [
            {
                "nodeId": node,
                "hostname": by_id[node].hostname,
                "lastReportAnsweredAt": by_id[node].last_ok_wall,
            }
            for node in sorted(wrongly)[:20]
        ],
        "reservations": dict(reservations),
    }


# --- one run --------------------------------------------------------------------------------------


class ClientWatch:
    """How late the client's event loop wakes, and its garbage collector's pauses: a client
    that stalls shows here, not as the servers' latency."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.pauses: list[float] = []
        self._began = 0.0

    def _collecting(self, phase: str, _info: dict[str, int]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
        else:
            self.pauses.append(time.perf_counter() - self._began)

    async def run(self, until: float) -> None:
        gc.callbacks.append(self._collecting)
        try:
            while time.monotonic() < until:
                woken = time.monotonic() + LAG_TICK_S
                await asyncio.sleep(LAG_TICK_S)
                self.lags.append(max(0.0, time.monotonic() - woken))
        finally:
            gc.callbacks.remove(self._collecting)

    def line(self) -> str:
        lags = sorted(self.lags)
        return (
            f"client event loop lag p99 {percentile(lags, 99) * 1e3:.1f} ms, max "
            f"{(lags[-1] if lags else 0) * 1e3:.1f} ms; client GC {len(self.pauses)} "
            f"collections, longest {max(self.pauses, default=0) * 1e3:.1f} ms"
        )


def settle() -> None:
    """Collect, then freeze what is alive (the agents, their tasks, the connections), so that
    the client's collections in the measured phases scan only what is new."""
    gc.collect()
    gc.freeze()


def say(line: str) -> None:
    print(line, flush=True)


def cpu_line(
    what: str, seconds: float, daemons: float, postgres: float | None, client: float
) -> str:
    pg = "" if postgres is None else f", PostgreSQL {postgres:.1f} s"
    return (
        f"  CPU over {what} ({seconds:.1f} s): daemons {daemons:.1f} s{pg}, "
        f"this client {client:.1f} s ({client / seconds * 100:.0f}% of a core)"
    )


def tally_line(name: str, tally: Tally) -> str:
    p50, p99 = tally.quantiles_ms()
    bare = tally.shed_without_retry_after
    return (
        f"  {name}: {tally.requests} requests, {len(tally.latencies)} answered 200 "
        f"(p50 {p50:.1f} ms, p99 {p99:.1f} ms), 503 {tally.shed}"
        + (f" (+{bare} without Retry-After)" if bare else "")
        + f", timeouts {tally.timeouts}, no answer {tally.no_answer}, others {tally.others}"
        + (f"; first error {tally.first_error}" if tally.first_error else "")
    )


async def simulate(options: Options, workdir: Path) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(
        limit=options.connections,
        limit_per_host=math.ceil(options.connections / options.replicas),
    )
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    inventory = msgspec.to_builtins(
        collect_inventory(fixture=DGX_FIXTURE, fixture_host=FIXTURE_HOST)
    )
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        servers(options, workdir, session) as srv,
    ):
        fleet = Fleet(options, session, srv, inventory)
        await fleet.setup()
        say(
            f"fleet_sim: {options.mode}, {options.nodes} agents (the recorded {FIXTURE_HOST}, "
            f"{len(inventory['gpus'])} GPUs each), interval {options.interval:g} s for the "
            f"agent's {AGENT_INTERVAL_S:g} s ({AGENT_INTERVAL_S / options.interval:g} x), "
            f"daemon flags {' '.join(options.daemon_flags())}; {options.connections} "
            f"connections; {os.cpu_count()} CPUs shared by the client and the servers"
        )
        proc = psutil.Process()

        def client_cpu() -> float:
            times = proc.cpu_times()
            return float(times.user + times.system)

        # 1. joins
        cpu0, client0 = srv.cpu(), client_cpu()
        join_s = await fleet.joins()
        cpu1, client1 = srv.cpu(), client_cpu()
        join = fleet.tally("join")
        joins_per_s = options.nodes / join_s
        say(f"1. joins: {options.nodes} in {join_s:.2f} s: {joins_per_s:.0f} joins/s")
        say(tally_line("nodes/join", join))
        say(
            cpu_line(
                "the joins", join_s, cpu1[0] - cpu0[0], pg_delta(cpu0, cpu1), client1 - client0
            )
        )
        spec_started = time.monotonic()
        await fleet.specs()
        specs_s = time.monotonic() - spec_started
        say(f"  then every agent's NodeSpec: {specs_s:.2f} s (not in the figures)")
        say(tally_line("nodes/spec", fleet.tally("spec")))
        srv.check_alive()
        settle()

        # 2. the storm, then 3. the steady state, one task per agent throughout
        storm_deadline = time.monotonic() + max(
            60.0,
            STORM_DEADLINE_INTERVALS * options.interval,
            options.nodes / STORM_DEADLINE_RATE,
        )
        cpu2, client2, storm_at = srv.cpu(), client_cpu(), time.monotonic()
        lives = [asyncio.create_task(fleet.life(a, storm_deadline)) for a in fleet.agents]
        ends: list[asyncio.Task[None]] = []
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(fleet.all_reported.wait(), storm_deadline - storm_at)
            firsts = [a.first_ok - storm_at for a in fleet.agents if a.first_ok is not None]
            drained = len(firsts) == options.nodes
            drain_s = max(firsts) if drained else math.inf
            cpu3, client3 = srv.cpu(), client_cpu()
            storm = fleet.tally("storm")
            storm_s = time.monotonic() - storm_at
            say(
                f"2. first-report storm: {len(firsts)} of {options.nodes} nodes answered 200 "
                + (f"in {drain_s:.2f} s" if drained else f"before the {storm_s:.0f} s deadline")
                + f" ({drain_s / options.interval:.2f} intervals; median node "
                f"{statistics.median(firsts) if firsts else math.nan:.2f} s; whole inventories "
                f"sent {fleet.whole['storm']})"
            )
            say(tally_line("nodes/report", storm))
            say(
                cpu_line(
                    "the storm", storm_s, cpu3[0] - cpu2[0], pg_delta(cpu2, cpu3), client3 - client2
                )
            )

            window_start = time.monotonic() + options.interval
            window_end = window_start + options.seconds
            fleet.window = (window_start, window_end)
            settle()
            before = await scrape(session, srv)  # outside the window: a scrape costs the daemon
            await asyncio.sleep(window_start - time.monotonic())
            watch = ClientWatch()
            watch_task = asyncio.create_task(watch.run(window_end))
            cpu4, client4 = srv.cpu(), client_cpu()
            created: Counter[str] = Counter()
            await fleet.tenants(window_end, created, ends)
            await asyncio.sleep(window_end - time.monotonic())
            cpu5, client5 = srv.cpu(), client_cpu()
            await watch_task
            # The reports in flight at the end finish; the agents waiting for their next stop.
            for agent, task in zip(fleet.agents, lives, strict=True):
                if not agent.busy:
                    task.cancel()
            await asyncio.wait(lives, timeout=2 * REQUEST_TIMEOUT_S)
            await asyncio.gather(*ends, return_exceptions=True)
            after = await scrape(session, srv)
        finally:
            for task in (*lives, *ends):
                task.cancel()
            outcomes = await asyncio.gather(*lives, *ends, return_exceptions=True)
        broken = [o for o in outcomes if isinstance(o, Exception)]
        if broken:  # an agent that died would fall silent: the audit could not be trusted
            raise SetupError(f"{len(broken)} simulated agents failed, the first: {broken[0]!r}")
        srv.check_alive()
        steady = fleet.tally("steady")
        reports = len(steady.latencies)
        reports_per_s = reports / options.seconds
        expected = options.nodes / options.interval
        daemons_cpu, pg_cpu = cpu5[0] - cpu4[0], pg_delta(cpu4, cpu5)
        server_cpu = daemons_cpu + (pg_cpu or 0.0)
        per_thousand = server_cpu / reports * 1000 if reports else math.inf
        creates, ends_tally = fleet.tally("reservations/create"), fleet.tally("reservations/end")
        passes = pass_summary(before, after)
        say(
            f"3. steady state, {options.seconds:g} s: {reports} reports answered 200, "
            f"{reports_per_s:.1f} reports/s of the {expected:.1f}/s expected "
            f"({reports_per_s / expected:.3f} x); whole inventories sent "
            f"{fleet.whole['steady']} of {steady.requests}; new specs fetched "
            f"{fleet.tally('steady spec').requests} (bookings to deliver or release)"
        )
        say(tally_line("nodes/report", steady))
        say(
            f"  agents backed off: {len(steady.retry_waits)} times after a 503 (mean wait "
            f"{statistics.fmean(steady.retry_waits) if steady.retry_waits else 0:.2f} s), "
            f"{len(steady.backoff_waits)} times after no answer; client queue p99 "
            f"{percentile(sorted(steady.queue_waits), 99) * 1e3:.1f} ms"
        )
        say(tally_line("reservations/create", creates) + f"; states {dict(created)}")
        say(tally_line("reservations/end", ends_tally))
        say(cpu_line("the steady state", options.seconds, daemons_cpu, pg_cpu, client5 - client4))
        say(
            f"  server CPU per 1,000 reports: {per_thousand:.2f} s (daemons"
            + ("" if pg_cpu is None else " + PostgreSQL")
            + ("; reports and the reservation load together)" if creates.requests else ")")
        )
        say(f"  {watch.line()}")
        if not passes["found"]:
            say("  leader pass time: bc_reconcile_seconds is not in /metrics (not measured)")
        elif passes["passes"] == 0:
            say("  leader pass time: no reconcile pass ran in the window")
        else:
            p99 = passes["p99UpToMs"]
            say(
                f"  leader pass time (replica {passes['replica']}): {passes['passes']} passes, "
                f"mean {passes['meanMs']:.1f} ms, p99 <= "
                + ("> 30 s" if p99 is None else f"{p99:g} ms")
                + " (histogram bucket)"
            )

        # 4. the audit and the projection
        checked = await audit(fleet)
        reports_100k = PROJECTED_HOSTS / AGENT_INTERVAL_S
        cores = per_thousand / 1000 * reports_100k
        say(
            f"4. audit: {checked['nodes']} nodes {checked['states']}; {checked['reported']} of "
            f"{options.nodes} agents had a report answered; wrongly lost "
            f"{checked['wronglyLost']} (lost at the end {checked['lostAtEnd']}, node.lost events "
            f"{checked['lostEvents']}, of them while silent before a first report "
            f"{checked['lostWhileSilentBeforeFirstReport']}); acme's reservations "
            f"{checked['reservations']}"
        )
        audited = time.time()
        for wrong in checked["wronglyLostNodes"]:
            last = wrong["lastReportAnsweredAt"]
            say(
                f"  WRONGLY LOST {wrong['nodeId']} ({wrong['hostname']}): its agent's last report "
                f"was answered 200 {audited - last:.1f} s before the audit"
            )
        say(
            f"  projection: {PROJECTED_HOSTS:,} hosts at {AGENT_INTERVAL_S:g} s = "
            f"{reports_100k:,.0f} reports/s x {per_thousand:.2f} s per 1,000 = {cores:.1f} cores "
            "(linear in the CPU measured here; the single writer and the reservation load are "
            "not scaled)"
        )
        return {
            "mode": options.mode,
            "backend": options.backend,
            "replicas": options.replicas,
            "nodes": options.nodes,
            "interval": options.interval,
            "seconds": options.seconds,
            "digest": options.digest,
            "joins": {
                "seconds": round(join_s, 3),
                "perSecond": round(joins_per_s, 1),
                **join.summary(),
            },
            "storm": {
                "drained": drained,
                "drainSeconds": round(drain_s, 3) if drained else None,
                "drainIntervals": round(drain_s / options.interval, 3) if drained else None,
                "reported": len(firsts),
                "wholeInventories": fleet.whole["storm"],
                **storm.summary(),
            },
            "steady": {
                "reportsPerSecond": round(reports_per_s, 1),
                "expectedPerSecond": round(expected, 1),
                "wholeInventories": fleet.whole["steady"],
                "specsFetched": fleet.tally("steady spec").requests,
                **steady.summary(),
                "reservations": {
                    "created": dict(created),
                    "create": creates.summary(),
                    "end": ends_tally.summary(),
                },
                "cpu": {
                    "daemonSeconds": round(daemons_cpu, 2),
                    "postgresSeconds": None if pg_cpu is None else round(pg_cpu, 2),
                    "clientSeconds": round(client5 - client4, 2),
                    "serverPerThousandReports": round(per_thousand, 3) if reports else None,
                },
                "clientLagP99Ms": round(percentile(sorted(watch.lags), 99) * 1e3, 2),
                "clientGcLongestMs": round(max(watch.pauses, default=0) * 1e3, 2),
                "leaderPass": passes,
            },
            "audit": checked,
            "projection": {
                "hosts": PROJECTED_HOSTS,
                "intervalS": AGENT_INTERVAL_S,
                "cores": round(cores, 1) if reports else None,
            },
        }


def pg_delta(a: tuple[float, float | None], b: tuple[float, float | None]) -> float | None:
    return None if a[1] is None or b[1] is None else b[1] - a[1]


def run(options: Options) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-fleet-sim-") as tmp:
        try:
            return asyncio.run(simulate(options, Path(tmp)))
        finally:
            gc.unfreeze()  # the next run's garbage collector sees this one's leftovers


# --- the report -----------------------------------------------------------------------------------


def failed(summary: dict[str, Any]) -> list[str]:
    """What makes the exit status 1."""
    found = []
    if summary["audit"]["wronglyLost"]:
        found.append(f"{summary['audit']['wronglyLost']} nodes wrongly lost")
    if summary["audit"]["reported"] != summary["nodes"]:
        found.append(f"only {summary['audit']['reported']} of {summary['nodes']} nodes reported")
    shed_bare = sum(
        part["shedWithoutRetryAfter"]
        for part in (summary["joins"], summary["storm"], summary["steady"])
    )
    if shed_bare:
        found.append(f"{shed_bare} answers 503 without Retry-After")
    return found


def shown(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def rows(summaries: list[dict[str, Any]]) -> list[str]:
    cells = []
    for s in summaries:
        steady, storm = s["steady"], s["storm"]
        cells.append(
            (
                s["mode"],
                str(s["nodes"]),
                f"{steady['reportsPerSecond']:.1f}",
                f"{steady['p50Ms']:.1f}/{steady['p99Ms']:.1f}",
                str(s["audit"]["wronglyLost"]),
                shown(storm["drainSeconds"], 2),
                f"{s['joins']['perSecond']:.0f}",
                shown(steady["cpu"]["serverPerThousandReports"], 2),
                f"{steady['reservations']['create']['p99Ms']:.1f}",
                str(steady["shed"] + storm["shed"]),
                shown(s["projection"]["cores"], 1),
            )
        )
    return table(
        (
            "mode",
            "N",
            "reports/s",
            "p50/p99 ms",
            "lost",
            "drain s",
            "joins/s",
            "CPU s/1k",
            "resv p99 ms",
            "503s",
            "cores@100k",
        ),
        cells,
    )


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=2000, help="simulated agents (default 2000)")
    parser.add_argument("--seconds", type=float, default=60.0, help="steady state (default 60)")
    parser.add_argument(
        "--interval",
        type=float,
        default=10.0,
        help=f"real seconds for the agent's {AGENT_INTERVAL_S:g} s report interval (default 10)",
    )
    parser.add_argument("--backend", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--replicas", type=int, help="postgresql: serve replicas, 1-3 (default 3)")
    parser.add_argument(
        "--postgres-url", help="postgresql: an empty database to use instead of a server of its own"
    )
    parser.add_argument("--reservations-per-s", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--no-digest", action="store_true", help="whole inventories every report")
    parser.add_argument(
        "--whole-first",
        action="store_true",
        help="the first report carries the whole inventory (agents that just started: a "
        "power-on), not the join's digest",
    )
    parser.add_argument(
        "--connections", type=int, default=1000, help="requests in flight at most (default 1000)"
    )
    parser.add_argument("--join-concurrency", type=int, default=64)
    parser.add_argument(
        "--daemon-arg",
        action="append",
        default=[],
        help="a flag for every daemon (split as a shell would), after the simulator's own",
    )
    parser.add_argument("--knee", action="store_true", help="N over --knee-sizes until p99 > 1 s")
    parser.add_argument(
        "--knee-sizes", default=",".join(str(n) for n in KNEE_SIZES), help="for --knee"
    )
    parser.add_argument("--json", action="store_true", help="end with one JSON line")
    args = parser.parse_args(argv)
    if args.backend == "sqlite" and (args.replicas not in (None, 1) or args.postgres_url):
        parser.error("--replicas and --postgres-url are for --backend postgresql")
    args.replicas = args.replicas or (1 if args.backend == "sqlite" else 3)
    if not 1 <= args.replicas <= 3:
        parser.error("--replicas: 1, 2 or 3")
    if args.nodes < 1 or args.seconds <= 0 or args.interval <= 0:
        parser.error("--nodes, --seconds and --interval must be positive")
    if args.connections < 1 or args.join_concurrency < 1 or args.reservations_per_s < 0:
        parser.error("--connections and --join-concurrency positive, --reservations-per-s >= 0")
    return args


def options_of(args: argparse.Namespace, nodes: int) -> Options:
    return Options(
        nodes=nodes,
        seconds=args.seconds,
        interval=args.interval,
        backend=args.backend,
        replicas=args.replicas,
        postgres_url=args.postgres_url,
        reservations_per_s=args.reservations_per_s,
        seed=args.seed,
        digest=not args.no_digest,
        whole_first=args.whole_first,
        connections=min(args.connections, max(nodes, 1)),
        join_concurrency=args.join_concurrency,
        daemon_args=tuple(arg for flag in args.daemon_arg for arg in shlex.split(flag)),
    )


def sizes_of(args: argparse.Namespace) -> list[int]:
    if not args.knee:
        return [args.nodes]
    sizes = [int(n) for n in args.knee_sizes.split(",") if n.strip()]
    if not sizes or min(sizes) < 1:
        raise SetupError(f"--knee-sizes: positive counts, not {args.knee_sizes!r}")
    return sizes


@contextlib.contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM unwinds like Ctrl-C, so every process and directory is cleaned up."""

    def interrupt(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous: Callable[..., Any] | int | None = signal.signal(signal.SIGTERM, interrupt)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    summaries: list[dict[str, Any]] = []
    try:
        with terminated_as_interrupt():
            for nodes in sizes_of(args):
                summary = run(options_of(args, nodes))
                summaries.append(summary)
                steady_p99 = summary["steady"]["p99Ms"] / 1e3
                if args.knee and (steady_p99 > KNEE_P99_S or failed(summary)):
                    say(
                        f"knee: N = {nodes} (report p99 {steady_p99:.2f} s, wrongly lost "
                        f"{summary['audit']['wronglyLost']}, reported "
                        f"{summary['audit']['reported']} of {nodes})"
                    )
                    break
                say("")
    except SetupError as exc:
        print(f"fleet_sim: setup failed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fleet_sim: interrupted; servers stopped", file=sys.stderr)
        return 130
    say(
        "summary (lost: wrongly lost; drain: the first-report storm; CPU: the daemons' (and "
        "PostgreSQL's) per 1,000 reports in the steady state)"
    )
    for line in rows(summaries):
        say(line)
    problems = [problem for summary in summaries for problem in failed(summary)]
    for problem in problems:
        say(f"FAIL {problem}")
    if args.json:
        say(json.dumps({"runs": summaries}))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
