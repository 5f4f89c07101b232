"""The placer's choice (D2, D3): which node, which GPUs, MIG instances or slots, which CPUs.

Candidates are the pool's schedulable nodes with enough free placeable atoms, the fewest
free first (bin-packing keeps whole hosts free for whole-host requests), a page at a time;
within the first page that holds a fit, the node whose best GPU set ranks best on D2's
(1)-(3) wins, then the fewest free atoms, then the node id. ``placement.topology: none``
is first fit: nodes in id order, GPUs by index. Nothing here writes: ``find`` answers a
``Fit`` that capacity/bookings.py books.
"""

from dataclasses import dataclass

from msgspec import UNSET

from controlplane.capacity import topology as topo_of
from controlplane.storage import reservations as res_sql
from controlplane.storage.sql import Database
from controlplane.storage.types import PoolRow, ReservationRow
from shared import cpulist
from shared.schemas.reservations import (
    PlacedGpu,
    PlacedMig,
    PlacedSlot,
    PlacedTopology,
    Placement,
)

ATOMS = {"exclusive": "gpu", "mig": "gpu.mig", "timeslice": "gpu.slot", "mps": "gpu.slot"}
GPU_RESOURCES = ("gpu", "gpu.mig", "gpu.slot")
PAGE = 32
CHUNK = 4  # candidates weighed at a time: often the first few hold the best rank
GIB = 1 << 30
NO_TOPOLOGY_FIT = "no node fits its topology"


@dataclass(frozen=True)
class Fit:
    """What to book on one node, and what the reservation will say it holds."""

    node_id: str
    atom: str
    atoms: list[str]  # device ids
    pinned: list[int]  # exclusive CPUs
    rows: dict[str, int]
    placement: Placement


def mode_of(pool: PoolRow) -> str:
    policy = pool.model
    if policy is None or policy.placement is UNSET:
        return "preferred"
    return policy.placement.topology


def reserve_of(pool: PoolRow) -> int:
    policy = pool.model
    return 0 if policy is None or policy.hostReserve is UNSET else policy.hostReserve.vcpu


@dataclass(frozen=True)
class Devices:
    """What one node offers the reservation's GPUs (cheap to weigh: no CPU work yet)."""

    atoms: list[str]
    gpus: list[PlacedGpu]
    migs: list[PlacedMig]
    slots: list[PlacedSlot]
    set_rank: tuple[bool, int, int]
    nvlink: bool | None
    worst: str | None
    gpu_numa: tuple[int, ...]


NO_DEVICES = Devices([], [], [], [], (False, 0, 0), None, None, ())


Weighed = tuple[tuple[tuple[bool, int, int], int, str], int, Devices]
BEST_RANK = (False, 0, 1)  # one GPU, or atoms on one NUMA node: no set ranks better


def find(db: Database, row: ReservationRow, pool: PoolRow) -> Fit | str | None:
    """The best fit for the reservation, None when nothing fits yet, or ``NO_TOPOLOGY_FIT``
    when nodes had the room but ``strict`` took none of them.

    Candidates are weighed by their GPUs alone, a few at a time in bin-packing order (the
    choice is remembered per host shape, capacity/topology.py), until one ranks as well as
    the hosts seen can rank at all; only the best-ranked are given their CPUs and memory,
    until one fits."""
    resources = row.resources
    atom = ATOMS[pool.sharing]
    wanted = resources.get(atom, 0)
    rows_asked = {r: a for r, a in resources.items() if r not in GPU_RESOURCES}
    mode = mode_of(pool)
    first_fit = mode == "none"
    missed = [False]  # strict refused a node that had the room
    after_packed: tuple[int, str] = (-1, "")
    after_id = ""
    while True:  # pages of candidates, until one fits or the pool has no more
        if first_fit:
            page = res_sql.first_fit_candidates(db, pool.id, wanted, after_id, PAGE)
        else:
            page = res_sql.packed_candidates(db, pool.id, wanted, after_packed, PAGE)
        if not page:
            return NO_TOPOLOGY_FIT if missed[0] else None
        weighed: list[Weighed] = []
        bound: tuple[bool, int, int] | None = None  # the best rank the hosts seen could give
        for start in range(0, len(page), CHUNK):
            chunk = page[start : start + CHUNK]
            for candidate, devices, best in _weigh(db, chunk, row, mode, atom, wanted, missed):
                weighed.append(
                    (
                        (devices.set_rank, candidate.free_atoms, candidate.node_id),
                        start + chunk.index(candidate),
                        devices,
                    )
                )
                bound = best if bound is None else min(bound, best)
            if weighed and (first_fit or min(w[0][0] for w in weighed) <= (bound or BEST_RANK)):
                fit = _first_complete(db, page, pool, mode, atom, weighed, rows_asked, missed)
                if fit is not None:
                    return fit
        fit = _first_complete(db, page, pool, mode, atom, weighed, rows_asked, missed)
        if fit is not None:
            return fit
        after_packed = (page[-1].free_atoms, page[-1].node_id)
        after_id = page[-1].node_id


def _weigh(
    db: Database,
    chunk: list[res_sql.Candidate],
    row: ReservationRow,
    mode: str,
    atom: str,
    wanted: int,
    missed: list[bool],
) -> list[tuple[res_sql.Candidate, Devices, tuple[bool, int, int]]]:
    """The chunk's candidates with room for the rows asked, each with its devices and the
    best rank its host could give with every GPU free."""
    rows_asked = {r: a for r, a in row.resources.items() if r not in GPU_RESOURCES}
    ids = [c.node_id for c in chunk]
    free = res_sql.free_atoms_of(db, ids, atom, row.mig_profile) if wanted else {}
    room = res_sql.free_rows_of(db, ids) if rows_asked else {}
    found = []
    for candidate in chunk:
        if any(room.get(candidate.node_id, {}).get(r, 0) < a for r, a in rows_asked.items()):
            continue
        if not wanted:
            found.append((candidate, NO_DEVICES, NO_DEVICES.set_rank))
            continue
        topo = topo_of.parse(candidate.topology, candidate.logical_cpus)
        devices = _devices_on(topo, candidate, mode, atom, wanted, row.mig_profile, free)
        if isinstance(devices, str):
            missed[0] = True
        elif devices is not None:
            found.append((candidate, devices, _best_possible(topo, atom, wanted, mode)))
    return found


def _best_possible(
    topo: topo_of.Topology, atom: str, wanted: int, mode: str
) -> tuple[bool, int, int]:
    if atom != "gpu" or wanted < 2:
        return BEST_RANK
    whole = topo_of.best_gpu_set(topo, list(topo.gpus), wanted, mode)
    return whole.rank.key() if whole is not None else BEST_RANK


def _first_complete(
    db: Database,
    page: list[res_sql.Candidate],
    pool: PoolRow,
    mode: str,
    atom: str,
    weighed: list[Weighed],
    rows_asked: dict[str, int],
    missed: list[bool],
) -> Fit | None:
    """The first of the weighed candidates (by rank; by page order for first fit) whose CPUs
    and memory fit; those tried are taken off the list."""
    weighed.sort(key=lambda w: w[1] if mode == "none" else w[0])
    while weighed:
        _, n, devices = weighed.pop(0)
        fit = _complete(db, page[n], pool, mode, atom, devices, rows_asked)
        if isinstance(fit, str):
            missed[0] = True
        elif fit is not None:
            return fit
    return None


def _devices_on(
    topo: topo_of.Topology,
    candidate: res_sql.Candidate,
    mode: str,
    atom: str,
    wanted: int,
    profile: str | None,
    free: dict[str, list[tuple[str, str]]],
) -> Devices | str | None:
    """The node's best GPU set (D2), or its MIG instances or slots packed; None when they do
    not fit, ``NO_TOPOLOGY_FIT`` when only ``strict`` refused them."""
    node_free = free.get(candidate.node_id, [])
    if atom == "gpu":
        known = topo.by_uuid
        by_index = {
            known[uuid].index if uuid in known else n: uuid for n, (_, uuid) in enumerate(node_free)
        }
        choice = topo_of.best_gpu_set(topo, list(by_index), wanted, mode)
        if choice is None:
            return NO_TOPOLOGY_FIT if mode == "strict" and len(by_index) >= wanted else None
        return Devices(
            atoms=[by_index[i] for i in choice.indices],
            gpus=[_placed_gpu(topo, i, by_index[i]) for i in choice.indices],
            migs=[],
            slots=[],
            set_rank=choice.rank.key(),
            nvlink=choice.nvlink,
            worst=choice.worst_level,
            gpu_numa=choice.numa_nodes,
        )
    by_gpu: dict[str, list[str]] = {}
    for device_id, uuid in node_free:
        by_gpu.setdefault(uuid, []).append(device_id)
    atoms = topo_of.pack(by_gpu, wanted)
    if atoms is None:
        return None
    gpu_of = {device_id: uuid for device_id, uuid in node_free}
    used = {gpu_of[a] for a in atoms}
    gpu_numa = tuple(sorted({n for u in used if (n := _numa(topo, u)) is not None}))
    migs = [
        PlacedMig(uuid=a, profile=profile or "", gpu_index=_index(topo, gpu_of[a]))
        for a in atoms
        if atom == "gpu.mig"
    ]
    slots = [
        PlacedSlot(gpu_index=_index(topo, gpu_of[a]), slot=int(a.rsplit("::", 1)[1]))
        for a in atoms
        if atom == "gpu.slot"
    ]
    return Devices(atoms, [], migs, slots, (False, 0, max(1, len(gpu_numa))), None, None, gpu_numa)


def _complete(
    db: Database,
    candidate: res_sql.Candidate,
    pool: PoolRow,
    mode: str,
    atom: str,
    devices: Devices,
    rows_asked: dict[str, int],
) -> Fit | str | None:
    """The booking on this node with its CPUs and memory (D3), None when they do not fit,
    ``NO_TOPOLOGY_FIT`` when only ``strict`` refused them."""
    topo = topo_of.parse(candidate.topology, candidate.logical_cpus)
    strict = mode == "strict"
    gpu_numa = devices.gpu_numa
    pinned: list[int] = []
    cpus: str | None = None
    quota: int | None = None
    vcpu = rows_asked.get("vcpu", 0)
    if vcpu:
        reserved = topo_of.reserved_cpus(topo, reserve_of(pool))
        unavailable = res_sql.pinned_cpus(db, candidate.node_id) | reserved
        if res_sql.row_ratio(db, candidate.node_id, "vcpu") == 1.0:
            found = topo_of.pin_cpus(topo, vcpu, unavailable, gpu_numa, only_near=strict)
            if found is None:
                return NO_TOPOLOGY_FIT if strict and gpu_numa else None
            pinned, cpus = found, cpulist.format(found)
        else:
            # A share runs beside pinned bookings (the ratio may have moved), not on their CPUs.
            quota = vcpu * 100
            cpus = cpulist.format(topo_of.affine_cpus(topo, gpu_numa, unavailable))
    memory = rows_asked.get("memoryGiB")
    memory_nodes = cpulist.format(topo.numa_of_cpus(pinned)) if pinned and topo.cpu_numa else None
    numa = gpu_numa or (topo.numa_of_cpus(pinned) if pinned else ())
    placement = Placement(
        node_id=candidate.node_id,
        hostname=candidate.hostname,
        gpus=devices.gpus,
        mig_instances=devices.migs,
        slots=devices.slots,
        cpus=cpus,
        cpu_quota=quota,
        memory_bytes=memory * GIB if memory else None,
        memory_nodes=memory_nodes,
        topology=PlacedTopology(
            nvlink=devices.nvlink, worst_level=devices.worst, numa_nodes=list(numa)
        ),
    )
    return Fit(
        node_id=candidate.node_id,
        atom=atom,
        atoms=devices.atoms,
        pinned=pinned,
        rows=rows_asked,
        placement=placement,
    )


def _placed_gpu(topo: topo_of.Topology, index: int, uuid: str) -> PlacedGpu:
    facts = topo.by_uuid.get(uuid)
    return PlacedGpu(
        index=index,
        uuid=uuid,
        minor_number=facts.minor if facts else None,
        numa_node=facts.numa if facts else None,
    )


def _index(topo: topo_of.Topology, uuid: str) -> int:
    facts = topo.by_uuid.get(uuid)
    return facts.index if facts else -1


def _numa(topo: topo_of.Topology, uuid: str) -> int | None:
    facts = topo.by_uuid.get(uuid)
    return facts.numa if facts else None
