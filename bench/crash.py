"""Crash harness for R7 and F6: kill -9 the real daemon under concurrent writes, then audit.

Run it with ``make bench`` (which runs ``.venv/bin/python bench/crash.py``) or directly::

    .venv/bin/python bench/crash.py [--rounds 10] [--clients 8] [--seed N]
    .venv/bin/python bench/crash.py --postgres [--rounds 3] [--replicas 3] [--clients 8] [--seed N]

What it does, in one run (SQLite, the default):

1. Starts the real daemon (``better-compute-controlplane serve --db DIR/bc.db --listen
   127.0.0.1:PORT --root-token-file DIR/root.token``) on a fresh database in a temporary
   directory, on a free port of 127.0.0.1, its output in ``DIR/controlplane.log``.
2. Sets it up over HTTP as root: tenants ``acme``, ``globex`` and ``initech`` with a credential
   each, one shared site, two exclusive H100 pools offered to every tenant (quota ``gpu``,
   ``vcpu``, ``memoryGiB``), and three joined hosts per pool: the recorded DGX H100
   (``better-compute-agent inventory --fixture agent/fixtures/host-fixtures.json --fixture-host
   dgx-h100-01``), each given its own machine id, hostname and GPU UUIDs (a machine id is a
   node's identity). A reporter sends each node's unchanged inventory every half second, so
   placed reservations become active.
3. Runs ``--clients`` concurrent clients (one aiohttp session, bounded in time and count)
   mutating: ``pools/create`` (with an idempotency key), ``pools/offer``, ``quotas/set`` (each
   (pool, tenant) pair's ``memoryGiB`` row has one client that only ever raises it, so the last
   acknowledged value is a floor), ``reservations/create`` (with an idempotency key) and
   ``reservations/end``. Every HTTP 200 is an acknowledged write, kept with what it answered; a
   request that got no answer is in doubt and is retried with the same body (at most 3 times).
4. ``--rounds`` times, after a random stretch of load (``--min-up``..``--max-up`` seconds), sends
   SIGKILL to the daemon while the clients keep sending (requests are in flight), audits the
   database file, restarts the daemon on the same database, audits again and lets the clients
   go on; a daemon that cannot start again on the crashed database is a violation. At the end it
   stops the clients, stops the daemon with SIGTERM and audits once more.

With ``--postgres`` (F6) the same setup, load and audit run against ``--replicas`` (default 3)
``serve --db postgresql://…`` replicas of one durable PostgreSQL server the harness starts
(tests/postgres.py's ``PostgresServer``, fsync and synchronous_commit on) in ``DIR``'s place;
the first replica bootstraps root and the others share its token file, and each replica reaches
the database through its own TCP proxy (tests/tcp_proxy.py). The clients spread their requests
over the replicas at random and never pause; an answer 503 (``UNAVAILABLE``, which must carry
``Retry-After``) or none is in doubt and sent again with the same body, to any replica, after
Retry-After (capped at 0.5 s), at most 30 times. ``--rounds`` times, the four fault kinds in
turn, each after a random stretch of load:

- ``kill -9``: SIGKILL of a random replica, restarted on the database a moment later;
- ``restart -m fast`` and ``restart -m immediate``: ``pg_ctl stop -m fast|immediate`` (immediate
  is a crash: recovery from the WAL), down 0.2-1 s, started again on the same port;
- ``cut``: a random replica's proxy drops every connection and refuses new ones for 1-2 s, then
  lets them through again.

After each fault every replica must serve again within 20 s, with no restart but the killed
one's (F1): ``/readyz`` answers 200 and it has acknowledged a client's write since the fault
ended. Then the database is audited; at the end the replicas get SIGTERM and it is audited once
more. It prints each fault, then per kind the count and the violations.

Each audit reads one consistent snapshot: SQLite's file opened read-only with sqlite3
(``mode=ro``) in one read transaction; PostgreSQL with psycopg in one REPEATABLE READ read-only
transaction, begun after the acknowledged writes it checks were taken:

- SQLite: ``PRAGMA integrity_check`` is ``ok``; ``PRAGMA foreign_key_check`` finds nothing.
  PostgreSQL: no invalid index, no unvalidated foreign key, and no dangling reference (an
  anti-join per referencing column, ``REFERENCES``, node_devices.reservation_id included);
- events ``seq`` run 1..max without a gap;
- each quota row's ``used`` is the sum over live reservations (pending, placed, active) of that
  (pool, tenant, resource), and no live reservation counts against a row that does not exist;
- each ``node_resources`` row's ``allocated`` is the sum of the bookings of held reservations
  (placed, active, or ended with delivery ``releasing``/``release-blocked``: D7) on it, and
  never exceeds ``capacity``;
- each GPU atom (``node_devices``) is either free (no reservation) or booked by exactly one held
  reservation on that node, which holds a booking for that many atoms; each held reservation's
  bookings are exactly what it asked for;
- every change carries its event (a pool has ``pool.created``; a reservation
  ``reservation.created`` or ``reservation.failed``, and ``.placed``/``.active``/``.ended`` as its
  state says);
- every acknowledged write is there: created pools exist, offers exist, a ``quotas/set`` row is
  at least the acknowledged value, reservations exist with what was asked and a state at least
  as far as acknowledged (pending < placed < active < ended|failed), ended ones are ended, and
  an event exists for each (``pool.created``, ``pool.offered``, ``quota.updated``,
  ``reservation.created``/``.failed``/``.placed``/``.ended``).

Any answer 500 or more (but ``--postgres``'s 503 ``UNAVAILABLE`` with ``Retry-After``) is a
violation too. It prints the rounds (or faults), the acknowledged writes, the checks made and
the violations (expected 0). Exit status: 0 when there is no violation, 1 when there is one, 2
when the setup failed. The helpers that start and poll processes are bench/api.py's.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import importlib.util
import json
import math
import os
import random
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from collections import Counter, defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, TextIO

import aiohttp
import psycopg

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))  # tests/postgres.py and tests/tcp_proxy.py, for --postgres
from tests.postgres import PostgresServer  # noqa: E402
from tests.tcp_proxy import TcpProxy  # noqa: E402

FIXTURES = HERE.parent / "agent" / "fixtures" / "host-fixtures.json"
FIXTURE_HOST = "dgx-h100-01"


def _bench_api() -> ModuleType:
    """bench/api.py, loaded by path (this file also runs imported by path from the tests)."""
    name = "bench_api"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / "api.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


bench_api = _bench_api()
HOST: str = bench_api.HOST  # 127.0.0.1 only
SetupError: type[Exception] = bench_api.SetupError

TENANTS = ("acme", "globex", "initech")
PLACEMENT_POOLS = 2
NODES_PER_POOL = 3
SETUP_QUOTA = {"gpu": 8, "vcpu": 96, "memoryGiB": 512}
REQUEST_TIMEOUT_S = 10.0
REPORT_EVERY_S = 0.5
RECONCILE_INTERVAL_S = 0.5
MIN_LIFETIME_S = 1.0  # a reservation is ended no sooner than this after its creation
RETRIES = 3  # an in-doubt request is sent again with the same body at most this many times
STOP_TIMEOUT_S = 15.0
# --postgres: a 503 (the database away) or no answer is in doubt; it is sent again, to any
# replica, after Retry-After (at most PG_RETRY_AFTER_S), this many times at most.
PG_RETRIES = 30
PG_RETRY_AFTER_S = 0.5
PG_READY_AGAIN_S = 20.0  # every replica serves again within this after a fault (F1)
# A durable server: the tests' defaults turn fsync and synchronous_commit off, which loses
# commits on `pg_ctl stop -m immediate` by design.
PG_SETTINGS = ("listen_addresses=127.0.0.1", "max_connections=200")
FAULTS = ("kill -9", "restart -m fast", "restart -m immediate", "cut")
FAULT_NAMES = {
    "kill -9": "kill -9 of a replica, restarted",
    "restart -m fast": "pg_ctl restart -m fast",
    "restart -m immediate": "pg_ctl restart -m immediate",
    "cut": "a replica cut from the database (TCP proxy), restored",
}

LIVE = ("pending", "placed", "active")  # counted against quota
HELD = ("placed", "active")  # holding bookings on a node
ATOMS = ("gpu", "gpu.mig", "gpu.slot")
RANK = {"pending": 0, "placed": 1, "active": 2, "ended": 3, "failed": 3}
TERMINAL = ("ended", "failed")
OPS = (
    ("reservations/create", 40),
    ("reservations/end", 25),
    ("quotas/set", 12),
    ("pools/offer", 12),
    ("pools/create", 11),
)


# --- the record of acknowledged writes ---------------------------------------------------------


@dataclass
class Ledger:
    """What the daemon acknowledged (HTTP 200), and what it did not answer."""

    writes: Counter[str] = field(default_factory=Counter)
    in_doubt: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)  # "op CODE"
    unavailable: Counter[str] = field(default_factory=Counter)  # --postgres: 503s, retried
    slowest_s: float = 0.0  # the longest a mutation waited for an answer (seen by the client)
    created_states: Counter[str] = field(default_factory=Counter)
    pools: set[str] = field(default_factory=set)
    offers: set[tuple[str, str]] = field(default_factory=set)
    quota_floor: dict[tuple[str, str], int] = field(default_factory=dict)  # memoryGiB
    reservations: dict[str, str] = field(default_factory=dict)  # id -> furthest acked state
    asked: dict[str, tuple[str, str, dict[str, int]]] = field(default_factory=dict)
    ended: dict[str, str] = field(default_factory=dict)  # id -> state reservations/end answered
    reports: int = 0

    def total(self) -> int:
        return sum(self.writes.values())

    def snapshot(self) -> Ledger:
        return copy.deepcopy(self)

    def reservation(self, rid: str, state: str) -> None:
        before = self.reservations.get(rid)
        if before is None or RANK[state] > RANK[before]:
            self.reservations[rid] = state


@dataclass(frozen=True)
class Node:
    node_id: str
    pool_id: str
    token: str
    inventory: dict[str, Any]


@dataclass
class World:
    """The set-up fleet and what the clients may act on."""

    root: str
    site_id: str
    tokens: dict[str, str]  # tenant -> its admin credential
    placement_pools: list[str]
    nodes: list[Node]
    visible: dict[str, list[str]]  # tenant -> pools offered to it (setup and acknowledged)
    created_pools: list[str] = field(default_factory=list)
    quota_pairs: list[tuple[str, str]] = field(default_factory=list)  # (pool, tenant) with offers
    quota_next: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class Options:
    rounds: int = 10
    clients: int = 8
    seed: int = 0
    min_up_s: float = 0.4  # load between a restart and the next kill: uniform in [min, max]
    max_up_s: float = 1.6
    max_seconds: float = 600.0  # the whole run
    max_ops: int = 100_000  # per client
    workdir: Path | None = None
    postgres: bool = False  # the PostgreSQL mode: replicas and database faults
    replicas: int = 3
    # --postgres: called with the database's URL and the final ledger once the replicas have
    # stopped, before the server does (a test copies the database to damage it).
    at_end: Callable[[PostgresServer, str, Ledger], None] | None = None


@dataclass
class Audit:
    where: str
    checks: int = 0
    violations: list[str] = field(default_factory=list)

    def check(self, ok: bool, message: str) -> None:
        self.checks += 1
        if not ok:
            self.violations.append(f"{self.where}: {message}")


@dataclass
class FaultStats:
    """--postgres: one fault kind's count, what it met and what its audits found."""

    count: int = 0
    in_flight: int = 0
    recovery_s: list[float] = field(default_factory=list)  # until every replica serves again
    checks: int = 0
    violations: list[str] = field(default_factory=list)


@dataclass
class Result:
    seed: int
    rounds: int
    ledger: Ledger
    audits: list[Audit]
    seconds: float
    restarts_s: list[float]
    in_flight_at_kill: list[int]
    server_errors: list[str]
    faults: dict[str, FaultStats] = field(default_factory=dict)  # --postgres only

    @property
    def checks(self) -> int:
        return sum(a.checks for a in self.audits)

    @property
    def violations(self) -> list[str]:
        return [v for a in self.audits for v in a.violations] + self.server_errors


# --- the daemon ---------------------------------------------------------------------------------


class Daemon:
    """`better-compute-controlplane serve` on one database and port, killed and restarted."""

    def __init__(self, workdir: Path, port: int) -> None:
        self.db = workdir / "bc.db"
        self.token_file = workdir / "root.token"
        self.log = workdir / "controlplane.log"
        self.port = port
        self.url = f"http://{HOST}:{port}"
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def location(self) -> str:
        """What --db says: the SQLite file (a replica's is a PostgreSQL URL)."""
        return str(self.db)

    def spawn(self) -> None:
        argv = [
            bench_api.daemon_executable(),
            "serve",
            "--db",
            self.location,
            "--listen",
            f"{HOST}:{self.port}",
            "--root-token-file",
            str(self.token_file),
            "--reconcile-interval",
            str(RECONCILE_INTERVAL_S),
            "--log-format",
            "json",
        ]
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )

    async def start(self, session: aiohttp.ClientSession) -> None:
        await asyncio.to_thread(self.spawn)
        assert self.proc is not None
        await bench_api.wait_ready(session, "GET", f"{self.url}/readyz", self.proc, self.log)

    def kill9(self) -> None:
        """SIGKILL: no shutdown code runs; the database is left as the crash leaves it."""
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise SetupError(
                f"the daemon exited on its own with {self.proc.returncode}:\n"
                f"{bench_api.log_tail(self.log)}"
            )
        os.kill(self.proc.pid, signal.SIGKILL)

    def reap(self) -> None:
        assert self.proc is not None
        self.proc.wait(timeout=STOP_TIMEOUT_S)
        self.proc = None

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; the exit status (None: not running)."""
        if self.proc is None:
            return None
        proc, self.proc = self.proc, None
        code: int = bench_api.stop(proc)
        return code


class Replica(Daemon):
    """--postgres: one `serve --db postgresql://…` replica; all share one root token file."""

    def __init__(self, workdir: Path, n: int, db_url: str) -> None:
        super().__init__(workdir, bench_api.free_port())
        self.n = n
        self.db_url = db_url
        self.log = workdir / f"replica{n}.log"

    @property
    def location(self) -> str:
        return self.db_url


# --- HTTP -----------------------------------------------------------------------------------------


async def post(
    session: aiohttp.ClientSession, base: str, path: str, token: str | None, body: dict[str, Any]
) -> tuple[int | None, Any]:
    """POST /api/<path>: (status, decoded answer), or (None, None) when no answer came."""
    status, answer, _ = await post_full(session, base, path, token, body)
    return status, answer


async def post_full(
    session: aiohttp.ClientSession, base: str, path: str, token: str | None, body: dict[str, Any]
) -> tuple[int | None, Any, str | None]:
    """As post, with the answer's Retry-After header (None when absent or no answer)."""
    try:
        async with session.post(
            f"{base}/api/{path}", data=bench_api.encode(body), headers=bench_api.headers(token)
        ) as resp:
            payload = await resp.read()
            retry_after = resp.headers.get("Retry-After")
            try:
                return resp.status, json.loads(payload), retry_after
            except ValueError:
                return resp.status, None, retry_after
    except (aiohttp.ClientError, OSError, TimeoutError):
        return None, None, None


def agent_executable() -> str:
    beside = Path(sys.executable).with_name("better-compute-agent")
    if beside.exists():
        return str(beside)
    venv = HERE.parent / ".venv" / "bin" / "better-compute-agent"
    if venv.exists():
        return str(venv)
    found = shutil.which("better-compute-agent")
    if found is None:
        raise SetupError("better-compute-agent not found; run `make bench` to install it")
    return found


def recorded_inventory() -> dict[str, Any]:
    """The recorded DGX H100 as `better-compute-agent inventory` prints it."""
    argv = [agent_executable(), "inventory", "--fixture", str(FIXTURES)]
    done = subprocess.run(
        [*argv, "--fixture-host", FIXTURE_HOST], capture_output=True, timeout=60, check=False
    )
    if done.returncode != 0:
        raise SetupError(f"{argv} failed: {done.stderr.decode(errors='replace')}")
    inventory: dict[str, Any] = json.loads(done.stdout)
    return inventory


def host_inventory(recorded: dict[str, Any], n: int, rng: random.Random) -> dict[str, Any]:
    """The recorded host as a distinct machine: its own machine id, hostname and GPU UUIDs."""
    inventory = copy.deepcopy(recorded)
    inventory["machineId"] = f"crash-machine-{n:03d}"
    inventory["hostname"] = f"crash-h100-{n:03d}"
    for gpu in inventory["gpus"]:
        gpu["uuid"] = f"GPU-{uuid.UUID(int=rng.getrandbits(128))}"
    return inventory


async def setup(
    session: aiohttp.ClientSession, daemon: Daemon, rng: random.Random
) -> tuple[World, Ledger]:
    base = daemon.url
    root = daemon.token_file.read_text().strip()

    async def call(path: str, body: dict[str, Any], token: str | None = root) -> Any:
        return await bench_api.call(session, base, path, token, body)

    tokens = {}
    for tenant in TENANTS:
        await call("iam/tenants/create", {"tenantId": tenant})
        tokens[tenant] = (await call("iam/credentials/create", {"tenantId": tenant}))["token"]
    site = await call(
        "compute/sites/create",
        {"tenantId": "root", "name": "crash1", "region": "eu-central", "kind": "shared"},
    )
    recorded = await asyncio.to_thread(recorded_inventory)
    if len(recorded.get("gpus", [])) == 0:
        raise SetupError(f"the recorded host {FIXTURE_HOST} reports no GPU")
    ledger = Ledger()
    pools: list[str] = []
    nodes: list[Node] = []
    for p in range(PLACEMENT_POOLS):
        pool = await call(
            "compute/pools/create",
            {
                "tenantId": "root",
                "siteId": site["id"],
                "class": "metal-host",
                "gpuModel": "H100",
                "policy": {"maxPending": "6h"},
                "idempotencyKey": f"crash-setup-pool-{p}",
            },
        )
        pools.append(pool["id"])
        ledger.pools.add(pool["id"])
        for tenant in TENANTS:
            body = {
                "tenantId": "root",
                "poolId": pool["id"],
                "toTenantId": tenant,
                "quota": SETUP_QUOTA,
            }
            await call("compute/pools/offer", body)
            ledger.offers.add((pool["id"], tenant))
        join = await call(
            "compute/joinTokens/create",
            {"tenantId": "root", "poolId": pool["id"], "maxUses": NODES_PER_POOL},
        )
        for k in range(NODES_PER_POOL):
            inventory = host_inventory(recorded, p * NODES_PER_POOL + k, rng)
            joined = await call(
                "compute/nodes/join",
                {
                    "joinToken": join["token"],
                    "attestor": "join-token",
                    "hostname": inventory["hostname"],
                    "inventory": inventory,
                },
                token=None,
            )
            nodes.append(Node(joined["nodeId"], pool["id"], joined["token"], inventory))
            # The agent's first cycle: the NodeSpec applied, so the node is ready (H1).
            spec = await call("compute/nodes/spec", {"nodeId": joined["nodeId"]}, joined["token"])
            units = [{"id": u["id"], "status": "applied"} for u in spec["units"]]
            await call(
                "compute/nodes/report",
                {
                    "nodeId": joined["nodeId"],
                    "inventory": inventory,
                    "applied": {"version": spec["version"], "units": units},
                },
                joined["token"],
            )
    world = World(
        root=root,
        site_id=site["id"],
        tokens=tokens,
        placement_pools=pools,
        nodes=nodes,
        visible={tenant: list(pools) for tenant in TENANTS},
    )
    for pool_id in pools:
        for tenant in TENANTS:
            world.quota_pairs.append((pool_id, tenant))
            world.quota_next[(pool_id, tenant)] = SETUP_QUOTA["memoryGiB"]
    # Every node must have its rows and atoms before the load starts.
    capacity = await call("compute/pools/capacity", {"tenantId": "root", "poolId": pools[0]})
    gpus = {row["resource"]: row["total"] for row in capacity["items"]}.get("gpu", 0)
    if gpus != NODES_PER_POOL * len(recorded["gpus"]):
        raise SetupError(f"pool {pools[0]} has {gpus} gpu atoms: {capacity}")
    return world, ledger


# --- the load -----------------------------------------------------------------------------------


def owner_of(pair: tuple[str, str], clients: int) -> int:
    """The one client that sets this (pool, tenant) pair's memoryGiB quota."""
    return zlib.crc32(f"{pair[0]}/{pair[1]}".encode()) % clients


@dataclass
class Plan:
    op: str
    token: str
    body: dict[str, Any]
    tries: int = 0


@dataclass
class Harness:
    world: World
    ledger: Ledger
    daemon: Daemon
    session: aiohttp.ClientSession
    options: Options
    deadline: float
    urls: list[str] = field(default_factory=list)  # --postgres: every replica's
    pick: random.Random = field(default_factory=random.Random)  # which replica a request goes to
    answered_at: dict[str, float] = field(default_factory=dict)  # url -> its latest HTTP 200
    up: asyncio.Event = field(default_factory=asyncio.Event)
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    in_flight: int = 0
    server_errors: list[str] = field(default_factory=list)

    def running(self) -> bool:
        return not self.stop.is_set() and time.monotonic() < self.deadline

    async def wait_up(self) -> bool:
        """Wait (bounded) for the daemon to be serving; False when the run is over."""
        while self.running() and not self.up.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.up.wait(), 0.5)
        return self.running()

    def target(self) -> str:
        """The daemon to send to: the one, or (--postgres) any replica, spread at random."""
        return self.pick.choice(self.urls) if len(self.urls) > 1 else self.daemon.url

    async def send(
        self, path: str, token: str, body: dict[str, Any]
    ) -> tuple[int | None, Any, str | None]:
        self.in_flight += 1
        sent, url = time.monotonic(), self.target()
        try:
            answer = await post_full(self.session, url, f"compute/{path}", token, body)
        finally:
            self.in_flight -= 1
        if answer[0] is not None:
            self.ledger.slowest_s = max(self.ledger.slowest_s, time.monotonic() - sent)
        if answer[0] == 200:
            self.answered_at[url] = time.monotonic()
        return answer


def plan(h: Harness, idx: int, n: int, rng: random.Random, live: dict[str, float]) -> Plan | None:
    """The next mutation of client ``idx`` (its ``n``-th), or None when it has nothing to do."""
    world = h.world
    op = rng.choices([name for name, _ in OPS], [weight for _, weight in OPS])[0]
    seed = h.options.seed
    body: dict[str, Any]
    if op == "reservations/end":
        # Reservations live a while (long enough to become active) before they are ended.
        old = [rid for rid, at in live.items() if time.monotonic() - at >= MIN_LIFETIME_S]
        if not old:
            op = "reservations/create"
        else:
            rid = rng.choice(old)
            tenant = h.ledger.asked[rid][1]
            body = {"tenantId": tenant, "reservationId": rid}
            return Plan(op, world.tokens[tenant], body)
    if op == "reservations/create":
        tenant = rng.choice(TENANTS)
        # Mostly the pools with hosts; now and then one without (its reservations stay pending).
        others = [p for p in world.visible[tenant] if p not in world.placement_pools]
        if others and rng.random() < 0.25:
            pool_id = rng.choice(others)
        else:
            pool_id = rng.choice(world.placement_pools)
        resources = {"gpu": rng.randint(1, 3), "vcpu": 8 * rng.randint(1, 4)}
        if pool_id in world.placement_pools and rng.random() < 0.8:
            resources["memoryGiB"] = 64 * rng.randint(1, 4)  # a row only those pools offer
        elif rng.random() < 0.05:
            resources["memoryGiB"] = 64  # no row until quotas/set makes one: QuotaExceeded
        body = {
            "tenantId": tenant,
            "poolId": pool_id,
            "resources": resources,
            "idempotencyKey": f"crash-res-{seed}-{idx}-{n}",
        }
        return Plan(op, world.tokens[tenant], body)
    if op == "quotas/set":
        mine = [pair for pair in world.quota_pairs if owner_of(pair, h.options.clients) == idx]
        if not mine:
            return None
        pair = rng.choice(mine)
        value = world.quota_next[pair] + rng.randint(1, 64)  # only ever raised, by one client
        world.quota_next[pair] = value
        body = {
            "tenantId": "root",
            "poolId": pair[0],
            "forTenantId": pair[1],
            "quota": {"memoryGiB": value},
        }
        return Plan(op, world.root, body)
    if op == "pools/offer":
        choices = world.placement_pools + world.created_pools
        body = {
            "tenantId": "root",
            "poolId": rng.choice(choices),
            "toTenantId": rng.choice(TENANTS),
            "quota": {"gpu": rng.randint(4, 12), "vcpu": rng.choice((64, 96, 128))},
        }
        return Plan(op, world.root, body)
    body = {
        "tenantId": "root",
        "siteId": world.site_id,
        "class": "metal-host",
        "gpuModel": "H100",
        "policy": {"maxPending": "6h", "crash": {"client": idx, "n": n}},
        "idempotencyKey": f"crash-pool-{seed}-{idx}-{n}",
    }
    return Plan("pools/create", world.root, body)


def acknowledge(
    h: Harness, idx: int, plan: Plan, answer: dict[str, Any], live: dict[str, float]
) -> str | None:
    """Record an HTTP 200; returns a reason when the answer itself contradicts the request."""
    ledger, world, body = h.ledger, h.world, plan.body
    ledger.writes[plan.op] += 1
    if plan.op == "pools/create":
        pool_id = answer["id"]
        ledger.pools.add(pool_id)
        if pool_id not in world.created_pools:
            world.created_pools.append(pool_id)
    elif plan.op == "pools/offer":
        pair = (body["poolId"], body["toTenantId"])
        ledger.offers.add(pair)
        if body["poolId"] not in world.visible[pair[1]]:
            world.visible[pair[1]].append(body["poolId"])
        if pair not in world.quota_next:
            world.quota_pairs.append(pair)
            world.quota_next[pair] = 0
    elif plan.op == "quotas/set":
        pair = (body["poolId"], body["forTenantId"])
        value = body["quota"]["memoryGiB"]
        ledger.quota_floor[pair] = max(value, ledger.quota_floor.get(pair, 0))
        rows = {row["resource"]: row["max"] for row in answer["items"]}
        if rows.get("memoryGiB") != value:
            return f"quotas/set {body} answered memoryGiB max {rows.get('memoryGiB')}"
    elif plan.op == "reservations/create":
        rid, state = answer["id"], answer["state"]
        ledger.asked[rid] = (body["poolId"], body["tenantId"], body["resources"])
        ledger.reservation(rid, state)
        ledger.created_states[state] += 1
        if state in LIVE and rid not in live and rid not in ledger.ended:
            live[rid] = time.monotonic()
        if answer["resources"] != body["resources"] or answer["poolId"] != body["poolId"]:
            return f"reservations/create {body} answered {answer}"
    elif plan.op == "reservations/end":
        rid, state = body["reservationId"], answer["state"]
        ledger.ended[rid] = state
        ledger.reservation(rid, state)
        live.pop(rid, None)
        if state not in TERMINAL:
            return f"reservations/end {rid} answered state {state}"
    return None


async def client(h: Harness, idx: int) -> None:
    rng = random.Random(f"{h.options.seed}/client/{idx}")
    live: dict[str, float] = {}  # this client's reservations acknowledged live, not ended
    retry: Plan | None = None
    for n in range(h.options.max_ops):
        if not await h.wait_up():
            return
        current = retry or plan(h, idx, n, rng, live)
        retry = None
        if current is None:
            await asyncio.sleep(0)
            continue
        status, answer, retry_after = await h.send(current.op, current.token, current.body)
        if h.options.postgres and (status is None or status == 503):
            # Not acknowledged: sent again later with the same body, to any replica.
            code = answer.get("error", {}).get("code") if isinstance(answer, dict) else None
            if status is None:
                h.ledger.in_doubt[current.op] += 1
                pause = rng.uniform(0.02, 0.1)
            else:
                h.ledger.unavailable[f"{current.op} {code}"] += 1
                if code != "UNAVAILABLE" or retry_after is None:
                    h.server_errors.append(
                        f"{current.op} {current.body} -> HTTP 503 {code} Retry-After "
                        f"{retry_after}: {answer}"
                    )
                try:
                    pause = min(float(retry_after or 0), PG_RETRY_AFTER_S)
                except ValueError:
                    pause = PG_RETRY_AFTER_S
                pause *= rng.uniform(0.5, 1.0)
            if current.tries < PG_RETRIES:
                current.tries += 1
                retry = current
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(h.stop.wait(), pause)
            continue
        if status is None:
            h.ledger.in_doubt[current.op] += 1
            if current.tries < RETRIES:
                current.tries += 1
                retry = current
            continue
        if status == 200 and isinstance(answer, dict):
            wrong = acknowledge(h, idx, current, answer, live)
            if wrong is not None:
                h.server_errors.append(wrong)
            continue
        code = answer.get("error", {}).get("code") if isinstance(answer, dict) else None
        h.ledger.refused[f"{current.op} {status} {code}"] += 1
        if status >= 500:
            h.server_errors.append(f"{current.op} {current.body} -> HTTP {status}: {answer}")


async def reporter(h: Harness) -> None:
    """Every node reports its unchanged inventory, as its agent would (placed -> active)."""
    while await h.wait_up():
        for node in h.world.nodes:
            body = {"nodeId": node.node_id, "inventory": node.inventory}
            status, _ = await post(h.session, h.target(), "compute/nodes/report", node.token, body)
            h.ledger.reports += status == 200
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(h.stop.wait(), REPORT_EVERY_S)


# --- the audit ------------------------------------------------------------------------------------


def _fetch(db: sqlite3.Connection, sql: str) -> list[tuple[Any, ...]]:
    return list(db.execute(sql).fetchall())


@dataclass
class Snapshot:
    """The rows one audit reads, in one read transaction; ``integrity`` lists what is broken."""

    integrity: list[str]
    events: list[tuple[Any, ...]]
    pools: set[str]
    offers: set[tuple[Any, ...]]
    quotas: list[tuple[Any, ...]]
    reservations: dict[str, tuple[Any, ...]]
    holding: set[str]
    bookings: list[tuple[Any, ...]]
    node_rows: list[tuple[Any, ...]]
    devices: list[tuple[Any, ...]]


SELECT_EVENTS = "SELECT seq, type, pool_id, data FROM events ORDER BY seq"
SELECT_POOLS = "SELECT id FROM pools"
SELECT_OFFERS = "SELECT pool_id, to_tenant_id FROM pool_offers"
SELECT_QUOTAS = "SELECT pool_id, tenant_id, resource, max, used FROM quotas"
SELECT_RESERVATIONS = "SELECT id, tenant_id, pool_id, resources, state, node_id FROM reservations"
# D7: an ended reservation holds its bookings until its host confirms the release.
SELECT_HOLDING = (
    "SELECT id FROM reservations WHERE state IN ('placed', 'active') "
    "OR delivery_state IN ('releasing', 'release-blocked')"
)
SELECT_BOOKINGS = "SELECT reservation_id, node_id, resource, amount FROM bookings"
SELECT_NODE_ROWS = "SELECT node_id, resource, capacity, allocated FROM node_resources"
SELECT_DEVICES = "SELECT node_id, device_id, resource, allocated, reservation_id FROM node_devices"


def audit(db_path: Path, acked: Ledger, where: str) -> Audit:
    """Every invariant and every acknowledged write, read from the file in one read transaction."""
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, isolation_level=None, timeout=10)
    try:
        db.execute("BEGIN")
        integrity = _fetch(db, "PRAGMA integrity_check")
        foreign = _fetch(db, "PRAGMA foreign_key_check")
        snapshot = Snapshot(
            integrity=[],
            events=_fetch(db, SELECT_EVENTS),
            pools={r[0] for r in _fetch(db, SELECT_POOLS)},
            offers=set(_fetch(db, SELECT_OFFERS)),
            quotas=_fetch(db, SELECT_QUOTAS),
            reservations={r[0]: r[1:] for r in _fetch(db, SELECT_RESERVATIONS)},
            holding={r[0] for r in _fetch(db, SELECT_HOLDING)},
            bookings=_fetch(db, SELECT_BOOKINGS),
            node_rows=_fetch(db, SELECT_NODE_ROWS),
            devices=_fetch(db, SELECT_DEVICES),
        )
        db.execute("COMMIT")
    finally:
        db.close()
    if integrity != [("ok",)]:
        snapshot.integrity.append(f"PRAGMA integrity_check: {integrity[:5]}")
    if foreign:
        snapshot.integrity.append(f"PRAGMA foreign_key_check: {foreign[:5]}")
    return check_snapshot(snapshot, acked, where, ["integrity_check", "foreign_key_check"])


# Each reference PostgreSQL's rows carry (child table, column, parent table, key): an anti-join
# finds the rows whose parent is missing. Declared foreign keys hold by construction; the check
# is cheap and covers node_devices.reservation_id, which no constraint declares.
REFERENCES = (
    ("credentials", "tenant_id", "tenants", "id"),
    ("sites", "owner_tenant_id", "tenants", "id"),
    ("pools", "owner_tenant_id", "tenants", "id"),
    ("pools", "site_id", "sites", "id"),
    ("pool_offers", "pool_id", "pools", "id"),
    ("pool_offers", "to_tenant_id", "tenants", "id"),
    ("quotas", "pool_id", "pools", "id"),
    ("quotas", "tenant_id", "tenants", "id"),
    ("nodes", "pool_id", "pools", "id"),
    ("node_resources", "node_id", "nodes", "id"),
    ("node_devices", "node_id", "nodes", "id"),
    ("node_devices", "reservation_id", "reservations", "id"),
    ("event_audience", "seq", "events", "seq"),
    ("reservations", "tenant_id", "tenants", "id"),
    ("reservations", "pool_id", "pools", "id"),
    ("reservations", "node_id", "nodes", "id"),
    ("bookings", "reservation_id", "reservations", "id"),
    ("bookings", "node_id", "nodes", "id"),
)


def audit_postgres(url: str, acked: Ledger, where: str) -> Audit:
    """The same audit on PostgreSQL: one REPEATABLE READ (snapshot) read-only transaction.

    SQLite's pragmas have no cheap PostgreSQL equivalent; instead: no index is invalid, no
    foreign key is left unvalidated, and no row's reference dangles (REFERENCES, anti-joins).
    ``acked`` must be taken before this is called: every write it holds committed before the
    transaction's snapshot.
    """
    with psycopg.connect(url, connect_timeout=10) as db:
        db.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        db.read_only = True

        def fetch(query: str) -> list[tuple[Any, ...]]:
            return list(db.execute(query).fetchall())

        with db.transaction():
            events = fetch(SELECT_EVENTS)  # the first statement takes the snapshot
            integrity = [
                f"invalid index {r[0]}"
                for r in fetch(
                    "SELECT indexrelid::regclass::text FROM pg_index WHERE NOT indisvalid"
                )
            ]
            integrity += [
                f"foreign key {r[0]} not validated"
                for r in fetch(
                    "SELECT conname FROM pg_constraint WHERE contype = 'f' AND NOT convalidated"
                )
            ]
            for child, column, parent, key in REFERENCES:
                (orphans,) = fetch(
                    f"SELECT count(*) FROM {child} c WHERE c.{column} IS NOT NULL AND NOT EXISTS "
                    f"(SELECT 1 FROM {parent} p WHERE p.{key} = c.{column})"
                )[0]
                if orphans:
                    integrity.append(f"{orphans} {child} rows whose {column} is not in {parent}")
            snapshot = Snapshot(
                integrity=integrity,
                events=events,
                pools={r[0] for r in fetch(SELECT_POOLS)},
                offers=set(fetch(SELECT_OFFERS)),
                quotas=fetch(SELECT_QUOTAS),
                reservations={r[0]: r[1:] for r in fetch(SELECT_RESERVATIONS)},
                holding={r[0] for r in fetch(SELECT_HOLDING)},
                bookings=fetch(SELECT_BOOKINGS),
                node_rows=fetch(SELECT_NODE_ROWS),
                devices=fetch(SELECT_DEVICES),
            )
    return check_snapshot(snapshot, acked, where, ["indexes", "constraints", *REFERENCES])


def _json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str | bytes) else value


def check_snapshot(snapshot: Snapshot, acked: Ledger, where: str, integrity: list[Any]) -> Audit:
    """Every invariant and every acknowledged write against one snapshot's rows."""
    result = Audit(where)
    for broken in snapshot.integrity:
        result.check(False, broken)
    result.checks += len(integrity) - len(snapshot.integrity)
    events, pools, offers, quotas = (
        snapshot.events,
        snapshot.pools,
        snapshot.offers,
        snapshot.quotas,
    )
    reservations, holding, bookings = (
        snapshot.reservations,
        snapshot.holding,
        snapshot.bookings,
    )
    node_rows, devices = snapshot.node_rows, snapshot.devices
    seqs = [e[0] for e in events]
    result.check(
        seqs == list(range(1, len(seqs) + 1)),
        f"events seq not gapless 1..{seqs[-1] if seqs else 0}: {len(seqs)} events",
    )

    # The events, indexed by what they report.
    created_pools: set[str] = set()
    offered: set[tuple[str, str]] = set()
    quota_updates: set[tuple[str, str, int]] = set()
    res_events: defaultdict[str, set[str]] = defaultdict(set)
    for _, kind, pool_id, data_text in events:
        data = _json(data_text)
        if kind == "pool.created":
            created_pools.add(pool_id)
        elif kind == "pool.offered":
            offered.add((pool_id, data.get("toTenantId")))
        elif kind == "quota.updated":
            for resource, value in (data.get("quota") or {}).items():
                if resource == "memoryGiB":
                    quota_updates.add((pool_id, data.get("forTenantId"), value))
        elif kind.startswith("reservation."):
            res_events[data.get("reservationId")].add(kind.removeprefix("reservation."))

    # Quota used = live reservations of (pool, tenant, resource).
    live_sum: Counter[tuple[str, str, str]] = Counter()
    asked_of: dict[str, dict[str, int]] = {}
    for rid, (tenant, pool_id, resources_text, state, _) in reservations.items():
        asked_of[rid] = _json(resources_text)
        if state in LIVE:
            for resource, amount in asked_of[rid].items():
                live_sum[(pool_id, tenant, resource)] += amount
    quota_keys = set()
    for pool_id, tenant, resource, _maximum, used in quotas:
        quota_keys.add((pool_id, tenant, resource))
        want = live_sum.get((pool_id, tenant, resource), 0)
        result.check(
            used == want,
            f"quota ({pool_id}, {tenant}, {resource}) used {used} != {want} in live reservations",
        )
    for key, amount in live_sum.items():
        if key not in quota_keys:
            result.check(False, f"live reservations hold {amount} of {key} without a quota row")

    # node_resources.allocated = bookings of held reservations, never above capacity.
    held_sum: Counter[tuple[str, str]] = Counter()
    booked_of: defaultdict[str, dict[str, int]] = defaultdict(dict)
    booking_node: dict[tuple[str, str], str] = {}
    for rid, node_id, resource, amount in bookings:
        if rid in holding:
            held_sum[(node_id, resource)] += amount
            booked_of[rid][resource] = amount
            booking_node[(rid, resource)] = node_id
    row_keys = set()
    for node_id, resource, capacity, allocated in node_rows:
        row_keys.add((node_id, resource))
        want = held_sum.get((node_id, resource), 0)
        result.check(
            allocated == want,
            f"node_resources ({node_id}, {resource}) allocated {allocated} != {want} booked",
        )
        result.check(
            0 <= allocated <= capacity,
            f"node_resources ({node_id}, {resource}) allocated {allocated} > capacity {capacity}",
        )
    for (node_id, resource), amount in held_sum.items():
        if resource not in ATOMS and (node_id, resource) not in row_keys:
            result.check(False, f"{amount} {resource} booked on {node_id} without a row")

    # GPU atoms: free, or booked by exactly one held reservation on that node.
    atoms_of: Counter[tuple[str, str, str]] = Counter()
    for node_id, device_id, resource, allocated, rid in devices:
        if not allocated:
            result.check(rid is None, f"free atom {node_id}/{device_id} names reservation {rid}")
            continue
        state = reservations[rid][3] if rid in reservations else None
        result.check(
            rid in holding,
            f"atom {node_id}/{device_id} booked by {rid} in state {state}",
        )
        result.check(
            booking_node.get((rid, resource)) == node_id,
            f"atom {node_id}/{device_id} booked by {rid} without its {resource} booking there",
        )
        atoms_of[(rid, node_id, resource)] += 1
    for rid, (_, _, _, state, node_id) in reservations.items():
        if rid not in holding:
            continue
        result.check(
            booked_of.get(rid, {}) == asked_of[rid],
            f"reservation {rid} ({state}) asked {asked_of[rid]}, booked {booked_of.get(rid)}",
        )
        for resource, amount in asked_of[rid].items():
            if resource in ATOMS:
                got = atoms_of.get((rid, node_id, resource), 0)
                result.check(
                    got == amount,
                    f"reservation {rid} holds {got} {resource} atoms on {node_id}, asked {amount}",
                )

    # Each change has its event, acknowledged or not (one transaction holds both).
    for pool_id in pools:
        result.check(pool_id in created_pools, f"pool {pool_id} has no pool.created event")
    for rid, (_, _, _, state, _) in reservations.items():
        kinds = res_events.get(rid, set())
        result.check(
            bool(kinds & {"created", "failed"}), f"reservation {rid} has no created/failed event"
        )
        need = {"placed": "placed", "active": "active", "ended": "ended", "failed": "failed"}
        if state in need:
            result.check(need[state] in kinds, f"reservation {rid} is {state}: events {kinds}")

    # Every acknowledged write is there.
    for pool_id in acked.pools:
        result.check(pool_id in pools, f"acknowledged pool {pool_id} is missing")
        result.check(pool_id in created_pools, f"acknowledged pool {pool_id}: no pool.created")
    for pair in acked.offers:
        result.check(pair in offers, f"acknowledged offer {pair} is missing")
        result.check(pair in offered, f"acknowledged offer {pair}: no pool.offered event")
    quota_max = {(p, t): m for p, t, r, m, _ in quotas if r == "memoryGiB"}
    for (pool_id, tenant), value in acked.quota_floor.items():
        stored = quota_max.get((pool_id, tenant))
        result.check(
            stored is not None and stored >= value,
            f"acknowledged quotas/set ({pool_id}, {tenant}) memoryGiB {value}: stored {stored}",
        )
        result.check(
            (pool_id, tenant, value) in quota_updates,
            f"acknowledged quotas/set ({pool_id}, {tenant}) memoryGiB {value}: no quota.updated",
        )
    for rid, state in acked.reservations.items():
        row = reservations.get(rid)
        if row is None:
            result.check(False, f"acknowledged reservation {rid} ({state}) is missing")
            continue
        tenant, pool_id, _, stored, _ = row
        pool_asked, tenant_asked, resources = acked.asked[rid]
        result.check(
            (pool_id, tenant, asked_of[rid]) == (pool_asked, tenant_asked, resources),
            f"acknowledged reservation {rid}: stored {pool_id} {tenant} {asked_of[rid]}",
        )
        far_enough = stored == state if state in TERMINAL else RANK[stored] >= RANK[state]
        result.check(far_enough, f"acknowledged reservation {rid} was {state}, stored {stored}")
        kinds = res_events.get(rid, set())
        if state != "failed":
            result.check("created" in kinds, f"acknowledged reservation {rid}: no .created")
        if state in HELD:
            result.check("placed" in kinds, f"acknowledged {state} reservation {rid}: no .placed")
        if state in TERMINAL:
            result.check(state in kinds, f"acknowledged {state} reservation {rid}: no .{state}")
    for rid, state in acked.ended.items():
        stored = reservations[rid][3] if rid in reservations else None
        result.check(stored == state, f"acknowledged end of {rid} ({state}): stored {stored}")
    return result


# --- the run --------------------------------------------------------------------------------------


def say(out: TextIO | None, text: str) -> None:
    if out is not None:
        print(text, file=out, flush=True)


def audit_line(a: Audit) -> str:
    return f"{a.checks} checks, {len(a.violations)} violations"


async def stop_clients(tasks: Collection[asyncio.Task[None]]) -> None:
    """Wait for the clients told to stop (bounded), cancel the stragglers, and raise what any
    of them raised: a harness bug is not a quiet run."""
    done, pending = await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT_S + 5)
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for task in done:
        failure = task.exception()
        if failure is not None:
            raise failure


async def crash_rounds(options: Options, workdir: Path, out: TextIO | None) -> Result:
    started = time.monotonic()
    rng = random.Random(f"{options.seed}/main")
    daemon = Daemon(workdir, bench_api.free_port())
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=options.clients + 4)
    audits: list[Audit] = []
    restarts: list[float] = []
    in_flight_at_kill: list[int] = []
    rounds = 0
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        try:
            await daemon.start(session)
            world, ledger = await setup(session, daemon, rng)
            say(
                out,
                f"crash: seed {options.seed}, {options.clients} clients, {options.rounds} rounds, "
                f"{len(world.nodes)} nodes in {len(world.placement_pools)} pools, "
                f"{len(TENANTS)} tenants; db {daemon.db}",
            )
            h = Harness(
                world=world,
                ledger=ledger,
                daemon=daemon,
                session=session,
                options=options,
                deadline=started + options.max_seconds,
            )
            h.up.set()
            tasks = [asyncio.create_task(client(h, i)) for i in range(options.clients)]
            tasks.append(asyncio.create_task(reporter(h)))
            try:
                for number in range(1, options.rounds + 1):
                    if not h.running():
                        say(out, f"round {number}: the run's time is up, stopping")
                        break
                    up_s = rng.uniform(options.min_up_s, options.max_up_s)
                    await asyncio.sleep(up_s)
                    # SIGKILL while the clients keep sending: requests are in flight.
                    flying = h.in_flight
                    daemon.kill9()
                    h.up.clear()
                    await asyncio.to_thread(daemon.reap)
                    acked = h.ledger.snapshot()
                    rounds = number
                    in_flight_at_kill.append(flying)
                    dead = await asyncio.to_thread(
                        audit, daemon.db, acked, f"round {number} killed"
                    )
                    t0 = time.monotonic()
                    try:
                        await daemon.start(session)
                    except SetupError as exc:  # a database the daemon cannot reopen breaks R7
                        audits.append(dead)
                        h.server_errors.append(f"round {number}: no restart after the kill: {exc}")
                        say(out, f"round {number}: {audit_line(dead)}; the restart FAILED: {exc}")
                        break
                    restarts.append(time.monotonic() - t0)
                    acked = h.ledger.snapshot()
                    alive = await asyncio.to_thread(
                        audit, daemon.db, acked, f"round {number} restarted"
                    )
                    audits += [dead, alive]
                    say(
                        out,
                        f"round {number}: {up_s:.2f} s of load, kill -9 with {flying} requests "
                        f"in flight, {acked.total()} writes acknowledged so far; after the kill "
                        f"{audit_line(dead)}; restarted in {restarts[-1]:.2f} s; after the "
                        f"restart {audit_line(alive)}",
                    )
                    for violation in dead.violations[:5] + alive.violations[:5]:
                        say(out, f"  VIOLATION {violation}")
                    h.up.set()
                await asyncio.sleep(rng.uniform(options.min_up_s, options.max_up_s))
            finally:
                h.stop.set()
                h.up.set()
                await stop_clients(tasks)
            code = await asyncio.to_thread(daemon.stop)
            final = await asyncio.to_thread(audit, daemon.db, h.ledger.snapshot(), "final")
            audits.append(final)
            say(out, f"final (SIGTERM, exit {code}): {audit_line(final)}")
        finally:
            await asyncio.to_thread(daemon.stop)
    return Result(
        seed=options.seed,
        rounds=rounds,
        ledger=h.ledger,
        audits=audits,
        seconds=time.monotonic() - started,
        restarts_s=restarts,
        in_flight_at_kill=in_flight_at_kill,
        server_errors=h.server_errors,
    )


async def ready_again(h: Harness, replicas: list[Replica], since: float) -> list[str]:
    """Wait (bounded) until every replica serves again (F1): its /readyz answers 200 and it
    has acknowledged a client's write since ``since`` (the fault's end); the ones that do not."""
    deadline = time.monotonic() + PG_READY_AGAIN_S
    waiting = list(replicas)
    while waiting and time.monotonic() < deadline:
        for replica in list(waiting):
            if h.answered_at.get(replica.url, -math.inf) <= since:
                continue
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with h.session.get(f"{replica.url}/readyz") as resp:
                    await resp.read()
                    if resp.status == 200:
                        waiting.remove(replica)
        if waiting:
            await asyncio.sleep(0.05)
    return [
        f"replica {r.n} not serving {PG_READY_AGAIN_S:.0f} s after the fault "
        f"(readyz 200 and a write acknowledged; {r.log})"
        for r in waiting
    ]


async def postgres_fault(
    kind: str,
    h: Harness,
    server: PostgresServer,
    replicas: list[Replica],
    proxies: list[TcpProxy],
    rng: random.Random,
) -> str:
    """One fault under load, until it is over (every replica's database is back); what it was."""
    if kind == "kill -9":
        replica = rng.choice(replicas)
        replica.kill9()
        await asyncio.to_thread(replica.reap)
        await asyncio.sleep(rng.uniform(0.1, 0.5))  # the others serve meanwhile
        await replica.start(h.session)
        return f"replica {replica.n} killed and restarted"
    if kind in ("restart -m fast", "restart -m immediate"):
        mode = kind.rsplit(" ", 1)[-1]
        down_for = rng.uniform(0.2, 1.0)
        await asyncio.to_thread(server.restart, mode, down_for)
        return f"PostgreSQL stopped -m {mode}, down {down_for:.2f} s, started"
    n = rng.randrange(len(replicas))
    cut_for = rng.uniform(1.0, 2.0)
    proxies[n].cut()
    await asyncio.sleep(cut_for)
    proxies[n].restore()
    return f"replica {n} cut from the database for {cut_for:.2f} s"


async def postgres_rounds(options: Options, workdir: Path, out: TextIO | None) -> Result:
    """--postgres: replicas on one durable PostgreSQL server, the four fault kinds in turn."""
    started = time.monotonic()
    rng = random.Random(f"{options.seed}/main")
    server = PostgresServer(settings=PG_SETTINGS)
    await asyncio.to_thread(server.start)
    proxies: list[TcpProxy] = []
    replicas: list[Replica] = []
    audits: list[Audit] = []
    faults = {kind: FaultStats() for kind in FAULTS}
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    connector = aiohttp.TCPConnector(limit=options.clients + 4 * options.replicas)
    try:
        url = await asyncio.to_thread(server.new_database)
        dbname = url.rsplit("/", 1)[-1]
        for n in range(options.replicas):  # each replica reaches the database by its own proxy
            proxy = TcpProxy("127.0.0.1", server.port)
            await proxy.start()
            proxies.append(proxy)
            db_url = f"postgresql://postgres@127.0.0.1:{proxy.port}/{dbname}"
            replicas.append(Replica(workdir, n, db_url))
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            try:
                await replicas[0].start(session)  # it bootstraps root and writes its token
                await asyncio.gather(*(r.start(session) for r in replicas[1:]))
                world, ledger = await setup(session, replicas[0], rng)
                say(
                    out,
                    f"crash --postgres: seed {options.seed}, {options.clients} clients, "
                    f"{options.replicas} replicas, {options.rounds} rounds of {len(FAULTS)} "
                    f"faults, {len(world.nodes)} nodes in {len(world.placement_pools)} pools, "
                    f"{len(TENANTS)} tenants; {url}",
                )
                h = Harness(
                    world=world,
                    ledger=ledger,
                    daemon=replicas[0],
                    session=session,
                    options=options,
                    deadline=started + options.max_seconds,
                    urls=[r.url for r in replicas],
                    pick=random.Random(f"{options.seed}/targets"),
                )
                h.up.set()  # the clients never pause: every fault meets requests in flight
                tasks = [asyncio.create_task(client(h, i)) for i in range(options.clients)]
                tasks.append(asyncio.create_task(reporter(h)))
                try:
                    number = 0
                    for round_ in range(1, options.rounds + 1):
                        for kind in FAULTS:
                            if not h.running():
                                break
                            number += 1
                            await asyncio.sleep(rng.uniform(options.min_up_s, options.max_up_s))
                            stats = faults[kind]
                            stats.count += 1
                            flying = h.in_flight
                            stats.in_flight += flying
                            t0 = time.monotonic()
                            try:
                                what = await postgres_fault(kind, h, server, replicas, proxies, rng)
                            except SetupError as exc:  # a replica that cannot start again
                                what = f"{kind} FAILED"
                                late = [str(exc)]
                            else:
                                late = []
                            late += await ready_again(h, replicas, time.monotonic())
                            stats.recovery_s.append(time.monotonic() - t0)
                            late = [f"fault {number} ({kind}): {v}" for v in late]
                            stats.violations += late
                            h.server_errors += late
                            acked = h.ledger.snapshot()  # before the audit's snapshot
                            where = f"fault {number} ({kind}, round {round_})"
                            after = await asyncio.to_thread(audit_postgres, url, acked, where)
                            audits.append(after)
                            stats.checks += after.checks
                            stats.violations += after.violations
                            say(
                                out,
                                f"fault {number}: {kind}, {flying} requests in flight: {what}; "
                                f"every replica serving {stats.recovery_s[-1]:.2f} s after it; "
                                f"{acked.total()} writes acknowledged so far; {audit_line(after)}",
                            )
                            for violation in (late + after.violations)[:5]:
                                say(out, f"  VIOLATION {violation}")
                    await asyncio.sleep(rng.uniform(options.min_up_s, options.max_up_s))
                finally:
                    h.stop.set()
                    await stop_clients(tasks)
                codes = [await asyncio.to_thread(r.stop) for r in replicas]
                final = await asyncio.to_thread(audit_postgres, url, h.ledger.snapshot(), "final")
                audits.append(final)
                say(out, f"final (SIGTERM, exits {codes}): {audit_line(final)}")
                if options.at_end is not None:
                    await asyncio.to_thread(options.at_end, server, url, h.ledger.snapshot())
            finally:
                for replica in replicas:
                    await asyncio.to_thread(replica.stop)
    finally:
        for proxy in proxies:
            await proxy.stop()
        await asyncio.to_thread(server.stop)
    return Result(
        seed=options.seed,
        rounds=min(stats.count for stats in faults.values()),
        ledger=h.ledger,
        audits=audits,
        seconds=time.monotonic() - started,
        restarts_s=[],
        in_flight_at_kill=[],
        server_errors=h.server_errors,
        faults=faults,
    )


def run(options: Options, out: TextIO | None = None) -> Result:
    """The whole run: in options.workdir when given (kept), else in a temporary directory."""
    rounds = postgres_rounds if options.postgres else crash_rounds
    if options.workdir is not None:
        options.workdir.mkdir(parents=True, exist_ok=True)
        return asyncio.run(rounds(options, options.workdir, out))
    with tempfile.TemporaryDirectory(prefix="bench-crash-") as tmp:
        return asyncio.run(rounds(options, Path(tmp), out))


def summary(result: Result) -> list[str]:
    ledger = result.ledger
    writes = ", ".join(f"{op} {ledger.writes[op]}" for op, _ in OPS)
    states = ", ".join(f"{s} {n}" for s, n in sorted(ledger.created_states.items()))
    doubt = ", ".join(f"{op} {n}" for op, n in sorted(ledger.in_doubt.items())) or "none"
    refused = ", ".join(f"{k} x{n}" for k, n in sorted(ledger.refused.items())) or "none"
    lines = [
        f"rounds: {result.rounds} kill -9 and restart on the same database "
        f"(restart p50 {sorted(result.restarts_s)[len(result.restarts_s) // 2]:.2f} s, "
        f"{sum(result.in_flight_at_kill)} requests in flight at the kills)"
        if result.restarts_s
        else f"rounds: {result.rounds}",
        f"acknowledged writes: {ledger.total()} ({writes}); reservations/create answered {states}",
        f"in doubt (no answer, retried with the same body): {doubt}",
        f"refused (answered, not 200): {refused}",
        f"node reports acknowledged: {ledger.reports}",
        f"checks: {result.checks} in {len(result.audits)} audits of the database file",
        f"violations: {len(result.violations)} (expected 0)",
        f"{result.seconds:.1f} s",
    ]
    if result.faults:
        lines[0] = f"faults: {sum(f.count for f in result.faults.values())}"
        unavailable = ", ".join(f"{k} x{n}" for k, n in sorted(ledger.unavailable.items()))
        lines.insert(3, f"unavailable (503, retried with the same body): {unavailable or 'none'}")
        lines.insert(4, f"slowest answer to a mutation: {ledger.slowest_s:.2f} s")
        for kind, stats in result.faults.items():
            recovery = sorted(stats.recovery_s)
            p50 = f"{recovery[len(recovery) // 2]:.2f} s" if recovery else "-"
            lines.insert(
                1 + list(result.faults).index(kind),
                f"  {FAULT_NAMES[kind]}: {stats.count}, {stats.in_flight} requests in flight, "
                f"serving again p50 {p50}, {stats.checks} checks, "
                f"{len(stats.violations)} violations",
            )
        lines = [
            line.replace("audits of the database file", "audits of the database") for line in lines
        ]
    lines += [f"  VIOLATION {v}" for v in result.violations[:50]]
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--rounds", type=int, default=10, help="kill -9 and restart rounds")
    parser.add_argument("--clients", type=int, default=8, help="concurrent mutating clients")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: random)")
    parser.add_argument("--min-up", type=float, default=0.4, help="least load before a kill (s)")
    parser.add_argument("--max-up", type=float, default=1.6, help="most load before a kill (s)")
    parser.add_argument("--max-seconds", type=float, default=600.0, help="bound on the whole run")
    parser.add_argument("--max-ops", type=int, default=100_000, help="bound on ops per client")
    parser.add_argument("--workdir", type=Path, help="keep the database and log here")
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="replicas on one PostgreSQL server; --rounds of each fault kind",
    )
    parser.add_argument("--replicas", type=int, default=3, help="--postgres: serve replicas")
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.clients < 1 or args.max_ops < 1:
        parser.error("--rounds, --clients and --max-ops must be at least 1")
    if args.replicas < 2:
        parser.error("--replicas must be at least 2")
    if not 0 < args.min_up <= args.max_up or args.max_seconds <= 0:
        parser.error("need 0 < --min-up <= --max-up and a positive --max-seconds")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(2**31)
    options = Options(
        rounds=args.rounds,
        clients=args.clients,
        seed=seed,
        min_up_s=args.min_up,
        max_up_s=args.max_up,
        max_seconds=args.max_seconds,
        max_ops=args.max_ops,
        workdir=args.workdir,
        postgres=args.postgres,
        replicas=args.replicas,
    )
    try:
        result = run(options, sys.stdout)
    except SetupError as exc:
        print(f"crash: setup failed: {exc}", file=sys.stderr)
        return 2
    for line in summary(result):
        print(line)
    return 1 if result.violations else 0


if __name__ == "__main__":
    sys.exit(main())
