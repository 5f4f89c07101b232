"""One node's capacity: its node_resources rows, GPU atoms, NodeSpec and state follow its
inventory and its pool's policy.

Rows derive only from (inventory, pool policy), so each node remembers the
inventory revision and pool version its rows were computed from; the reconciler
recomputes just the nodes where either moved and rewrites only rows whose
values changed (N5). A node whose rows are held at what is allocated, or whose
booked atom vanished, is left stale so every pass looks again until the
booking ends. A pool's new version also re-decides each node's admission (a
new gpuModel or acceptance check). Each node is reconciled in its own savepoint
(R5), in the caller's transaction: a pass, a join or a report.
"""

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec
import structlog
from msgspec import UNSET

from controlplane.capacity.admission import LOST, QUARANTINED, READY, admission, configured
from controlplane.capacity.resources import HostFacts, desired_rows, gpu_atoms, settled
from controlplane.storage import events
from controlplane.storage import nodes as node_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import now, savepoint
from controlplane.storage.sql import Database
from shared.inventory import Gpu, Inventory
from shared.nodespec import NodeSpecUnits, RenderRefused, Unit
from shared.policy import Policy, parse_policy
from shared.render import render

log = structlog.get_logger("controlplane.capacity")
T = TypeVar("T")


# A quarantine reason is shown to people; an exception's text can be long.
MAX_REASON = 500


@dataclass(frozen=True)
class Failed:
    """A part of a pass that raised; what it wrote was undone."""

    error: str


def isolated(db: Database, what: str, what_id: str, fn: Callable[..., T], *args: Any) -> T | Failed:
    """Run one node's or reservation's part of a pass in a savepoint: a failure undoes only
    that part, is logged, and the pass goes on for every other one (R5)."""
    try:
        with savepoint(db):
            return fn(*args)
    except Exception as exc:
        if not db.in_transaction:
            raise  # SQLite rolled the whole transaction back (disk full, I/O): stop the pass
        log.exception(f"{what} could not be reconciled", id=what_id)
        return Failed(str(exc) or repr(exc))


def quarantine_unreconcilable(db: Database, node: dict[str, Any], error: str) -> None:
    """R5: a node the pass cannot reconcile leaves placement with the reason; once its pool or
    inventory changes so that it can be, the next pass re-decides its state."""
    reason = f"cannot be reconciled: {error}"[:MAX_REASON]
    if node["state"] in (LOST, QUARANTINED) and node["state_reason"] == reason:
        return
    if node["state"] == LOST:
        return  # lost stays lost until it reports
    node_sql.update_node(
        db, node["id"], {"state": QUARANTINED, "state_reason": reason, "updated_at": now()}
    )
    state_event(db, node, node["owner_tenant_id"], QUARANTINED, reason)


def readmit(
    db: Database,
    node: dict[str, Any],
    inventory: Inventory,
    refusal: str | None,
    spec_version: str | None,
) -> bool:
    """Re-decide a live node's state under its pool's current policy and what its agent has
    applied (H1); True if it changed.

    ``refusal`` is why the pool's policy cannot be rendered for this host, if it cannot.
    """
    if node["state"] == LOST:
        return False
    state, reason = admission(
        {"gpu_model": node["gpu_model"]}, msgspec.json.decode(node["policy"]), inventory
    )
    if state == READY and refusal is not None:
        state, reason = QUARANTINED, refusal
    fields: dict[str, Any] = {}
    if state == READY:
        done = configured(
            spec_version,
            msgspec.json.decode(node["applied"]) if node["applied"] else None,
            node["applied_version"],
            node["state"] == READY,
            bool(node["pending_reboot"]),
        )
        state, reason = done.state, done.reason
        if (done.applied_version, done.pending_reboot) != (
            node["applied_version"],
            bool(node["pending_reboot"]),
        ):
            fields.update(applied_version=done.applied_version, pending_reboot=done.pending_reboot)
    if (state, reason) != (node["state"], node["state_reason"]):
        fields.update(state=state, state_reason=reason)
    if not fields:
        return False
    node_sql.update_node(db, node["id"], {**fields, "updated_at": now()})
    if "state" in fields:
        state_event(db, node, node["owner_tenant_id"], state, reason)
    return True


def state_event(
    db: Database,
    node: Mapping[str, Any],
    owner_tenant_id: str,
    state: str,
    reason: str | None,
) -> None:
    """node.ready, node.configuring or node.quarantined, for the pool's owner."""
    events.append(
        db,
        f"node.{state}",
        pool_id=node["pool_id"],
        data={"nodeId": node["id"], "hostname": node["hostname"], "state": state, "reason": reason},
        audience=[owner_tenant_id],
    )


def served_version(node: dict[str, Any], units: NodeSpecUnits) -> str:
    """The version of the spec as served: its units, and the pool version, model, sharing and
    policy it carries, so a policy update or a gpuModel change moves every node's spec."""
    seed = "\x00".join(
        [
            units.version,
            str(node["pool_version"]),
            node["gpu_model"] or "",
            node["sharing"],
            node["policy"],
        ]
    )
    return hashlib.sha256(seed.encode()).hexdigest()


@dataclass(frozen=True)
class Respecified:
    refusal: str | None  # why the host cannot take the policy (it keeps its last spec)
    held_layout: bool  # a booked GPU kept an older MIG layout (U3): look again next pass
    version: str | None  # the spec version the node is to apply
    gated_gpus: frozenset[str]  # GPUs a drain-gated unit of that spec touches (H4)


def unit_key(unit: Unit) -> str:
    """What a unit asks of the host, without the GPUs it lists (they move with bookings)."""
    return hashlib.sha256(msgspec.json.encode(msgspec.structs.replace(unit, gpus=[]))).hexdigest()


def record_applied(db: Database, node: dict[str, Any]) -> dict[str, str]:
    """H4: which units the agent reports applied (or unchanged), by id, with the key of the
    unit it took. Taken from the spec the report was for (the stored one, before this
    reconcile renders anew: a booking may move the version meanwhile)."""
    done: dict[str, str] = (
        msgspec.json.decode(node["applied_units"]) if node["applied_units"] else {}
    )
    report = msgspec.json.decode(node["applied"]) if node["applied"] else {}
    if report.get("version") != node["spec_version"]:
        return done
    stored = node_sql.spec_of(db, node["id"])
    keys = {unit.id: unit_key(unit) for unit in stored.units} if stored else {}
    took = {
        u["id"]: keys[u["id"]]
        for u in report.get("units", [])
        if u.get("status") in ("applied", "unchanged") and u.get("id") in keys
    }
    if any(done.get(i) != key for i, key in took.items()):
        done = {**done, **took}
        node_sql.update_node(db, node["id"], {"applied_units": msgspec.json.encode(done).decode()})
    return done


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


def respecify(
    db: Database, node: dict[str, Any], policy: Policy, inventory: Inventory
) -> Respecified:
    """Render the node's NodeSpec (N6) and store it when it moved.

    A host that cannot take the policy keeps its last spec and is quarantined with the
    reason; a booked GPU that kept an older MIG layout (U3) makes the node looked at again
    until its GPUs are idle.
    """
    booked = node_sql.booked_gpus(db, node["id"])
    done = record_applied(db, node)
    try:
        units = render(
            policy,
            sharing=node["sharing"],
            gpu_model=node["gpu_model"],
            inventory=inventory,
            booked_gpus=booked,
        )
    except RenderRefused as exc:
        kept = node_sql.spec_of(db, node["id"])
        return Respecified(
            f"this host cannot take the policy: {exc.field}: {exc.message}",
            False,
            node["spec_version"],
            gated_gpus(kept, done) if kept else frozenset(),
        )
    version = served_version(node, units)
    if version != node["spec_version"]:
        node_sql.put_spec(db, node["id"], msgspec.json.encode(units).decode(), version)
    held_layout = bool(booked) and node["sharing"] == "mig" and policy.migLayout is not UNSET
    return Respecified(None, held_layout, version, gated_gpus(units, done))


def reconcile_node(db: Database, node: dict[str, Any]) -> int:
    """Bring one node's rows and atoms to what its inventory and pool imply; returns rows written."""
    policy = parse_policy(msgspec.json.decode(node["policy"]))
    inventory = (
        msgspec.json.decode(node["inventory"], type=Inventory) if node["inventory"] else None
    )
    writes, held, gated = 0, False, frozenset[str]()
    if inventory is not None:
        spec = respecify(db, node, policy, inventory)
        held, gated = spec.held_layout, spec.gated_gpus
        readmit(db, node, inventory, spec.refusal, spec.version)
    facts = HostFacts(**{name: node[name] for name in node_sql.FACTS})
    desired = desired_rows(facts, node["class"], policy)
    existing = node_sql.resource_rows(db, node["id"])
    for resource, row in desired.items():
        have = existing.get(resource)
        capacity = settled(row.capacity, have["allocated"] if have else 0)
        held = held or capacity != row.capacity
        if have is None or have["capacity"] != capacity or have["ratio"] != row.ratio:
            node_sql.put_resource(db, node["id"], resource, capacity, row.ratio)
            writes += 1
    for resource in existing.keys() - desired.keys():
        if node_sql.delete_resource(db, node["id"], resource):
            writes += 1
        else:
            held = True
    replicas = None if policy.replicas is UNSET else policy.replicas
    gpus = inventory.gpus if inventory else []
    wanted = {a.device_id: a for a in gpu_atoms(gpus, node["class"], node["sharing"], replicas)}
    have_devices = node_sql.devices(db, node["id"])
    for device_id, atom in wanted.items():
        have = have_devices.get(device_id)
        if have is not None and (have["resource"], have["profile"]) == (
            atom.resource,
            atom.profile,
        ):
            continue
        if have is not None and not node_sql.delete_device(db, node["id"], device_id):
            held = True  # booked as something else: it changes once the booking ends
            continue
        node_sql.insert_device(
            db, node["id"], device_id, atom.resource, atom.gpu_uuid, atom.profile
        )
        writes += 1
    for device_id in have_devices.keys() - wanted.keys():
        if node_sql.delete_device(db, node["id"], device_id):
            writes += 1
        else:
            held = True
    writes += flag_atoms(db, node["id"], gpus, gated)
    if not held:
        node_sql.mark_rows_current(db, node["id"], node["inventory_rev"], node["pool_version"])
    return writes


def health_events(
    db: Database,
    node: Mapping[str, Any],
    owner_tenant_id: str,
    before: Inventory | None,
    after: Inventory,
) -> None:
    """H5: node.gpuUnhealthy when a GPU stops being healthy (or joins so), node.gpuHealthy
    when it is healthy again; one event per GPU whose verdict moved."""
    was = {gpu.uuid: gpu.health for gpu in before.gpus} if before else {}
    for gpu in after.gpus:
        old = was.get(gpu.uuid, "healthy")
        if (old == "healthy") == (gpu.health == "healthy"):
            continue
        events.append(
            db,
            "node.gpuHealthy" if gpu.health == "healthy" else "node.gpuUnhealthy",
            pool_id=node["pool_id"],
            data={
                "nodeId": node["id"],
                "hostname": node["hostname"],
                "gpu": gpu.uuid,
                "index": gpu.index,
                "health": gpu.health,
                "reasons": gpu.health_reasons,
            },
            audience=[owner_tenant_id],
        )


def flag_atoms(db: Database, node_id: str, gpus: list[Gpu], gated: frozenset[str]) -> int:
    """H5, H4: atoms of a GPU that is not healthy, or held by a drain-gated unit, leave
    placement; live bookings on an unhealthy GPU are flagged. Returns the atoms rewritten."""
    sick = {gpu.uuid for gpu in gpus if gpu.health != "healthy"}
    writes = 0
    for device_id, atom in node_sql.devices(db, node_id).items():
        unhealthy, held = atom["gpu_uuid"] in sick, atom["gpu_uuid"] in gated
        if (bool(atom["unhealthy"]), bool(atom["held"])) != (unhealthy, held):
            node_sql.set_device_flags(db, node_id, device_id, unhealthy, held)
            writes += 1
    if writes:
        res_sql.flag_unhealthy_bookings(db, node_id)
    return writes


def reconcile_isolated(db: Database, node: dict[str, Any]) -> int | Failed:
    """One node's rows in a savepoint (R5); a node that cannot be reconciled is quarantined
    with the reason instead, and the caller's other writes stay."""
    written = isolated(db, "node", node["id"], reconcile_node, db, node)
    if isinstance(written, Failed):
        isolated(db, "node", node["id"], quarantine_unreconcilable, db, node, written.error)
    return written


def reconcile_one(db: Database, node_id: str) -> None:
    """Right after a join or a report: the node's rows, in the caller's transaction, isolated
    as in a pass so a broken pool policy never refuses the report itself (R5)."""
    for node in node_sql.reconcile_row(db, node_id):
        reconcile_isolated(db, node)
