"""Fleet-sized reads: the daemon on 10,000 pools and 250,000 events, against a bare aiohttp handler.

Run it with ``make bench`` or directly::

    .venv/bin/python bench/fleet.py [--quick | --lists] [--rounds 3] [--seconds 2] [--concurrency 32]

What it does, in one run:

1. Builds a SQLite database before any daemon runs (over HTTP this would take far too long):
   ``Store(path)`` runs the migrations, the services' ``bootstrap`` makes tenant ``root`` and its
   token, and one transaction writes, through the storage functions the services use
   (``insert_pool``, ``put_authz``, ``put_offer``, ``put_quota``) and in the rows
   ``events.append`` writes: one shared site, 10,000 ``metal-host`` pools owned by root, tenants
   ``fleet-10``, ``fleet-100``, ``fleet-1000`` and ``fleet-10000``, tenant ``fleet-N`` offered
   the first N pools with a quota, and 250,000 events with their audience rows
   (``site.created``, ``tenant.created``, ``pool.created``, ``pool.offered``, then
   ``quota.updated`` spread over the tenants in turn).
2. Starts the real daemon (``better-compute-controlplane serve``) on that file and the bare
   baseline (``bench/common.py --serve-bare``), each its own process on 127.0.0.1; over HTTP as
   root makes a credential per tenant and joins one node with the recorded DGX H100's inventory.
3. Measures in interleaved rounds (every figure once per round, the baseline beside it in the
   same round, the clients taking turns to go first), with each client available: ``wrk``
   (``-t 2 -c 32``, ``-t 2 -c 8``, ``-t 1 -c 1``; a Lua script per endpoint) when installed, and
   the aiohttp client of this process (``bench/common.py``'s ``load``) always. The daemon keeps
   encoded read answers while nothing changed, keyed by credential and body; so unless a series
   says ``(cache hit)`` (the same body every request: after the first, the cache answers), each
   request's body is fresh (its JSON whitespace differs from every other's) and the daemon
   reads and builds the answer every time, as it does for distinct callers and queries:

   (a) ``pools/get`` (as ``fleet-10000``), fresh and cache hit, and ``nodes/report`` (the node,
       its inventory unchanged) at 32 connections, its whole inventory in the body and, F9's
       small heartbeat, ``nodes/report (digest)`` with the ``inventoryDigest`` the control plane
       answered instead: req/s as a ratio to the bare handler's in the same round (target >=
       0.5 x);
   (b) ``pools/list`` as the tenants seeing 10 / 100 / 1,000 / 10,000 pools, one connection:
       time per request (p50) and per pool; and req/s at 8 connections with 1,000 pools,
       fresh and cache hit, against 350 req/s: ten times the 15-35 req/s OpenStack Placement
       served for 1,000 resource providers, measured earlier on this machine (Placement does
       not run here: the reference is that earlier figure, not a measurement of this run);
   (c) ``pools/get`` p50/p99 on one connection alone, and while one other client (an aiohttp
       client in a subprocess, one connection, fresh bodies) loops the 10,000-pool list
       (target: p99 under load <= 3 x unloaded);
   (d) ``events/list`` page time (limit 100, p50 on one connection) from ``after: 0`` and from
       the tail (an ``after`` that leaves the last 100 events) over 250,000 events, as tenant
       ``fleet-10000`` and as root (the fleet's view) (target < 1 ms). The bare handler's p50
       on one connection, from the same rounds, is printed beside it: the HTTP floor.

   The liveness writer at 100k nodes is bench/liveness.py's, not this file's.
4. Prints each series (median over rounds and the range, the serving process's CPU time per
   request read with psutil), then a summary of every figure with its client, target and
   PASS/FAIL. The targets are informational: the exit status is 0 unless a request failed (1)
   or the setup failed (2). With aiohttp the client (Python, in this process) is often the
   bottleneck: the bare handler's rate is then the client's, and ratios to it read higher than
   wrk's, which leave the servers the CPU.

``--lists`` runs (b)'s 1,000-pool list alone at 8 connections (fresh, cached, the bare
handler beside them in each round) and prints fresh and cached req/s, each over the bare
handler's, and cached over fresh (F8: at most 6 x).
``--quick`` runs small sizes (10 / 100 / 1,000 pools, 20,000 events; (c) loops the largest
list) in short rounds. The servers and the client share the machine's cores: absolute figures
depend on the host and on what else runs; the ratios to the bare handler measured in the same
rounds are the steadier ones.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import psutil  # type: ignore[import-untyped]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    BARE_PATH,
    REQUEST_TIMEOUT_S,
    Endpoint,
    SetupError,
    Spawned,
    Spread,
    bare_argv,
    call,
    cpu_seconds,
    daemon_argv,
    encode,
    free_ports,
    headers,
    join_dgx,
    load,
    percentile,
    run_wrk,
    spawned,
    table,
    wait_ready,
    warm_up,
    whitespace,
    wrk_path,
    wrk_script,
)

from controlplane.iam.decide import ROOT_TENANT
from controlplane.services.iam import bootstrap
from controlplane.services.pools import UNLIMITED_GPUS
from controlplane.storage import iam as iam_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import quotas as quota_sql
from controlplane.storage import sites as site_sql
from controlplane.storage.db import Store, now
from controlplane.storage.sql import Database
from shared.ids import new_id

FULL_SIZES = (10, 100, 1_000, 10_000)
FULL_EVENTS = 250_000
QUICK_SIZES = (10, 100, 1_000)
QUICK_EVENTS = 20_000
PAGE = 100  # events/list limit
REGION = "eu-central"
POLICY = {"maxPending": "6h"}
OFFER_QUOTA = 32

# Targets (DESIGN §10 B6, §13 F8).
RATIO_TARGET = 0.5  # pools/get and nodes/report at 32 connections, x the bare handler
LIST_POOLS = 1_000  # pools/list req/s at LIST_CONNECTIONS with this many pools visible
LIST_CONNECTIONS = 8
LIST_TARGET_RPS = 350.0  # 10 x OpenStack Placement's 15-35 req/s for 1,000 providers
FRESH_TARGET = 6.0  # F8: a fresh 1,000-pool list at most this many times slower than a cached one
PLACEMENT_REFERENCE = "15-35 req/s"
P99_LOADED_TARGET = 3.0  # pools/get p99 while the biggest list loops, x unloaded
EVENTS_TARGET_MS = 1.0

THIS_FILE = Path(__file__).resolve()
MAX_REQUESTS = 10_000_000
LOOPER_STOP_S = 60.0


def tenant_of(size: int) -> str:
    return f"fleet-{size}"


# --- the database ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fleet:
    """What was built: pool_ids[:n] are offered to tenant_of(n)."""

    site_id: str
    pool_ids: list[str]
    sizes: tuple[int, ...]
    events: int
    visible_events: dict[str, int]  # per tenant, events in its audience
    tail_after: dict[str, int]  # per tenant (root: the fleet's view), the after of the last page


def populate(db: Database, sizes: Sequence[int], total_events: int) -> Fleet:
    """One transaction: site, tenants, pools, offers, quotas, authz rows, events."""
    at = now()
    seq = int(db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0])
    event_rows: list[tuple[int, str, str, str, str | None, str]] = []
    audience_rows: list[tuple[str, int]] = []

    def event(kind: str, pool_id: str | None, data: dict[str, Any], audience: list[str]) -> None:
        # The rows events.append writes (seq max+1 in the writer's transaction), batched.
        nonlocal seq
        seq += 1
        event_rows.append((seq, new_id("evt"), kind, at, pool_id, encode(data).decode()))
        audience_rows.extend((tenant, seq) for tenant in dict.fromkeys(audience))

    site = {
        "id": new_id("site"),
        "owner_tenant_id": ROOT_TENANT,
        "name": "fra1",
        "region": REGION,
        "kind": "shared",
        "created_at": at,
    }
    site_sql.insert_site(db, site)
    event(
        "site.created",
        None,
        {"siteId": site["id"], "kind": "shared", "region": REGION},
        [ROOT_TENANT],
    )
    tenants = [tenant_of(n) for n in sizes]
    for tenant in tenants:
        iam_sql.insert_tenant(db, tenant, None, None, at)
        event(
            "tenant.created",
            None,
            {"tenantId": tenant, "parentTenantId": None},
            [ROOT_TENANT, tenant],
        )
    pools = []
    for _ in range(max(sizes)):
        pool_id = new_id("pool")
        pool_sql.insert_pool(
            db,
            {
                "id": pool_id,
                "owner_tenant_id": ROOT_TENANT,
                "site_id": site["id"],
                "class": "metal-host",
                "gpu_model": "H100",
                "sharing": "exclusive",
                "agent": "bcd",
                "policy": encode(POLICY).decode(),
                "provider_account_id": None,
                "created_at": at,
            },
        )
        for resource, maximum in UNLIMITED_GPUS.items():
            quota_sql.put_quota(db, pool_id, ROOT_TENANT, resource, maximum, at)
        pool = pool_sql.get_pool(db, pool_id)
        assert pool is not None
        pool_sql.put_authz(db, ROOT_TENANT, pool, REGION)
        pools.append(pool)
        event(
            "pool.created",
            pool_id,
            {
                "ownerTenantId": ROOT_TENANT,
                "siteId": site["id"],
                "class": "metal-host",
                "gpuModel": "H100",
                "sharing": "exclusive",
                "agent": "bcd",
                "version": 1,
            },
            [ROOT_TENANT],
        )
    for size, tenant in zip(sizes, tenants, strict=True):
        for pool in pools[:size]:
            pool_sql.put_offer(db, pool.id, tenant, False, 0, at)
            pool_sql.put_authz(db, tenant, pool, REGION)
            quota_sql.put_quota(db, pool.id, tenant, "gpu", OFFER_QUOTA, at)
            event(
                "pool.offered",
                pool.id,
                {
                    "toTenantId": tenant,
                    "quota": {"gpu": OFFER_QUOTA},
                    "includeDescendants": False,
                    "priority": 0,
                },
                [ROOT_TENANT, tenant],
            )
    # The rest of the history: quota changes on each tenant's pools, the tenants in turn.
    for k in range(max(0, total_events - seq)):
        size = sizes[k % len(sizes)]
        pool = pools[(k // len(sizes)) % size]
        tenant = tenant_of(size)
        event(
            "quota.updated",
            pool.id,
            {"forTenantId": tenant, "quota": {"gpu": OFFER_QUOTA + k % 64}},
            [ROOT_TENANT, tenant],
        )
    db.executemany(
        "INSERT INTO events (seq, id, type, at, pool_id, data) VALUES (?, ?, ?, ?, ?, ?)",
        event_rows,
    )
    db.executemany(
        "INSERT INTO event_audience (tenant_id, seq) VALUES (?, ?) ON CONFLICT DO NOTHING",
        audience_rows,
    )
    seen: dict[str, list[int]] = {}
    for tenant, number in audience_rows:
        seen.setdefault(tenant, []).append(number)
    tail_after = {t: sorted(s)[-PAGE - 1] if len(s) > PAGE else 0 for t, s in seen.items()}
    tail_after[ROOT_TENANT] = max(0, seq - PAGE)  # root acting as itself sees every event
    return Fleet(
        site_id=str(site["id"]),
        pool_ids=[pool.id for pool in pools],
        sizes=tuple(sizes),
        events=seq,
        visible_events={tenant: len(numbers) for tenant, numbers in seen.items()},
        tail_after=tail_after,
    )


def build(directory: Path, sizes: Sequence[int], total_events: int) -> Fleet:
    """directory/db.sqlite, migrated and bootstrapped (root.token beside it), then filled."""
    store = Store(directory / "db.sqlite")
    try:
        if not bootstrap(store, directory / "root.token"):
            raise SetupError(f"{directory / 'db.sqlite'} was not empty")
        return store.transact(lambda db: populate(db, sizes, total_events))
    finally:
        store.close()


# --- measuring ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Slice:
    """One load of one endpoint with one client in one round."""

    requests: int
    seconds: float
    rps: float
    p50_ms: float
    p99_ms: float
    errors: int
    first_error: str | None
    cpu_us: float  # the serving process's CPU time per request


@dataclass(frozen=True)
class Series:
    """A figure's slices over the rounds."""

    label: str
    client: str
    slices: list[Slice] = field(default_factory=list)

    def spread(self, attribute: str) -> Spread:
        return Spread.of([getattr(s, attribute) for s in self.slices])


@dataclass
class Bench:
    session: aiohttp.ClientSession
    workdir: Path
    api: Spawned
    bare: Spawned
    seconds: float
    scripts: dict[str, Path] = field(default_factory=dict)
    series: dict[tuple[str, str], Series] = field(default_factory=dict)

    async def measure(
        self,
        label: str,
        endpoint: Endpoint,
        connections: int,
        client: str,
        seconds: float | None = None,
    ) -> Slice:
        """Load endpoint with client at connections for seconds; recorded under label."""
        seconds = seconds or self.seconds
        server = psutil.Process((self.bare if endpoint.name == "bare" else self.api).proc.pid)
        before = cpu_seconds(server)
        if client == "wrk":
            script = self.scripts.get(endpoint.name)
            if script is None:
                script = wrk_script(self.workdir, endpoint)
                self.scripts[endpoint.name] = script
            found = await run_wrk(endpoint.url, script, connections=connections, seconds=seconds)
            requests, elapsed, p50, p99 = found.requests, found.seconds, found.p50_ms, found.p99_ms
            errors, first_error = found.errors, found.first_error
        else:
            sample, elapsed = await load(
                self.session,
                endpoint,
                seconds=seconds,
                concurrency=connections,
                max_requests=MAX_REQUESTS,
            )
            latencies = sorted(sample.latencies)
            requests = len(latencies)
            p50, p99 = percentile(latencies, 50) * 1e3, percentile(latencies, 99) * 1e3
            errors, first_error = sample.errors, sample.first_error
        cpu = cpu_seconds(server) - before
        result = Slice(
            requests=requests,
            seconds=elapsed,
            rps=requests / elapsed if elapsed > 0 else 0.0,
            p50_ms=p50,
            p99_ms=p99,
            errors=errors,
            first_error=first_error,
            cpu_us=cpu / requests * 1e6 if requests else 0.0,
        )
        key = (label, client)
        if key not in self.series:
            self.series[key] = Series(label, client)
        self.series[key].slices.append(result)
        return result

    def get(self, label: str, client: str) -> Series:
        return self.series[(label, client)]


@dataclass(frozen=True)
class Targets:
    """The endpoints of one run."""

    bare: Endpoint
    get: Endpoint  # fresh bodies
    get_hit: Endpoint  # the same body every request: the answer cache's hits
    report: Endpoint  # the whole inventory, unchanged
    report_digest: Endpoint  # F9: its digest instead
    lists: dict[int, Endpoint]  # by visible pools, fresh bodies
    list_hit: Endpoint | None  # LIST_POOLS pools, the same body every request
    events: dict[str, Endpoint]  # "tenant after=0", "tenant tail", "root after=0", "root tail"
    biggest: int  # the list that loops in (c)


HIT = " (cache hit)"  # the same body every request: after the first, the answer cache answers


def endpoint(
    base: str,
    name: str,
    path: str,
    token: str | None,
    body: dict[str, Any],
    fresh: bool = True,
) -> Endpoint:
    payload = encode(body)
    return Endpoint(name, f"{base}/api/{path}", token, lambda i: payload, fresh=fresh)


async def setup(
    session: aiohttp.ClientSession, api: Spawned, bare: Spawned, workdir: Path, fleet: Fleet
) -> Targets:
    """Credentials over HTTP, one joined node, and a check of every answer's size."""
    base = api.base
    root = (workdir / "root.token").read_text().strip()
    tokens = {}
    for size in fleet.sizes:
        created = await call(
            session, base, "iam/credentials/create", root, {"tenantId": tenant_of(size)}
        )
        tokens[size] = created["token"]
    node_token, report_body = await join_dgx(session, base, root, fleet.site_id)
    full = json.loads(report_body)
    reported = await call(session, base, "compute/nodes/report", node_token, full)
    digest_body = encode({"nodeId": full["nodeId"], "inventoryDigest": reported["inventoryDigest"]})
    biggest = max(fleet.sizes)
    reader = tenant_of(biggest)
    lists = {
        size: endpoint(
            base,
            f"pools/list {size}",
            "compute/pools/list",
            tokens[size],
            {"tenantId": tenant_of(size)},
        )
        for size in fleet.sizes
    }
    pages = {
        f"{who} {where}": (token, {"tenantId": tenant, "after": after, "limit": PAGE})
        for who, tenant, token in (("tenant", reader, tokens[biggest]), ("root", ROOT_TENANT, root))
        for where, after in (("after=0", 0), ("tail", fleet.tail_after[tenant]))
    }
    events = {
        name: endpoint(base, f"events/list {name}", "compute/events/list", token, body)
        for name, (token, body) in pages.items()
    }
    get = {"tenantId": reader, "poolId": fleet.pool_ids[-1]}
    targets = Targets(
        bare=Endpoint("bare", f"{bare.base}{BARE_PATH}", None, lambda i: b"{}"),
        get=endpoint(base, "pools/get", "compute/pools/get", tokens[biggest], get),
        get_hit=endpoint(
            base, "pools/get" + HIT, "compute/pools/get", tokens[biggest], get, fresh=False
        ),
        report=Endpoint(
            "nodes/report", f"{base}/api/compute/nodes/report", node_token, lambda i: report_body
        ),
        report_digest=Endpoint(
            "nodes/report (digest)",
            f"{base}/api/compute/nodes/report",
            node_token,
            lambda i: digest_body,
        ),
        lists=lists,
        list_hit=None
        if LIST_POOLS not in fleet.sizes
        else endpoint(
            base,
            f"pools/list {LIST_POOLS}{HIT}",
            "compute/pools/list",
            tokens[LIST_POOLS],
            {"tenantId": tenant_of(LIST_POOLS)},
            fresh=False,
        ),
        events=events,
        biggest=biggest,
    )
    # Without limit, pools/list answers every visible pool (B1); `next` may be there or not.
    for size in fleet.sizes:
        tenant = tenant_of(size)
        answer = await call(session, base, "compute/pools/list", tokens[size], {"tenantId": tenant})
        if len(answer["items"]) != size:
            raise SetupError(f"{tenant} sees {len(answer['items'])} pools, not {size}")
    for name, (token, body) in pages.items():
        answer = await call(session, base, "compute/events/list", token, body)
        if len(answer["items"]) != PAGE:
            raise SetupError(f"events/list {name}: {len(answer['items'])} events, not {PAGE}")
    return targets


# --- (c): one client looping the biggest list, in its own process -----------------------------


async def _loop_list(spec: dict[str, Any]) -> dict[str, Any]:
    """POST spec's body to its url on one connection until stdin closes; the counts. Each
    body is fresh: whitespace before its closing brace, numbered from spec's offset, so none
    meets another list's (the benchmark's put theirs after the opening brace)."""
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    counts = {"lists": 0, "errors": 0}

    async def watch_stdin() -> None:
        await loop.run_in_executor(None, sys.stdin.readline)
        stopping.set()

    watcher = asyncio.create_task(watch_stdin())
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    started = time.perf_counter()
    async with aiohttp.ClientSession(timeout=timeout) as session:
        print("looping", flush=True)
        body, number = spec["body"].encode(), int(spec["offset"])
        while not stopping.is_set():
            number += 1
            data = body[:-1] + whitespace(number) + body[-1:]
            try:
                async with session.post(
                    spec["url"], data=data, headers=headers(spec["token"])
                ) as resp:
                    await resp.read()
                    counts["lists" if resp.status == 200 else "errors"] += 1
            except (aiohttp.ClientError, OSError, TimeoutError):
                counts["errors"] += 1
    await watcher
    return {**counts, "seconds": time.perf_counter() - started}


def loop_list_main() -> int:
    spec = json.loads(sys.stdin.readline())
    print(json.dumps(asyncio.run(_loop_list(spec))), flush=True)
    return 0


@dataclass(frozen=True)
class Looped:
    lists: int
    errors: int
    seconds: float


class ListLooper:
    """``async with ListLooper(list endpoint):`` one other client loops the list meanwhile."""

    started = 0  # loopers so far in this process: each numbers its bodies from its own offset

    def __init__(self, target: Endpoint) -> None:
        self.target = target
        self.proc: asyncio.subprocess.Process | None = None
        self.result: Looped | None = None

    async def __aenter__(self) -> ListLooper:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable,
            str(THIS_FILE),
            "--loop-list",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        ListLooper.started += 1
        spec = {
            "url": self.target.url,
            "token": self.target.token,
            "body": self.target.body(0).decode(),
            "offset": ListLooper.started << 32,
        }
        self.proc.stdin.write(json.dumps(spec).encode() + b"\n")
        await self.proc.stdin.drain()
        line = await asyncio.wait_for(self.proc.stdout.readline(), LOOPER_STOP_S)
        if line.strip() != b"looping":
            raise SetupError(f"the list looper did not start: {line!r}")
        await asyncio.sleep(0.3)  # its first list is in flight
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        try:
            out, _ = await asyncio.wait_for(self.proc.communicate(), LOOPER_STOP_S)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
            raise SetupError("the list looper did not stop") from None
        if self.proc.returncode != 0:
            raise SetupError(f"the list looper exited with {self.proc.returncode}")
        counts = json.loads(out.decode().strip().splitlines()[-1])
        self.result = Looped(counts["lists"], counts["errors"], counts["seconds"])


# --- the run --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    sizes: tuple[int, ...]
    events: int
    rounds: int
    seconds: float
    concurrency: int
    clients: tuple[str, ...]
    lists_only: bool = False  # (b)'s 1,000-pool list at 8 connections only, beside the bare one


@dataclass
class Run:
    fleet: Fleet
    build_s: float
    bench: Bench
    targets: Targets
    looped: dict[str, list[Looped]]  # per client of (c), the looper's counts per loaded slice


async def rounds(options: Options, bench: Bench, targets: Targets) -> dict[str, list[Looped]]:
    c = options.concurrency
    looped: dict[str, list[Looped]] = {client: [] for client in options.clients}
    biggest = targets.lists[targets.biggest]
    for number in range(options.rounds):
        print(f"round {number + 1}/{options.rounds}", file=sys.stderr, flush=True)
        # Each client goes first in turn, so neither always meets the machine first.
        for client in options.clients[number % 2 :] + options.clients[: number % 2]:
            if options.lists_only:
                await lists_at_eight(bench, targets, client)
                continue
            # (a) ratios at c connections.
            for target in at_c(targets):
                await bench.measure(f"{target.name} @{c}", target, c, client)
            # (b) list time per request on one connection (bare: the HTTP floor), and req/s at 8.
            short = min(1.0, options.seconds)
            await bench.measure("bare @1", targets.bare, 1, client, short)
            for size, listing in targets.lists.items():
                seconds = None if size == targets.biggest else short
                await bench.measure(f"pools/list {size} @1", listing, 1, client, seconds)
            await lists_at_eight(bench, targets, client)
            # (c) pools/get alone, then while another client loops the biggest list.
            await bench.measure("pools/get @1 alone", targets.get, 1, client)
            async with ListLooper(biggest) as looper:
                await bench.measure("pools/get @1 loaded", targets.get, 1, client)
            assert looper.result is not None
            looped[client].append(looper.result)
            # (d) events pages on one connection.
            for name, page in targets.events.items():
                await bench.measure(f"events/list {name} @1", page, 1, client, short)
        bench.api.check_alive()
        bench.bare.check_alive()
    return looped


def at_c(targets: Targets) -> tuple[Endpoint, ...]:
    """(a)'s endpoints, measured at --concurrency connections, the bare handler first."""
    return (targets.bare, targets.get, targets.get_hit, targets.report, targets.report_digest)


async def lists_at_eight(bench: Bench, targets: Targets, client: str) -> None:
    """(b): the bare handler, then the 1,000-pool list fresh and cached, at 8 connections."""
    if targets.list_hit is not None:
        for target in (targets.bare, targets.lists[LIST_POOLS], targets.list_hit):
            label = f"{target.name} @{LIST_CONNECTIONS}"
            await bench.measure(label, target, LIST_CONNECTIONS, client)


async def measure_all(
    options: Options, workdir: Path, fleet: Fleet, build_s: float, api: Spawned, bare: Spawned
) -> Run:
    connector = aiohttp.TCPConnector(limit=max(options.concurrency, LIST_CONNECTIONS))
    timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        await wait_ready(session, "GET", f"{api.base}/readyz", api.proc, api.log)
        await wait_ready(session, "POST", f"{bare.base}{BARE_PATH}", bare.proc, bare.log)
        targets = await setup(session, api, bare, workdir, fleet)
        bench = Bench(session, workdir, api, bare, options.seconds)
        for target in at_c(targets):
            await warm_up(session, target, options.concurrency)
        if targets.list_hit is not None:
            await warm_up(session, targets.list_hit, 1, requests=2)
        for size, listing in targets.lists.items():
            await warm_up(session, listing, 1, requests=max(2, 2_000 // size))
        for page in targets.events.values():
            await warm_up(session, page, 1)
        looped = await rounds(options, bench, targets)
        return Run(fleet, build_s, bench, targets, looped)


def run(options: Options) -> Run:
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        workdir = Path(tmp)
        started = time.perf_counter()
        print(
            f"building {max(options.sizes)} pools and {options.events} events ...",
            file=sys.stderr,
            flush=True,
        )
        fleet = build(workdir, options.sizes, options.events)
        build_s = time.perf_counter() - started
        api_port, bare_port = free_ports(2)
        api_log, bare_log = workdir / "controlplane.log", workdir / "bare.log"
        with (
            spawned(daemon_argv(workdir, api_port), api_log) as api,
            spawned(bare_argv(bare_port), bare_log) as bare,
        ):
            return asyncio.run(
                measure_all(
                    options,
                    workdir,
                    fleet,
                    build_s,
                    Spawned(api, api_port, api_log),
                    Spawned(bare, bare_port, bare_log),
                )
            )


# --- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Figure:
    section: str
    figure: str
    client: str
    value: Spread
    unit: str
    target: str
    passed: bool | None  # None: no target
    digits: int = 2


def per_round(a: Series, b: Series, attribute: str) -> list[float]:
    """a's attribute over b's, round by round."""
    values = []
    for x, y in zip(a.slices, b.slices, strict=True):
        den = getattr(y, attribute)
        values.append(getattr(x, attribute) / den if den else 0.0)
    return values


def figures(run: Run, options: Options) -> list[Figure]:
    bench, c = run.bench, options.concurrency
    found: list[Figure] = []
    if options.lists_only:
        return [f for client in options.clients for f in list_figures(bench, client)]
    for client in options.clients:
        bare_c = bench.get(f"bare @{c}", client)
        for name in ("pools/get", "pools/get" + HIT, "nodes/report", "nodes/report (digest)"):
            ratio = Spread.of(per_round(bench.get(f"{name} @{c}", client), bare_c, "rps"))
            found.append(
                Figure(
                    "a",
                    f"{name} req/s @{c} / bare",
                    client,
                    ratio,
                    "x",
                    f">= {RATIO_TARGET}",
                    ratio.median >= RATIO_TARGET,
                    3,
                )
            )
    for client in options.clients:
        for size in options.sizes:
            series = bench.get(f"pools/list {size} @1", client)
            p50 = series.spread("p50_ms")
            found.append(
                Figure("b", f"pools/list {size} pools: time/req", client, p50, "ms", "", None)
            )
            per_pool = Spread.of([s.p50_ms * 1e3 / size for s in series.slices])
            found.append(
                Figure("b", f"pools/list {size} pools: per pool", client, per_pool, "us", "", None)
            )
        if LIST_POOLS in options.sizes:
            found += list_figures(bench, client)
    for client in options.clients:
        alone = bench.get("pools/get @1 alone", client)
        loaded = bench.get("pools/get @1 loaded", client)
        for state, series in (("alone", alone), (f"list {run.targets.biggest} looping", loaded)):
            for q in ("p50", "p99"):
                found.append(
                    Figure(
                        "c",
                        f"pools/get {q} @1 {state}",
                        client,
                        series.spread(f"{q}_ms"),
                        "ms",
                        "",
                        None,
                    )
                )
        ratio = Spread.of(per_round(loaded, alone, "p99_ms"))
        found.append(
            Figure(
                "c",
                "pools/get p99 loaded / alone",
                client,
                ratio,
                "x",
                f"<= {P99_LOADED_TARGET:g}",
                ratio.median <= P99_LOADED_TARGET,
            )
        )
    for client in options.clients:
        found.append(
            Figure(
                "d",
                "bare p50 @1 (the HTTP floor)",
                client,
                bench.get("bare @1", client).spread("p50_ms"),
                "ms",
                "",
                None,
                3,
            )
        )
        for name in run.targets.events:
            p50 = bench.get(f"events/list {name} @1", client).spread("p50_ms")
            found.append(
                Figure(
                    "d",
                    f"events/list {name}: page p50",
                    client,
                    p50,
                    "ms",
                    f"< {EVENTS_TARGET_MS:g}",
                    p50.median < EVENTS_TARGET_MS,
                    3,
                )
            )
    return found


def list_figures(bench: Bench, client: str) -> list[Figure]:
    """(b) at 8 connections: the 1,000-pool list's req/s fresh and cached, each over the bare
    handler's in the same round, and fresh over cached (F8: at most 6 x)."""
    found = []
    bare8 = bench.get(f"bare @{LIST_CONNECTIONS}", client)
    fresh = bench.get(f"pools/list {LIST_POOLS} @{LIST_CONNECTIONS}", client)
    cached = bench.get(f"pools/list {LIST_POOLS}{HIT} @{LIST_CONNECTIONS}", client)
    for listing in (fresh, cached):
        rps = listing.spread("rps")
        name = listing.label.removesuffix(f" @{LIST_CONNECTIONS}")
        found.append(
            Figure(
                "b",
                f"{name} req/s @{LIST_CONNECTIONS}",
                client,
                rps,
                "req/s",
                f">= {LIST_TARGET_RPS:g} (10 x Placement's {PLACEMENT_REFERENCE}, earlier)",
                rps.median >= LIST_TARGET_RPS,
                1,
            )
        )
        ratio = Spread.of(per_round(listing, bare8, "rps"))
        found.append(
            Figure("b", f"{name} req/s @{LIST_CONNECTIONS} / bare", client, ratio, "x", "", None, 3)
        )
    slower = Spread.of(per_round(cached, fresh, "rps"))
    found.append(
        Figure(
            "b",
            f"pools/list {LIST_POOLS}: cached req/s / fresh",
            client,
            slower,
            "x",
            f"<= {FRESH_TARGET:g}",
            slower.median <= FRESH_TARGET,
            2,
        )
    )
    return found


def report(run: Run, options: Options) -> list[str]:
    fleet, bench = run.fleet, run.bench
    reader = tenant_of(max(fleet.sizes))
    out = [
        f"bench/fleet.py: {len(fleet.pool_ids)} pools, {fleet.events} events "
        f"({reader} sees {fleet.visible_events.get(reader, 0)}), built in {run.build_s:.1f} s; "
        f"{options.rounds} interleaved rounds of {options.seconds:g} s slices "
        f"(events pages 1 s); clients: {', '.join(options.clients)}; "
        f"{os.cpu_count()} CPUs shared by the clients, the servers and whatever else runs",
        "",
        "each series: the median over rounds [lowest-highest]; cpu us: the serving process's "
        "CPU time per request",
    ]
    rows = []
    for series in bench.series.values():
        errors = sum(s.errors for s in series.slices)
        rows.append(
            (
                series.label,
                series.client,
                str(sum(s.requests for s in series.slices)),
                series.spread("rps").show(1),
                series.spread("p50_ms").show(3),
                series.spread("p99_ms").show(3),
                series.spread("cpu_us").show(0),
                str(errors),
            )
        )
    out += table(
        ("series", "client", "requests", "req/s", "p50 ms", "p99 ms", "cpu us", "errors"), rows
    )
    for client, counts in run.looped.items():
        done = ", ".join(f"{c.lists} in {c.seconds:.1f} s" for c in counts)
        errors = sum(c.errors for c in counts)
        out.append(
            f"(c) with {client} measuring: the looping client (aiohttp, its own process) listed "
            f"{run.targets.biggest} pools {done} ({errors} errors)"
        )
    for series in bench.series.values():
        for s in series.slices:
            if s.first_error is not None:
                out.append(f"{series.label} [{series.client}]: first error: {s.first_error}")
                break
    out += [
        "",
        "summary (targets informational; (b)'s 350 req/s is 10 x the 15-35 req/s OpenStack "
        "Placement served for 1,000 providers on this machine earlier, not measured in this run; "
        "(e) liveness at 100k nodes: bench/liveness.py)",
    ]
    summary = [
        (
            f"({f.section}) {f.figure}",
            f.client,
            f"{f.value.show(f.digits)} {f.unit}",
            f.target,
            "-" if f.passed is None else "PASS" if f.passed else "FAIL",
        )
        for f in figures(run, options)
    ]
    out += table(("figure", "client", "median [range]", "target", "result"), summary)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 rounds of 1 s slices")
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 3; quick 2)")
    parser.add_argument(
        "--seconds", type=float, help="seconds per slice, whole for wrk (default 2; quick 1)"
    )
    parser.add_argument("--concurrency", type=int, default=32, help="connections for (a)")
    parser.add_argument(
        "--sizes", help="visible pools per tenant, comma-separated (default 10,100,1000,10000)"
    )
    parser.add_argument("--events", type=int, help=f"events in the log (default {FULL_EVENTS})")
    parser.add_argument(
        "--client",
        choices=("both", "aiohttp", "wrk"),
        default="both",
        help="which load clients (both: wrk when installed, and aiohttp)",
    )
    parser.add_argument(
        "--lists",
        action="store_true",
        help=f"only (b)'s {LIST_POOLS}-pool list, fresh and cached, at {LIST_CONNECTIONS} "
        "connections beside the bare handler (sizes: 1000 and no events unless given)",
    )
    parser.add_argument("--loop-list", action="store_true", help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def options_of(args: argparse.Namespace) -> Options:
    sizes = (
        tuple(int(n) for n in args.sizes.split(","))
        if args.sizes
        else (LIST_POOLS,)
        if args.lists
        else QUICK_SIZES
        if args.quick
        else FULL_SIZES
    )
    if not sizes or min(sizes) < 1 or len(set(sizes)) != len(sizes):
        raise SetupError(f"--sizes: distinct positive counts, not {args.sizes!r}")
    events = (
        args.events
        if args.events is not None
        else 0
        if args.lists
        else QUICK_EVENTS
        if args.quick
        else FULL_EVENTS
    )
    has_wrk = wrk_path() is not None
    if args.client == "wrk" and not has_wrk:
        raise SetupError("--client wrk: wrk is not installed (apt-get install wrk)")
    clients = {
        "both": ("wrk", "aiohttp") if has_wrk else ("aiohttp",),
        "aiohttp": ("aiohttp",),
        "wrk": ("wrk",),
    }[args.client]
    rounds = args.rounds or (2 if args.quick else 3)
    seconds = args.seconds or (1.0 if args.quick else 2.0)
    if rounds < 1 or seconds <= 0 or args.concurrency < 1:
        raise SetupError("--rounds, --seconds and --concurrency must be positive")
    return Options(
        sizes=tuple(sorted(sizes)),
        events=max(events, 0),
        rounds=rounds,
        seconds=seconds,
        concurrency=args.concurrency,
        clients=clients,
        lists_only=args.lists,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.loop_list:
        return loop_list_main()
    try:
        options = options_of(args)
        if "wrk" not in options.clients:
            print("bench/fleet.py: wrk not installed: aiohttp client only", file=sys.stderr)
        result = run(options)
    except SetupError as exc:
        print(f"bench/fleet.py: setup failed: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report(result, options)))
    errors = sum(s.errors for series in result.bench.series.values() for s in series.slices)
    errors += sum(c.errors for counts in result.looped.values() for c in counts)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
