"""What a node's NodeSpec carries of its bookings (D5), and the version that covers them.

The node's ``bookings`` column is its live and releasing reservations as the agent
delivers them (devices in placement order, pinned or affine CPUs, memory); every change of
them (a placement, an end, a confirmed release) rewrites it in the same transaction and
moves the node's ``spec_version``, so the agent's next report learns of it.
"""

import hashlib
from typing import Any

import msgspec

from controlplane.storage import nodes as node_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.node_types import DeviceRow, NodePool, NodeRow
from controlplane.storage.sql import Database
from controlplane.storage.types import ReservationRow
from shared.nodespec import Booking, NodeSpecUnits


def served_version(pool: NodePool, units: NodeSpecUnits, bookings_json: str | None) -> str:
    """The version of the spec as served: its units, and the pool version, model, sharing and
    policy (as stored) it carries, so a policy update or a gpuModel change moves every
    node's spec; and its bookings (D5), when it has any."""
    parts = [units.version, str(pool.version), pool.gpu_model or "", pool.sharing, pool.policy_json]
    if bookings_json and bookings_json != "[]":
        parts.append(bookings_json)
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()


def booking_of(row: ReservationRow, atoms: list[DeviceRow]) -> Booking:
    """The NodeSpec's booking for a live or releasing reservation: its devices from the atoms
    it holds (authoritative: a slot names its GPU by UUID, whatever the GPU's index is now),
    in placement order; its CPUs and memory from its placement (none for a booking placed
    before the placer recorded them)."""
    placed = row.placement
    order = {g.uuid: n for n, g in enumerate(placed.gpus)} if placed else {}
    order.update({m.uuid: n for n, m in enumerate(placed.mig_instances)} if placed else {})
    ranked = sorted(atoms, key=lambda a: (order.get(a.device_id, len(order)), a.device_id))
    gpus: list[str] = []
    for atom in ranked:  # a whole GPU, or the GPU a slot runs on (shared in time)
        if atom.resource in ("gpu", "gpu.slot") and atom.gpu_uuid not in gpus:
            gpus.append(atom.gpu_uuid)
    return Booking(
        reservation_id=row.id,
        gpus=gpus,
        mig_instances=[a.device_id for a in ranked if a.resource == "gpu.mig"],
        cpus=(placed.cpus or "") if placed else "",
        cpu_quota=placed.cpu_quota if placed else None,
        memory_bytes=placed.memory_bytes if placed else None,
        memory_nodes=(placed.memory_nodes or "") if placed else "",
        state="live" if row.state in res_sql.LIVE else "release",
    )


def refresh_bookings(db: Database, node_id: str, node: NodeRow | None = None) -> dict[str, Any]:
    """Rewrite the node's ``bookings`` and its spec version when its bookings moved; the
    columns written (none when nothing moved)."""
    node = node or node_sql.get_node(db, node_id)
    if node is None or node.removed_at is not None:
        return {}
    held: dict[str, list[DeviceRow]] = {}
    for atom in node_sql.devices(db, node_id).values():
        if atom.reservation_id is not None:
            held.setdefault(atom.reservation_id, []).append(atom)
    bookings = [booking_of(row, held.get(row.id, [])) for row in res_sql.held_on_node(db, node_id)]
    text = msgspec.json.encode(bookings).decode() if bookings else None
    if text == node.bookings_json:
        return {}
    fields: dict[str, Any] = {"bookings": text}
    version = spec_version_with(db, node, text)
    if version is not None:
        fields["spec_version"] = version
    node_sql.update_node(db, node_id, fields)
    return fields


def spec_version_with(db: Database, node: NodeRow, bookings_json: str | None) -> str | None:
    """The node's spec version once its bookings are ``bookings_json`` (None: no spec yet)."""
    units = node.spec
    pool = node_sql.pool_of_node(db, node.pool_id)
    if units is None or pool is None:
        return None
    return served_version(pool, units, bookings_json)
