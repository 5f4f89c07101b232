"""A dry-run plan (C1) of a MIG layout change over a pool of 1,000 nodes, against a bare handler.

Run it with ``.venv/bin/python bench/plan.py [--nodes 1000] [--requests 30]``.

What it does, in one run:

1. Builds a SQLite database before any daemon runs (1,000 joins over HTTP would measure the
   joins): ``Store(path)`` runs the migrations, the services' ``bootstrap`` makes tenant
   ``root`` and its token, and one transaction writes, through the storage functions the
   services use, a shared site, a ``mig`` pool of A100s owned by root (its policy a MIG layout
   of seven 1g.10gb per GPU), tenant ``acme`` offered it with a ``gpu.mig`` quota, and N ready
   nodes carrying the recorded DGX A100's inventory (8 GPUs, each its own UUIDs). One
   reconciler pass (``reconcile_pass``, the daemon's own) then renders every node's NodeSpec
   and writes its rows and MIG atoms, as the running daemon would.
2. Starts the real daemon (``better-compute-controlplane serve``) on that file and the bare
   aiohttp handler (``bench/common.py --serve-bare``), each its own process on 127.0.0.1.
3. Times ``pools/update {dryRun: true}`` with a new layout (two 3g.40gb per GPU: every node's
   ``mig/apply`` changes, every GPU is drained, ``gpu.mig`` goes from 7 to 2 per GPU) over one
   connection, one request at a time, each planning every node of the pool: the renderer on
   the old and the new policy, the drain-gating, the resource math and the quota coverage.
   The bare handler is timed the same way in the same run: the HTTP floor.
4. Prints p50 and p99 of both and the plan's time per node (nodes with nothing booked: their
   stored spec stands for the current policy; a node with bookings is rendered twice). The exit status is 0 unless the
   setup or a request failed.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    BARE_PATH,
    SetupError,
    bare_argv,
    call,
    daemon_argv,
    encode,
    free_ports,
    headers,
    percentile,
    spawned,
    wait_ready,
)
from reconciler import insert_ready_nodes

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from agent.inventory import collect_inventory
from controlplane.capacity.liveness import Liveness
from controlplane.iam.decide import ROOT_TENANT
from controlplane.reconciler import reconcile_pass
from controlplane.services.iam import bootstrap
from controlplane.storage import iam as iam_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import quotas as quota_sql
from controlplane.storage import sites as site_sql
from controlplane.storage.db import Store, now
from controlplane.storage.nodes import STALE
from controlplane.storage.sql import Database
from shared.inventory import Inventory, MigInstance

FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
POOL_ID = "pool_" + "0" * 26
SITE_ID = "site_" + "0" * 26
BEFORE = {"migLayout": {"default": ["1g.10gb"] * 7}}
AFTER = {"migLayout": {"default": ["3g.40gb", "3g.40gb"]}}


def laid_out(base: Inventory, n: int) -> Inventory:
    """Machine ``n``: the recorded DGX A100 with its own ids, every GPU in BEFORE's layout."""
    gpus = []
    for gpu in base.gpus:
        uuid = f"GPU-{n:08x}-0000-0000-0000-{gpu.index:012x}"
        instances = [
            MigInstance(
                uuid=f"MIG-{n:08x}-{gpu.index:04x}-{i:04x}",
                profile="1g.10gb",
                gpu_instance_id=i,
                compute_instance_id=0,
            )
            for i in range(7)
        ]
        gpus.append(
            msgspec.structs.replace(
                gpu, uuid=uuid, mig_current=True, mig_pending=True, mig_instances=instances
            )
        )
    return msgspec.structs.replace(base, machine_id=f"m{n}", hostname=f"a100-{n:05d}", gpus=gpus)


def populate(db: Database, count: int) -> None:
    at = now()
    site_sql.insert_site(
        db,
        {
            "id": SITE_ID,
            "owner_tenant_id": ROOT_TENANT,
            "name": "fra1",
            "region": "eu-central",
            "kind": "shared",
            "created_at": at,
        },
    )
    pool_sql.insert_pool(
        db,
        {
            "id": POOL_ID,
            "owner_tenant_id": ROOT_TENANT,
            "site_id": SITE_ID,
            "class": "metal-host",
            "gpu_model": "A100",
            "sharing": "mig",
            "agent": "bcd",
            "policy": msgspec.json.encode(BEFORE).decode(),
            "provider_account_id": None,
            "created_at": at,
        },
    )
    pool = pool_sql.get_pool(db, POOL_ID)
    assert pool is not None
    iam_sql.insert_tenant(db, "acme", None, None, at)
    for tenant in (ROOT_TENANT, "acme"):
        pool_sql.put_authz(db, tenant, pool, "eu-central")
    pool_sql.put_offer(db, POOL_ID, "acme", False, 0, at)
    quota_sql.put_quota(db, POOL_ID, ROOT_TENANT, "gpu.mig", 2147483647, at)
    quota_sql.put_quota(db, POOL_ID, "acme", "gpu.mig", 4 * count * 8, at)
    base = collect_inventory(fixture=FIXTURES, fixture_host="dgx-a100-02")
    insert_ready_nodes(db, POOL_ID, [laid_out(base, n) for n in range(count)], at)


def build(directory: Path, count: int) -> float:
    """directory/db.sqlite, bootstrapped and filled, its rows and specs reconciled; seconds."""
    store = Store(directory / "db.sqlite")
    try:
        if not bootstrap(store, directory / "root.token"):
            raise SetupError("the database was not empty")
        store.transact(lambda db: populate(db, count))
        started = time.perf_counter()
        store.transact(lambda db: reconcile_pass(db, Liveness(), 3600, False))
        seconds = time.perf_counter() - started
        store.transact(applied)
        store.transact(lambda db: reconcile_pass(db, Liveness(), 3600, False))
        return seconds
    finally:
        store.close()


def applied(db: Database) -> None:
    """What each node's agent reports after its first cycle: every unit of its spec applied
    (H1); the next pass makes the nodes ready."""
    found = db.execute("SELECT id, spec, spec_version FROM nodes").fetchall()
    for node_id, spec, version in found:
        units = [
            {"id": unit["id"], "status": "applied"} for unit in msgspec.json.decode(spec)["units"]
        ]
        report = msgspec.json.encode({"version": version, "units": units}).decode()
        db.execute(
            "UPDATE nodes SET applied = ?, rows_pool_version = ? WHERE id = ?",
            [report, STALE, node_id],
        )


async def timed(
    session: aiohttp.ClientSession, url: str, body: bytes, token: str | None, count: int
) -> list[float]:
    """Milliseconds of ``count`` requests, one at a time; any answer but 200 fails."""
    spent = []
    for _ in range(count):
        started = time.perf_counter()
        async with session.post(url, data=body, headers=headers(token)) as response:
            payload = await response.read()
            if response.status != 200:
                raise SetupError(f"{url}: HTTP {response.status}: {payload[:300]!r}")
        spent.append((time.perf_counter() - started) * 1000)
    return sorted(spent)


async def measure(directory: Path, nodes: int, requests: int) -> int:
    port, bare_port = free_ports(2)
    base, bare = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{bare_port}"
    token = (directory / "root.token").read_text().strip()
    body = {"tenantId": "root", "poolId": POOL_ID, "policy": AFTER, "dryRun": True}
    with (
        spawned(daemon_argv(directory, port), directory / "daemon.log") as daemon,
        spawned(bare_argv(bare_port), directory / "bare.log") as baseline,
    ):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
            await wait_ready(session, "GET", f"{base}/readyz", daemon, directory / "daemon.log")
            await wait_ready(
                session, "POST", f"{bare}{BARE_PATH}", baseline, directory / "bare.log"
            )
            answer = await call(session, base, "compute/pools/update", token, body)
            plan = answer["plan"]
            capacity = {row["resource"]: row for row in plan["capacity"]}
            drained = sum(node["drainNeeded"] for node in plan["nodes"])
            uncovered = sum(not quota["covered"] for quota in plan["quotas"])
            url = f"{base}/api/compute/pools/update"
            planned = await timed(session, url, encode(body), token, requests)
            floor = await timed(session, f"{bare}{BARE_PATH}", b"{}", None, requests)
    p50, p99 = percentile(planned, 50), percentile(planned, 99)
    bare50, bare99 = percentile(floor, 50), percentile(floor, 99)
    mig = capacity["gpu.mig"]
    print(
        f"plan of {len(plan['nodes'])} nodes: {drained} to drain, gpu.mig "
        f"{mig['before']} -> {mig['after']}, {uncovered} offered quota(s) uncovered"
    )
    print(
        f"pools/update dryRun  p50 {p50:8.1f} ms  p99 {p99:8.1f} ms  "
        f"({1000 * p50 / nodes:.0f} us per node)"
    )
    print(f"bare handler         p50 {bare50:8.2f} ms  p99 {bare99:8.2f} ms")
    print(
        f"ratio p50 dry run / bare: {p50 / bare50:.0f} x ({requests} requests each, 1 connection)"
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--requests", type=int, default=30)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bc-plan-") as tmp:
        directory = Path(tmp)
        try:
            seconds = build(directory, args.nodes)
            print(
                f"built {args.nodes} ready nodes; their first reconcile pass took {seconds:.1f} s"
            )
            return asyncio.run(measure(directory, args.nodes, args.requests))
        except SetupError as exc:
            print(f"setup failed: {exc}", file=sys.stderr)
            return 2


if __name__ == "__main__":
    sys.exit(main())
