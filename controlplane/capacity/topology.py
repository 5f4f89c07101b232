"""Where a booking sits on its host (D2, D3): pure functions over a node's topology.

A node's ``topology`` column (written with its inventory) is the compact form of what
the placer needs: each GPU's index, UUID, minor number and NUMA node; every pair's PCIe
level and NVLink; the NUMA nodes' CPUs; the physical cores (thread siblings). From it:

- ``best_gpu_set``: among free GPUs, the set that is (1) all pairwise NVLink-joined if such
  a set exists, then (2) has the best worst-pair level, then (3) spans the fewest NUMA nodes,
  then (4) has the lowest indices. ``strict`` takes only a set all NVLink-joined or on one
  NUMA node; ``none`` is first fit by index.
- ``pack``: MIG instances and slots of one booking on as few GPUs as possible.
- ``pin_cpus``: exclusive whole cores, from the GPUs' NUMA nodes first, never a taken or
  host-reserved CPU (``reserved_cpus``: the lowest-numbered whole cores).
"""

import functools
import itertools
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field

import msgspec

from shared import cpulist
from shared.inventory import Inventory

LEVELS = ("internal", "single", "multiple", "hostbridge", "node", "system")
Mode = str  # "preferred" | "strict" | "none"
# Beyond this many candidate sets the choice grows a set greedily instead of trying all.
EXHAUSTIVE = 4096


class GpuFacts(msgspec.Struct, array_like=True, frozen=True):
    index: int
    uuid: str
    minor: int | None
    numa: int | None


class LinkFacts(msgspec.Struct, array_like=True, frozen=True):
    a: int
    b: int
    level: int  # an index of LEVELS
    nvlink: bool


class NumaFacts(msgspec.Struct, array_like=True, frozen=True):
    id: int
    cpus: str


class TopologyFacts(msgspec.Struct, frozen=True, omit_defaults=True):
    """The stored form (the ``topology`` column)."""

    gpus: list[GpuFacts] = []
    links: list[LinkFacts] = []
    numa: list[NumaFacts] = []
    cores: list[str] = []
    cpus: int = 0


def topology_text(inventory: Inventory) -> str:
    """The ``topology`` column of a node with this inventory (deterministic)."""
    facts = TopologyFacts(
        gpus=[GpuFacts(g.index, g.uuid, g.minor_number, g.numa_node) for g in inventory.gpus],
        links=[
            LinkFacts(link.a, link.b, LEVELS.index(link.level), link.nvlink)
            for link in inventory.gpu_links
        ],
        numa=[NumaFacts(n.id, n.cpus) for n in inventory.cpu.numa_nodes],
        cores=list(inventory.cpu.thread_siblings),
        cpus=inventory.cpu.logical_cpus,
    )
    return msgspec.json.encode(facts).decode()


@dataclass(frozen=True)
class SetRank:
    """How good a GPU set is (D2 (1)-(3)): lower is better."""

    not_nvlink: bool
    worst_level: int
    numa_nodes: int

    def key(self) -> tuple[bool, int, int]:
        return (self.not_nvlink, self.worst_level, self.numa_nodes)


@dataclass(frozen=True)
class GpuChoice:
    indices: tuple[int, ...]
    rank: SetRank
    nvlink: bool | None  # None for fewer than two GPUs
    worst_level: str | None
    numa_nodes: tuple[int, ...]


@dataclass
class Topology:
    """A node's parsed topology, with the sets it has ranked remembered (nodes of one
    model ask the same questions again and again)."""

    gpus: dict[int, GpuFacts]
    by_uuid: dict[str, GpuFacts]
    links: dict[tuple[int, int], LinkFacts]
    numa_cpus: dict[int, tuple[int, ...]]
    cpu_numa: dict[int, int]
    cores: tuple[tuple[int, ...], ...]
    cpus: tuple[int, ...]
    _chosen: dict[tuple[frozenset[int], int, str], GpuChoice | None] = field(default_factory=dict)

    def link(self, a: int, b: int) -> LinkFacts | None:
        return self.links.get((a, b) if a < b else (b, a))

    def rank(self, indices: Sequence[int]) -> SetRank:
        worst, nvlink = 0, True
        for a, b in itertools.combinations(indices, 2):
            found = self.link(a, b)
            # A pair the host gave no facts for counts as the farthest, without NVLink.
            worst = max(worst, found.level if found else len(LEVELS) - 1)
            nvlink = nvlink and bool(found and found.nvlink)
        numa = {self.gpus[i].numa for i in indices if self.gpus[i].numa is not None}
        # A GPU whose NUMA node is unknown counts as one more node: never "on one node".
        unknown = sum(1 for i in indices if self.gpus[i].numa is None)
        return SetRank(not nvlink, worst, max(1, len(numa) + unknown))

    def choice(self, indices: Sequence[int]) -> GpuChoice:
        ordered = tuple(sorted(indices))
        rank = self.rank(ordered)
        pairs = len(ordered) > 1
        return GpuChoice(
            ordered,
            rank,
            (not rank.not_nvlink) if pairs else None,
            LEVELS[rank.worst_level] if pairs else None,
            tuple(sorted({n for i in ordered if (n := self.gpus[i].numa) is not None})),
        )

    def numa_of_cpus(self, cpus: Iterable[int]) -> tuple[int, ...]:
        return tuple(sorted({self.cpu_numa[c] for c in cpus if c in self.cpu_numa}))


@functools.lru_cache(maxsize=16384)
def parse(text: str | None, logical_cpus: int = 0) -> Topology:
    """The node's topology from its column; a host without the facts (an older agent) has
    its GPUs unranked and each CPU its own core on no known NUMA node."""
    try:
        facts = msgspec.json.decode(text, type=TopologyFacts) if text else TopologyFacts()
        numa_cpus = {n.id: tuple(cpulist.parse(n.cpus)) for n in facts.numa}
        cores = tuple(tuple(cpulist.parse(c)) for c in facts.cores)
    except (msgspec.DecodeError, msgspec.ValidationError, ValueError):
        # Facts that do not read (a range written backwards): the host's as if it gave none.
        facts, numa_cpus, cores = TopologyFacts(), {}, ()
    count = facts.cpus or logical_cpus
    cores = cores or tuple((c,) for c in range(count))
    return Topology(
        gpus={g.index: g for g in facts.gpus},
        by_uuid={g.uuid: g for g in facts.gpus},
        links={(min(x.a, x.b), max(x.a, x.b)): x for x in facts.links},
        numa_cpus=numa_cpus,
        cpu_numa={c: node for node, cpus in numa_cpus.items() for c in cpus},
        cores=cores,
        cpus=tuple(sorted(c for core in cores for c in core)),
    )


def strict_fits(rank: SetRank, count: int) -> bool:
    """D2 strict: every pair NVLink-joined, or every GPU on one NUMA node."""
    return count < 2 or not rank.not_nvlink or rank.numa_nodes == 1


def best_gpu_set(topo: Topology, free: Collection[int], count: int, mode: Mode) -> GpuChoice | None:
    """D2: the best set of ``count`` of the ``free`` GPU indices, or None (too few free, or
    none that ``strict`` takes)."""
    free_set = frozenset(free)
    key = (free_set, count, mode)
    if key in topo._chosen:
        return topo._chosen[key]
    chosen = _choose(topo, sorted(free_set), count, mode)
    topo._chosen[key] = chosen
    return chosen


def _choose(topo: Topology, free: list[int], count: int, mode: Mode) -> GpuChoice | None:
    if count <= 0 or len(free) < count:
        return None
    known = [i for i in free if i in topo.gpus]
    if len(known) < len(free):  # a host without the facts: first fit, and strict takes none
        return None if mode == "strict" and count > 1 else _unranked(free[:count])
    if mode == "none":
        return topo.choice(free[:count])
    if math.comb(len(free), count) <= EXHAUSTIVE:
        candidates: Iterable[Sequence[int]] = itertools.combinations(free, count)
    else:
        candidates = _grown(topo, free, count)
    best: tuple[tuple[bool, int, int], tuple[int, ...]] | None = None
    for indices in candidates:
        rank = topo.rank(indices)
        if mode == "strict" and not strict_fits(rank, count):
            continue
        candidate = (rank.key(), tuple(indices))
        if best is None or candidate < best:
            best = candidate
    return None if best is None else topo.choice(best[1])


def _grown(topo: Topology, free: list[int], count: int) -> Iterable[list[int]]:
    """Sets grown greedily from a seed on each NUMA node (its lowest free GPU): the next GPU
    is the one that keeps the set's rank best, then the lowest index. The rank grows with the
    set (the worst level and NVLink of the pairs the new GPU makes), so a 64-GPU host costs
    milliseconds, not seconds: enough for hosts too big to try every set."""
    for seed in sorted({topo.gpus[i].numa: i for i in reversed(free)}.values()):
        grown = _Grown([seed], {topo.gpus[seed].numa}, 0, True)
        rest = [i for i in free if i != seed]
        while len(grown.chosen) < count:
            pick = min(rest, key=lambda i: (grown.rank_with(topo, i), i))
            grown.add(topo, pick)
            rest.remove(pick)
        yield grown.chosen


@dataclass
class _Grown:
    """A set being grown, with the rank of its pairs so far."""

    chosen: list[int]
    numa: set[int | None]
    worst: int
    nvlink: bool

    def _with(self, topo: Topology, i: int) -> tuple[int, bool]:
        links = [topo.link(i, c) for c in self.chosen]
        level = max([self.worst, *(x.level if x else len(LEVELS) - 1 for x in links)])
        return level, self.nvlink and all(x is not None and x.nvlink for x in links)

    def rank_with(self, topo: Topology, i: int) -> tuple[bool, int, int]:
        level, joined = self._with(topo, i)
        return (not joined, level, len(self.numa | {topo.gpus[i].numa}))

    def add(self, topo: Topology, i: int) -> None:
        self.worst, self.nvlink = self._with(topo, i)
        self.chosen.append(i)
        self.numa.add(topo.gpus[i].numa)


def _unranked(indices: Sequence[int]) -> GpuChoice:
    """A set on a host that gave no topology facts for some of its GPUs: ranked as the worst."""
    pairs = len(indices) > 1
    return GpuChoice(
        tuple(indices),
        SetRank(pairs, len(LEVELS) - 1 if pairs else 0, len(indices)),
        None if not pairs else False,
        None if not pairs else LEVELS[-1],
        (),
    )


def pack(free_by_gpu: dict[str, list[str]], count: int) -> list[str] | None:
    """D2: ``count`` atoms (MIG instances or slots, by device id) on as few GPUs as possible:
    the GPU with the fewest free that still holds them all, else the fullest ones first.
    ``free_by_gpu`` maps each GPU UUID to its free atoms in device order."""
    if sum(len(atoms) for atoms in free_by_gpu.values()) < count:
        return None
    fits = [(len(atoms), gpu) for gpu, atoms in free_by_gpu.items() if len(atoms) >= count]
    if fits:
        return free_by_gpu[min(fits)[1]][:count]
    chosen: list[str] = []
    for _, gpu in sorted(((-len(a), g) for g, a in free_by_gpu.items())):
        chosen += free_by_gpu[gpu][: count - len(chosen)]
        if len(chosen) == count:
            break
    return chosen


def reserved_cpus(topo: Topology, reserve: int) -> frozenset[int]:
    """D3: ``hostReserve.vcpu`` keeps the lowest-numbered whole cores for the host (2 on a
    hyperthreaded host keeps CPU 0 and its sibling)."""
    kept: set[int] = set()
    for core in sorted(topo.cores, key=min):
        if len(kept) >= reserve:
            break
        kept.update(core)
    return frozenset(kept)


def pin_cpus(
    topo: Topology,
    count: int,
    unavailable: Collection[int],
    near: Collection[int],
    only_near: bool = False,
) -> list[int] | None:
    """D3: ``count`` exclusive CPUs: whole free cores first, those on the ``near`` NUMA nodes
    first, then single free CPUs in the same order; never one in ``unavailable`` (taken by
    another booking, or the host's). ``only_near`` (strict topology) takes nothing elsewhere.
    None when they are not there."""
    near_set = set(near)

    def far(cpu: int) -> bool:
        return bool(near_set) and topo.cpu_numa.get(cpu) not in near_set

    cores = sorted(topo.cores, key=lambda core: (far(min(core)), min(core)))
    if only_near and near_set:
        cores = [core for core in cores if not far(min(core))]
    chosen: list[int] = []
    whole = [core for core in cores if not any(c in unavailable for c in core)]
    for core in whole:
        if len(chosen) + len(core) > count:
            continue
        chosen += core
        if len(chosen) == count:
            return sorted(chosen)
    for core in cores:
        for cpu in core:
            if cpu not in unavailable and cpu not in chosen:
                chosen.append(cpu)
                if len(chosen) == count:
                    return sorted(chosen)
    return None


def affine_cpus(
    topo: Topology, numa_nodes: Collection[int], unavailable: Collection[int]
) -> list[int]:
    """D3 shared vCPUs: the CPUs of the GPUs' NUMA nodes (every CPU when none is known),
    outside the host's reserved cores and pinned CPUs: where the share runs, not held."""
    pool = [c for n in numa_nodes for c in topo.numa_cpus.get(n, ())] or list(topo.cpus)
    return sorted(set(pool) - set(unavailable))
