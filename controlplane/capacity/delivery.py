"""What a node's NodeSpec carries of its bookings (D5), and the version that covers them.

The node's ``bookings`` column is its live and releasing reservations as the agent
delivers them (devices in placement order, pinned or affine CPUs, memory); every change of
them (a placement, an end, a confirmed release) rewrites it in the same transaction and
moves the node's ``spec_version``, so the agent's next report learns of it.
"""

import hashlib

import msgspec

from controlplane.capacity import topology as topo_of
from controlplane.storage import nodes as node_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.node_types import NodePool, NodeRow
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


def booking_of(row: ReservationRow, topology: topo_of.Topology) -> Booking | None:
    """The NodeSpec's booking for a live or releasing reservation (None before placement)."""
    placed = row.placement
    if placed is None:
        return None
    gpus = [g.uuid for g in placed.gpus]
    for slot in placed.slots:  # a slot runs on its whole GPU device, shared in time
        uuid = topology.gpus[slot.gpu_index].uuid if slot.gpu_index in topology.gpus else None
        if uuid is not None and uuid not in gpus:
            gpus.append(uuid)
    return Booking(
        reservation_id=row.id,
        gpus=gpus,
        mig_instances=[m.uuid for m in placed.mig_instances],
        cpus=placed.cpus or "",
        cpu_quota=placed.cpu_quota,
        memory_bytes=placed.memory_bytes,
        memory_nodes=placed.memory_nodes or "",
        state="live" if row.state in res_sql.LIVE else "release",
    )


def refresh_bookings(db: Database, node_id: str) -> None:
    """Rewrite the node's ``bookings`` and its spec version when its bookings moved."""
    node = node_sql.get_node(db, node_id)
    if node is None or node.removed_at is not None:
        return
    topology = topo_of.parse(node.topology_json, node.logical_cpus)
    bookings = [
        booking
        for row in res_sql.held_on_node(db, node_id)
        if (booking := booking_of(row, topology)) is not None
    ]
    text = msgspec.json.encode(bookings).decode() if bookings else None
    if text == node.bookings_json:
        return
    fields: dict[str, str | None] = {"bookings": text}
    version = spec_version_with(db, node, text)
    if version is not None:
        fields["spec_version"] = version
    node_sql.update_node(db, node_id, fields)


def spec_version_with(db: Database, node: NodeRow, bookings_json: str | None) -> str | None:
    """The node's spec version once its bookings are ``bookings_json`` (None: no spec yet)."""
    units = node.spec
    pool = node_sql.pool_of_node(db, node.pool_id)
    if units is None or pool is None:
        return None
    return served_version(pool, units, bookings_json)
