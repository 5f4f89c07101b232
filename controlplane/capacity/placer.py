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
    rank: tuple[tuple[bool, int, int], int, str]


def mode_of(pool: PoolRow) -> str:
    policy = pool.model
    if policy is None or policy.placement is UNSET:
        return "preferred"
    return policy.placement.topology


def reserve_of(pool: PoolRow) -> int:
    policy = pool.model
    return 0 if policy is None or policy.hostReserve is UNSET else policy.hostReserve.vcpu


def find(db: Database, row: ReservationRow, pool: PoolRow) -> Fit | str | None:
    """The best fit for the reservation, None when nothing fits yet, or ``NO_TOPOLOGY_FIT``
    when nodes had the room but ``strict`` took none of them."""
    resources = row.resources
    atom = ATOMS[pool.sharing]
    wanted = resources.get(atom, 0)
    rows_asked = {r: a for r, a in resources.items() if r not in GPU_RESOURCES}
    mode = mode_of(pool)
    first_fit = mode == "none"
    topology_missed = False
    after_packed: tuple[int, str] = (-1, "")
    after_id = ""
    while True:  # pages of candidates, until one fits or the pool has no more
        if first_fit:
            page = res_sql.first_fit_candidates(db, pool.id, wanted, after_id, PAGE)
        else:
            page = res_sql.packed_candidates(db, pool.id, wanted, after_packed, PAGE)
        if not page:
            return NO_TOPOLOGY_FIT if topology_missed else None
        ids = [c.node_id for c in page]
        free = res_sql.free_atoms_of(db, ids, atom, row.mig_profile) if wanted else {}
        room = res_sql.free_rows_of(db, ids) if rows_asked else {}
        best: Fit | None = None
        for candidate in page:
            if any(room.get(candidate.node_id, {}).get(r, 0) < a for r, a in rows_asked.items()):
                continue
            fit = _fit_on(
                db, candidate, pool, mode, atom, wanted, row.mig_profile, free, rows_asked
            )
            if isinstance(fit, str):
                topology_missed = True
                continue
            if fit is None:
                continue
            if first_fit:
                return fit
            if best is None or fit.rank < best.rank:
                best = fit
        if best is not None:
            return best
        after_packed = (page[-1].free_atoms, page[-1].node_id)
        after_id = page[-1].node_id


def _fit_on(
    db: Database,
    candidate: res_sql.Candidate,
    pool: PoolRow,
    mode: str,
    atom: str,
    wanted: int,
    profile: str | None,
    free: dict[str, list[tuple[str, str]]],
    rows_asked: dict[str, int],
) -> Fit | str | None:
    """The booking on this node, None when it does not fit, ``NO_TOPOLOGY_FIT`` when only
    ``strict`` refused it."""
    topo = topo_of.parse(candidate.topology, candidate.logical_cpus)
    strict = mode == "strict"
    atoms: list[str] = []
    gpus: list[PlacedGpu] = []
    migs: list[PlacedMig] = []
    slots: list[PlacedSlot] = []
    set_rank = (False, 0, 0)
    nvlink: bool | None = None
    worst: str | None = None
    gpu_numa: tuple[int, ...] = ()
    if wanted:
        node_free = free.get(candidate.node_id, [])
        if atom == "gpu":
            index_of = {uuid: g.index for uuid, g in topo.by_uuid.items() if g.index is not None}
            by_index = {index_of.get(uuid, n): uuid for n, (_, uuid) in enumerate(node_free)}
            choice = topo_of.best_gpu_set(topo, list(by_index), wanted, mode)
            if choice is None:
                return NO_TOPOLOGY_FIT if strict and len(by_index) >= wanted else None
            atoms = [by_index[i] for i in choice.indices]
            gpus = [_placed_gpu(topo, i, by_index[i]) for i in choice.indices]
            set_rank, nvlink, worst = choice.rank.key(), choice.nvlink, choice.worst_level
            gpu_numa = choice.numa_nodes
        else:
            by_gpu: dict[str, list[str]] = {}
            for device_id, uuid in node_free:
                by_gpu.setdefault(uuid, []).append(device_id)
            packed = topo_of.pack(by_gpu, wanted)
            if packed is None:
                return None
            atoms = packed
            gpu_of = {device_id: uuid for device_id, uuid in node_free}
            used = sorted({gpu_of[a] for a in atoms}, key=lambda u: _index(topo, u))
            gpu_numa = tuple(sorted({n for u in used if (n := _numa(topo, u)) is not None}))
            if atom == "gpu.mig":
                migs = [
                    PlacedMig(uuid=a, profile=profile or "", gpu_index=_index(topo, gpu_of[a]))
                    for a in atoms
                ]
            else:
                slots = [
                    PlacedSlot(gpu_index=_index(topo, gpu_of[a]), slot=int(a.rsplit("::", 1)[1]))
                    for a in atoms
                ]
            set_rank = (False, 0, max(1, len(gpu_numa)))
    pinned: list[int] = []
    cpus: str | None = None
    quota: int | None = None
    vcpu = rows_asked.get("vcpu", 0)
    reserved = topo_of.reserved_cpus(topo, reserve_of(pool))
    if vcpu:
        ratio = res_sql.row_ratio(db, candidate.node_id, "vcpu")
        if ratio == 1.0:
            unavailable = res_sql.pinned_cpus(db, candidate.node_id) | reserved
            found = topo_of.pin_cpus(topo, vcpu, unavailable, gpu_numa, only_near=strict)
            if found is None:
                return NO_TOPOLOGY_FIT if strict and gpu_numa else None
            pinned, cpus = found, cpulist.format(found)
        else:
            quota = vcpu * 100
            # A share runs beside pinned bookings (the ratio may have moved), not on their CPUs.
            taken = res_sql.pinned_cpus(db, candidate.node_id) | reserved
            cpus = cpulist.format(topo_of.affine_cpus(topo, gpu_numa, taken))
    memory = rows_asked.get("memoryGiB")
    memory_nodes = cpulist.format(topo.numa_of_cpus(pinned)) if pinned and topo.cpu_numa else None
    numa = gpu_numa or (topo.numa_of_cpus(pinned) if pinned else ())
    placement = Placement(
        node_id=candidate.node_id,
        hostname=candidate.hostname,
        gpus=gpus,
        mig_instances=migs,
        slots=slots,
        cpus=cpus,
        cpu_quota=quota,
        memory_bytes=memory * GIB if memory else None,
        memory_nodes=memory_nodes,
        topology=PlacedTopology(nvlink=nvlink, worst_level=worst, numa_nodes=list(numa)),
    )
    return Fit(
        node_id=candidate.node_id,
        atom=atom,
        atoms=atoms,
        pinned=pinned,
        rows=rows_asked,
        placement=placement,
        rank=(set_rank, candidate.free_atoms, candidate.node_id),
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
