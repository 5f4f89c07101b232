"""The capacity reconciler: node_resources rows and GPU atoms follow inventories and policies.

Rows derive only from (inventory, pool policy), so each node remembers the
inventory revision and pool version its rows were computed from; a pass
recomputes just the nodes where either moved and rewrites only rows whose
values changed (N5). It also persists liveness stamps and marks silent nodes
lost. Every pass is one transaction on the writer.
"""

import asyncio
import functools
import time
from dataclasses import dataclass
from typing import Any

import msgspec
import sqlite_utils
import structlog
from msgspec import UNSET

from controlplane.capacity.liveness import Liveness
from controlplane.capacity.resources import HostFacts, desired_rows, gpu_atoms, settled
from controlplane.storage import events
from controlplane.storage import nodes as node_sql
from controlplane.storage.db import Store, now, timestamp
from shared.inventory import Inventory
from shared.policy import parse_policy

log = structlog.get_logger("controlplane.reconciler")


@dataclass
class PassStats:
    nodes_recomputed: int = 0
    rows_written: int = 0
    nodes_lost: int = 0


def reconcile_node(db: sqlite_utils.Database, node: dict[str, Any]) -> int:
    """Bring one node's rows and atoms to what its inventory and pool imply; returns writes."""
    policy = parse_policy(msgspec.json.decode(node["policy"]))
    facts = HostFacts(**{name: node[name] for name in node_sql.FACTS})
    desired = desired_rows(facts, node["class"], policy)
    existing = node_sql.resource_rows(db, node["id"])
    writes = 0
    for resource, row in desired.items():
        have = existing.get(resource)
        capacity = settled(row.capacity, have["allocated"] if have else 0)
        if have is None or have["capacity"] != capacity or have["ratio"] != row.ratio:
            node_sql.put_resource(db, node["id"], resource, capacity, row.ratio)
            writes += 1
    for resource in existing.keys() - desired.keys():
        node_sql.delete_resource(db, node["id"], resource)
        writes += 1
    gpus = msgspec.json.decode(node["inventory"], type=Inventory).gpus if node["inventory"] else []
    replicas = None if policy.replicas is UNSET else policy.replicas
    wanted = {a.device_id: a for a in gpu_atoms(gpus, node["class"], node["sharing"], replicas)}
    have_devices = node_sql.devices(db, node["id"])
    for device_id, atom in wanted.items():
        have = have_devices.get(device_id)
        if have is not None and (have["resource"], have["profile"]) == (
            atom.resource,
            atom.profile,
        ):
            continue
        if have is not None:
            node_sql.delete_device(db, node["id"], device_id)
        node_sql.insert_device(
            db, node["id"], device_id, atom.resource, atom.gpu_uuid, atom.profile
        )
        writes += 1
    for device_id in have_devices.keys() - wanted.keys():
        node_sql.delete_device(db, node["id"], device_id)
        writes += 1
    node_sql.mark_rows_current(db, node["id"], node["inventory_rev"], node["pool_version"])
    return writes


def reconcile_one(db: sqlite_utils.Database, node_id: str) -> int:
    """Right after a join or a changed inventory: the node's rows, in the caller's transaction."""
    return sum(reconcile_node(db, node) for node in node_sql.stale_node(db, node_id))


def reconcile_pass(
    db: sqlite_utils.Database, seen: list[tuple[str, str]], lost_after: float
) -> PassStats:
    """One pass: persist liveness stamps, mark silent nodes lost, recompute stale nodes."""
    stats = PassStats()
    if seen:
        node_sql.touch(db, seen)
    at = now()
    before = timestamp(time.time() - lost_after)
    for node in node_sql.mark_lost(db, before, at):
        events.append(
            db,
            "node.lost",
            pool_id=node["pool_id"],
            data={
                "nodeId": node["id"],
                "hostname": node["hostname"],
                "lastSeenAt": node["last_seen_at"],
            },
            audience=[node["owner_tenant_id"]],
        )
        stats.nodes_lost += 1
    for node in node_sql.stale_nodes(db):
        stats.rows_written += reconcile_node(db, node)
        stats.nodes_recomputed += 1
    return stats


def _pass(
    db: sqlite_utils.Database, *, seen: list[tuple[str, str]], lost_after: float
) -> PassStats:
    return reconcile_pass(db, seen, lost_after)


async def run_reconciler(
    store: Store, liveness: Liveness, interval: float, lost_after: float
) -> None:
    """Every ``interval`` seconds, one pass; a failed pass is logged and the next one retries."""
    while True:
        await asyncio.sleep(interval)
        # Drained here, on the event loop that stamps them, and handed to the writer.
        seen = liveness.drain()
        try:
            stats = await store.write(
                functools.partial(reconcile_pass, seen=seen, lost_after=lost_after)
            )
        except Exception:
            liveness.restore(seen)
            log.exception("reconciler pass failed")
            continue
        if stats.nodes_recomputed or stats.nodes_lost:
            log.info(
                "reconciled",
                nodes=stats.nodes_recomputed,
                rows_written=stats.rows_written,
                lost=stats.nodes_lost,
            )
