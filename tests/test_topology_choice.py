"""D2, D3 as pure functions: the GPU set, packing, pinned CPUs (controlplane/capacity/topology.py)."""

import itertools

import msgspec
import pytest

from controlplane.capacity import topology as t
from tests.nodes import recorded

HOSTS = ("dgx-h100-01", "dgx-a100-02", "l40s-node-03", "hgx-h200-01")


def of(host: str) -> t.Topology:
    inventory = recorded(host)
    return t.parse(t.topology_text(inventory), inventory.cpu.logical_cpus)


def brute_force(topo: t.Topology, free: list[int], count: int) -> tuple[int, ...]:
    return min(itertools.combinations(sorted(free), count), key=lambda s: (topo.rank(s).key(), s))


@pytest.mark.parametrize("host", HOSTS)
def test_d2_the_chosen_set_is_the_best_ranked_of_every_set(host: str) -> None:
    """D2: for every count and a few partly booked hosts, the choice is the best of all sets
    on (NVLink, worst level, NUMA nodes, lowest indices)."""
    topo = t.parse(t.topology_text(recorded(host)), 0)
    indices = sorted(topo.gpus)
    for booked in ([], indices[:1], indices[1::3], indices[-2:]):
        free = [i for i in indices if i not in booked]
        for count in range(1, len(free) + 1):
            chosen = t.best_gpu_set(topo, free, count, "preferred")
            assert chosen is not None and chosen.indices == brute_force(topo, free, count)


def test_d2_none_is_first_fit_and_strict_needs_nvlink_or_one_numa_node() -> None:
    """D2: none takes the lowest free indices; strict on the PCIe L40S host (two GPUs per NUMA
    node, no NVLink) takes two on one node and no set of three."""
    topo = of("l40s-node-03")
    assert t.best_gpu_set(topo, [1, 2, 3], 2, "none").indices == (1, 2)  # type: ignore[union-attr]
    strict = t.best_gpu_set(topo, [1, 2, 3], 2, "strict")
    assert strict is not None and strict.indices == (2, 3) and strict.numa_nodes == (1,)
    assert t.best_gpu_set(topo, [0, 1, 2, 3], 3, "strict") is None


def test_d2_a_big_host_is_chosen_greedily_in_milliseconds() -> None:
    """D2 on a 64-GPU host (8 NVLink domains of 8, two NUMA nodes): whole NVLink domains for 8,
    one NUMA node for 32, strict an NVLink domain when the first GPU is taken."""
    gpus = [t.GpuFacts(i, f"GPU-{i:02}", i, i // 32) for i in range(64)]
    links = [
        t.LinkFacts(a, b, 4 if a // 32 == b // 32 else 5, a // 8 == b // 8)
        for a, b in itertools.combinations(range(64), 2)
    ]
    facts = t.TopologyFacts(gpus=gpus, links=links, cpus=128)
    topo = t.parse(msgspec.json.encode(facts).decode(), 128)
    eight = t.best_gpu_set(topo, list(range(64)), 8, "preferred")
    assert eight is not None and eight.indices == tuple(range(8)) and eight.nvlink
    half = t.best_gpu_set(topo, list(range(64)), 32, "preferred")
    assert half is not None and half.numa_nodes == (0,)
    strict = t.best_gpu_set(topo, list(range(1, 64)), 8, "strict")
    assert strict is not None and strict.nvlink and len({i // 8 for i in strict.indices}) == 1


def test_d2_mig_instances_and_slots_go_on_as_few_gpus_as_possible() -> None:
    """D2: the GPU with the fewest free atoms that still holds them all; else the fullest."""
    free = {"A": ["a1", "a2", "a3", "a4"], "B": ["b1", "b2"], "C": ["c1"]}
    assert t.pack(free, 2) == ["b1", "b2"]
    assert t.pack(free, 5) == ["a1", "a2", "a3", "a4", "b1"]
    assert t.pack(free, 8) is None


def test_d3_pinned_cpus_are_whole_cores_near_the_gpus_never_reserved_or_taken() -> None:
    """D3: hostReserve keeps the lowest whole cores; pinned CPUs are whole free cores on the
    GPUs' NUMA node first, an odd count ends on one sibling; taken CPUs are never given."""
    topo = of("dgx-h100-01")
    reserved = t.reserved_cpus(topo, 2)
    assert reserved == {0, 112}
    near = topo.numa_cpus[1]
    pinned = t.pin_cpus(topo, 6, reserved | {56}, [1])
    assert pinned is not None and set(pinned) <= set(near) and 56 not in pinned
    cores = [set(core) for core in topo.cores if set(core) & set(pinned)]
    assert all(core <= set(pinned) for core in cores)  # whole cores: 3 of them
    odd = t.pin_cpus(topo, 3, reserved, [0])
    assert odd is not None and len(odd) == 3 and not set(odd) & reserved
    assert len({c % 112 for c in odd}) == 2  # one whole core and one sibling of the next
    assert t.pin_cpus(topo, 300, reserved, [0]) is None
