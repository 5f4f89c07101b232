"""What a node should run: its NodeSpec rendered from its inventory and its pool's policy
(N6), the version it is served under, and which GPUs its drain-gated units hold (H4).

Nothing here reads or writes the database: ``respecify`` answers the node's columns that moved, and the node's
reconcile writes them in one statement with the rest (capacity/nodes.py).
"""

import hashlib
from dataclasses import dataclass, field
from typing import Any

import msgspec
from msgspec import UNSET

from controlplane.capacity.delivery import served_version
from controlplane.storage.node_types import NodePool, NodeRow
from shared.inventory import Inventory
from shared.nodespec import NodeSpecUnits, RenderRefused, Unit
from shared.policy import Policy
from shared.render import render


def units_for(
    policy: Policy,
    sharing: str,
    gpu_model: str | None,
    inventory: Inventory,
    booked: frozenset[str] = frozenset(),
) -> NodeSpecUnits:
    """The units a host runs under the policy (N6), what the reconciler serves and a plan
    (capacity/plan.py) compares; ``booked`` GPUs keep their MIG layout (U3)."""
    return render(
        policy, sharing=sharing, gpu_model=gpu_model, inventory=inventory, booked_gpus=booked
    )


def unit_key(unit: Unit) -> str:
    """What a unit asks of the host, without the GPUs it lists (they move with bookings)."""
    return hashlib.sha256(msgspec.json.encode(msgspec.structs.replace(unit, gpus=[]))).hexdigest()


def applied_units(node: NodeRow) -> dict[str, str]:
    """H4: which units the agent reports applied (or unchanged), by id, with the key of the
    unit it took. Taken from the spec the report was for (the stored one, before this
    reconcile renders anew: a booking may move the version meanwhile)."""
    done = node.applied_units
    report = node.applied or {}
    stored = node.spec
    if report.get("version") != node.spec_version or stored is None:
        return done
    keys = {unit.id: unit_key(unit) for unit in stored.units}
    took = {
        unit_id: keys[unit_id]
        for u in report.get("units", [])
        if u.get("status") in ("applied", "unchanged") and (unit_id := u.get("id")) in keys
    }
    if all(done.get(i) == key for i, key in took.items()):
        return done
    return {**done, **took}


def gated_gpus(units: NodeSpecUnits, done: dict[str, str]) -> frozenset[str]:
    """H4: the GPUs of the spec's drain-gated units that differ from what the agent last
    reported applied under the same unit id: they leave placement from the render until it
    does. Kept per unit, not per spec version, since every booking moves the version and a
    sharing unit lists every GPU of the host. A unit whose GPUs come from the inventory (a
    MIG layout: the GPUs not yet in it) holds them until an inventory shows them done."""
    return frozenset(
        gpu
        for unit in units.units
        if unit.needs == "drain"
        and (unit.gpus_from_inventory or done.get(unit.id) != unit_key(unit))
        for gpu in unit.gpus
    )


@dataclass(frozen=True)
class Respecified:
    refusal: str | None  # why the host cannot take the policy (it keeps its last spec)
    held_layout: bool  # a booked GPU kept an older MIG layout (U3): look again next pass
    version: str | None  # the spec version the node is to apply
    gated_gpus: frozenset[str]  # GPUs a drain-gated unit of that spec touches (H4)
    fields: dict[str, Any] = field(default_factory=dict)  # the node's columns that moved


def respecify(
    node: NodeRow, pool: NodePool, policy: Policy, inventory: Inventory, booked: frozenset[str]
) -> Respecified:
    """Render the node's NodeSpec (N6); its columns to write when it moved. ``booked``: the
    GPUs with a booked atom (their MIG layout stays until they are idle, U3).

    A host that cannot take the policy keeps its last spec and is quarantined with the
    reason; a booked GPU that kept an older MIG layout (U3) makes the node looked at again
    until its GPUs are idle.
    """
    done = applied_units(node)
    fields: dict[str, Any] = {}
    if done != node.applied_units:
        fields.update(applied_units=msgspec.json.encode(done).decode())
    try:
        units = units_for(policy, pool.sharing, pool.gpu_model, inventory, booked)
    except RenderRefused as exc:
        kept = node.spec
        return Respecified(
            f"this host cannot take the policy: {exc.field}: {exc.message}",
            False,
            node.spec_version,
            gated_gpus(kept, done) if kept else frozenset(),
            fields,
        )
    version = served_version(pool, units, node.bookings_json)
    if version != node.spec_version:
        fields.update(spec=msgspec.json.encode(units).decode(), spec_version=version)
    held_layout = bool(booked) and pool.sharing == "mig" and policy.migLayout is not UNSET
    return Respecified(None, held_layout, version, gated_gpus(units, done), fields)
