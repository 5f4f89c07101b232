"""A policy change planned before it is made (C1): what each node of the pool would run
(the NodeSpec renderer the reconciler serves, capacity/spec.py), what that asks of it (drains
gated as H4 gates them, restarts, reboots), the capacity the resource math would give once
every node took it with today's bookings ended (capacity/resources.py), and the offered
quotas that capacity would no longer cover. Reads only: nothing here writes.
"""

from collections.abc import Iterator
from dataclasses import dataclass

import msgspec
from msgspec import UNSET

from controlplane.capacity.resources import HOST_CLASSES, desired_rows, gpu_atoms
from controlplane.capacity.rows import facts_of
from controlplane.capacity.spec import unit_key, units_for
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import quotas as quota_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.node_types import NodeRow
from controlplane.storage.sql import Database
from controlplane.storage.types import PoolRow
from shared.inventory import Gpu, Inventory, MigInstance
from shared.nodespec import NodeSpecUnits, RenderRefused, Unit
from shared.policy import Policy
from shared.schemas import Plan, PlanCapacity, PlanNode, PlanQuota, PlanUnit
from shared.schemas.pools import PlanNeed, UnitChange

PAGE = 1000  # nodes read at a time


@dataclass(frozen=True)
class Change:
    """The pool as it is and as the change would make it."""

    pool: PoolRow
    before: Policy
    after: Policy
    gpu_model: str | None  # the pool's GPU model after the change


def _needs(unit: Unit) -> list[PlanNeed]:
    """What taking (or undoing) a unit asks of the host, as the plan lists it."""
    needs: set[PlanNeed] = set()
    if unit.needs != "nothing":
        needs.add(unit.needs)
    if unit.restarts:
        needs.add("restart")
    return sorted(needs)


def _unit_changes(before: list[Unit], after: list[Unit]) -> list[tuple[Unit, UnitChange]]:
    """Each unit the change adds, changes or removes, in the new spec's order, then the
    removed ones in the old one's."""
    old = {unit.id: unit for unit in before}
    new = {unit.id for unit in after}
    changes: list[tuple[Unit, UnitChange]] = [
        (unit, "add" if unit.id not in old else "change")
        for unit in after
        if unit.id not in old or unit_key(old[unit.id]) != unit_key(unit)
    ]
    removed: list[tuple[Unit, UnitChange]] = [
        (unit, "remove") for unit in before if unit.id not in new
    ]
    return changes + removed


def taken(inventory: Inventory, policy: Policy, units: list[Unit]) -> Inventory:
    """The host once it took ``units``: the GPUs the MIG apply repartitions carry the
    layout's instances (its ``gpus``, rendered as if nothing were booked). Other changes
    leave the inventory as it is (replicas and reserves are the resource math's)."""
    layout = policy.migLayout
    changing = {gpu for unit in units if unit.id == "mig/apply" for gpu in unit.gpus}
    if layout is UNSET or not changing:
        return inventory

    def repartitioned(gpu: Gpu) -> Gpu:
        profiles = layout.get(gpu.uuid, layout.get("default", []))
        instances = [
            MigInstance(
                uuid=f"{gpu.uuid}::{n}", profile=p, gpu_instance_id=n, compute_instance_id=0
            )
            for n, p in enumerate(profiles)
        ]
        return msgspec.structs.replace(
            gpu, mig_current=True, mig_pending=True, mig_instances=instances
        )

    return msgspec.structs.replace(
        inventory,
        gpus=[repartitioned(gpu) if gpu.uuid in changing else gpu for gpu in inventory.gpus],
    )


def _running(
    node: NodeRow, change: Change, inventory: Inventory, booked_nodes: set[str]
) -> NodeSpecUnits:
    """The units the node runs under the current policy, as if nothing were booked: the spec
    the reconciler stored for it when that is current (rendered from this inventory and pool
    version) and nothing on it is booked (so the render left nothing as it is, U3); else the
    same render made again."""
    pool, stored = change.pool, node.spec
    current = (node.rows_inventory_rev, node.rows_pool_version) == (
        node.inventory_rev,
        pool.version,
    )
    if stored is not None and current and node.id not in booked_nodes:
        return stored
    return units_for(change.before, pool.sharing, pool.gpu_model, inventory)


def _schedulable(node: NodeRow) -> bool:
    """H2, as storage's SCHEDULABLE reads it: ready, not cordoned, not draining."""
    return (
        node.state == "ready"
        and node.cordon_reason is None
        and node.drain_state is None
        and node.removed_at is None
    )


def capacity_after(node: NodeRow, change: Change, inventory: Inventory) -> dict[str, int]:
    """The node's schedulable capacity per resource once it took the change with today's
    bookings ended: its rows by the resource math (N3, N4), its atoms (S1) on healthy GPUs."""
    pool = change.pool
    if not _schedulable(node) or pool.pool_class not in HOST_CLASSES:
        return {}
    rows = desired_rows(facts_of(node), pool.pool_class, change.after)
    found = {resource: row.capacity for resource, row in rows.items()}
    replicas = None if change.after.replicas is UNSET else change.after.replicas
    healthy = [gpu for gpu in inventory.gpus if gpu.health == "healthy"]
    for atom in gpu_atoms(healthy, pool.pool_class, pool.sharing, replicas):
        found[atom.resource] = found.get(atom.resource, 0) + 1
    return found


def _untouched(node: NodeRow) -> PlanNode:
    """A node the plan cannot render for: nothing planned on it."""
    return PlanNode(
        node_id=node.id,
        hostname=node.hostname,
        units=[],
        drain_needed=False,
        bookings_in_the_way=[],
        reboot_needed=False,
    )


def _pages(db: Database, pool_id: str) -> Iterator[list[NodeRow]]:
    """The pool's live nodes, a page at a time."""
    after = ""
    while page := node_sql.nodes_of_pools(db, [pool_id], None, after, PAGE):
        yield page
        after = page[-1].id


def _plan_node(
    node: NodeRow, change: Change, booked: dict[tuple[str, str], set[str]], booked_nodes: set[str]
) -> tuple[PlanNode, dict[str, int]] | str:
    """One node's part of the plan and its schedulable capacity after, or why the host cannot
    take the policy (it would be quarantined: no capacity after)."""
    pool, inventory = change.pool, node.inventory
    if inventory is None:  # nothing rendered yet: it takes the policy when it reports
        return _untouched(node), {}
    try:
        old = _running(node, change, inventory, booked_nodes)
        new = units_for(change.after, pool.sharing, change.gpu_model, inventory)
    except RenderRefused as exc:
        return f"{node.hostname}: this host cannot take the policy: {exc.field}: {exc.message}"
    changes = _unit_changes(old.units, new.units)
    drains = [unit for unit, how in changes if how != "remove" and unit.needs == "drain"]
    in_the_way = {
        reservation
        for unit in drains
        for gpu in unit.gpus
        for reservation in booked.get((node.id, gpu), ())
    }
    planned = PlanNode(
        node_id=node.id,
        hostname=node.hostname,
        units=[PlanUnit(id=unit.id, change=how, needs=_needs(unit)) for unit, how in changes],
        drain_needed=bool(drains),
        bookings_in_the_way=sorted(in_the_way),
        reboot_needed=any(unit.needs == "reboot" for unit, _ in changes),
    )
    return planned, capacity_after(node, change, taken(inventory, change.after, new.units))


def plan_change(db: Database, change: Change, warnings: list[str]) -> Plan:
    """C1: the plan of ``change`` over every node of the pool, a page of nodes at a time."""
    pool = change.pool
    nodes, after, refused = [], dict[str, int](), []
    for page in _pages(db, pool.id):
        booked: dict[tuple[str, str], set[str]] = {}  # (node, GPU) → live reservations on it
        devices = node_sql.devices_of(db, [node.id for node in page])
        live = res_sql.live_ids(db, {d.reservation_id for d in devices if d.reservation_id})
        for device in devices:
            if device.reservation_id in live:
                booked.setdefault((device.node_id, device.gpu_uuid), set()).add(
                    device.reservation_id
                )
        booked_nodes = {device.node_id for device in devices if device.allocated}
        for node in page:
            done = _plan_node(node, change, booked, booked_nodes)
            if isinstance(done, str):
                refused.append(done)
                nodes.append(_untouched(node))
                continue
            nodes.append(done[0])
            for resource, amount in done[1].items():
                after[resource] = after.get(resource, 0) + amount
    before = {row.resource: row.schedulable for row in pool_sql.capacity_ledger(db, pool.id)}
    offered = {offer.to_tenant_id for offer in pool_sql.offers_of(db, pool.id)}
    quotas = [
        PlanQuota(
            tenant_id=row.tenant_id,
            resource=row.resource,
            max=row.max,
            schedulable_after=after.get(row.resource, 0),
            covered=row.max <= after.get(row.resource, 0),
        )
        for row in quota_sql.pool_quota_rows(db, [pool.id])
        if row.tenant_id in offered
    ]
    return Plan(
        nodes=nodes,
        capacity=[
            PlanCapacity(
                resource=resource, before=before.get(resource, 0), after=after.get(resource, 0)
            )
            for resource in sorted(before.keys() | after.keys())
        ],
        quotas=quotas,
        warnings=[*warnings, *refused],
    )
