"""The rows a node's capacity writes: its node_resources rows and GPU atoms made to match
what its inventory and pool imply (capacity/resources.py), and the atoms' flags (H4, H5).

Only rows whose values changed are written (N5). A row or atom still allocated is never
deleted nor shrunk below what is allocated: it is held, and the node is looked at again
at the next pass until the booking ends.
"""

from dataclasses import dataclass

from msgspec import UNSET

from controlplane.capacity.resources import HostFacts, desired_rows, gpu_atoms, settled
from controlplane.storage import nodes as node_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.node_types import DeviceRow, NewAtom, NodePool, NodeRow, ResourceRow
from controlplane.storage.sql import Database
from shared.inventory import Inventory
from shared.policy import Policy


@dataclass(frozen=True)
class Written:
    writes: int  # rows and atoms written
    held: bool  # a row or atom stays as it is while allocated: look again next pass
    free: int = 0  # atoms: how many are placeable and not booked once written


UNCHANGED = Written(0, False)  # rows whose inputs did not move: not read, nothing written


def facts_of(node: NodeRow) -> HostFacts:
    """The inventory facts the node's row stores (N4)."""
    return HostFacts(
        logical_cpus=node.logical_cpus,
        memory_total_bytes=node.memory_total_bytes,
        hugepages_2mi=node.hugepages_2mi,
        hugepages_1gi=node.hugepages_1gi,
        disk_total_bytes=node.disk_total_bytes,
    )


def write_resources(
    db: Database,
    node: NodeRow,
    pool: NodePool,
    policy: Policy,
    existing: dict[str, ResourceRow],
) -> Written:
    """N3–N5: the node's node_resources rows (``existing``: those it has); an allocated row
    never shrinks below what is allocated, nor goes while allocated."""
    desired = desired_rows(facts_of(node), pool.pool_class, policy)
    put: list[tuple[str, int, float]] = []
    writes, held = 0, False
    for resource, row in desired.items():
        have = existing.get(resource)
        capacity = settled(row.capacity, have.allocated if have else 0)
        held = held or capacity != row.capacity
        if have is None or have.capacity != capacity or have.ratio != row.ratio:
            put.append((resource, capacity, row.ratio))
    for resource in existing.keys() - desired.keys():
        if existing[resource].allocated:
            held = True
        else:
            node_sql.delete_resource(db, node.id, resource)
            writes += 1
    if put:
        node_sql.put_resources(db, node.id, put)
    return Written(writes + len(put), held)


def write_atoms(
    db: Database,
    node: NodeRow,
    pool: NodePool,
    policy: Policy,
    inventory: Inventory | None,
    have: dict[str, DeviceRow],
    gated: frozenset[str],
) -> Written:
    """S1, H4, H5: the node's GPU atoms (``have``: those it has). A booked atom stays as it
    is until its booking ends; the atoms of a GPU that is not healthy, or held by a
    drain-gated unit, leave placement, and live bookings on an unhealthy GPU are flagged."""
    replicas = None if policy.replicas is UNSET else policy.replicas
    gpus = inventory.gpus if inventory else []
    sick = {gpu.uuid for gpu in gpus if gpu.health != "healthy"}
    wanted = {a.device_id: a for a in gpu_atoms(gpus, pool.pool_class, pool.sharing, replicas)}
    kept: list[DeviceRow] = []  # the atoms that stay: their flags may move
    gone: list[str] = []  # atoms deleted (before the new ones are written: an id may be both)
    new: list[NewAtom] = []
    writes, held, free = 0, False, 0
    for device_id, atom in wanted.items():
        old = have.get(device_id)
        if old is not None and (old.resource, old.profile) == (atom.resource, atom.profile):
            kept.append(old)
            continue
        if old is not None:
            if old.allocated:
                held = True  # booked as something else: it changes once the booking ends
                kept.append(old)
                continue
            gone.append(device_id)
        # A new atom is not booked: it takes its flags as it is written.
        unhealthy, gated_gpu = atom.gpu_uuid in sick, atom.gpu_uuid in gated
        new.append(
            NewAtom(device_id, atom.resource, atom.gpu_uuid, atom.profile, unhealthy, gated_gpu)
        )
        free += not unhealthy and not gated_gpu
    for device_id in have.keys() - wanted.keys():
        old = have[device_id]
        if old.allocated:
            held = True
            kept.append(old)
        else:
            gone.append(device_id)
            writes += 1
    if gone:
        node_sql.delete_devices(db, node.id, gone)
    if new:
        node_sql.insert_devices(db, node.id, new)
    flags: list[tuple[str, bool, bool]] = []  # (atom, unhealthy, held) of atoms that stay
    for stays in kept:
        unhealthy, gated_gpu = stays.gpu_uuid in sick, stays.gpu_uuid in gated
        if (stays.unhealthy, stays.held) != (unhealthy, gated_gpu):
            flags.append((stays.device_id, unhealthy, gated_gpu))
        free += not stays.allocated and not unhealthy and not gated_gpu
    if flags:
        node_sql.set_device_flags(db, node.id, flags)
        res_sql.flag_unhealthy_bookings(db, node.id)
    return Written(writes + len(new) + len(flags), held, free)
