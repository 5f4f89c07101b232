"""D1 (DESIGN §12): topology in the agent's inventory, and the compute processes NVML lists.

Expected values are computed from the recorded hosts (agent/fixtures/host-fixtures.json),
served through the fake NVML with pynvml's own return types; sysfs facts come from a
temporary tree.
"""

import ctypes
import json
import logging
import math
from collections.abc import Iterator, MutableMapping
from pathlib import Path
from typing import Any

import msgspec
import pynvml  # type: ignore[import-untyped]
import pytest
import structlog

from agent.inventory import InventoryCollector, collect_inventory, compute_processes, inventory_from
from agent.inventory.fixture import FakeNvml
from agent.inventory.host import cpu, numa_nodes, thread_siblings
from agent.inventory.nvml.session import NvmlSession
from agent.inventory.recording import host_facts, load_host
from shared import cpulist
from shared.inventory import Inventory, NumaNode

FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
RAW = json.loads(FIXTURES.read_text())
HOSTS = {h["id"]: h for h in RAW["hosts"]}
HOST_IDS = list(HOSTS)
# NVML_TOPOLOGY_<NAME> → the inventory's level, from the real module's constants.
LEVELS = {
    getattr(pynvml, f"NVML_TOPOLOGY_{name.upper()}"): name
    for name in ("internal", "single", "multiple", "hostbridge", "node", "system")
}


def is_lost(gpu: dict[str, Any]) -> bool:
    """Whether the recording says no call reaches this GPU."""
    return bool((gpu.get("health") or {}).get("lost"))


# Every GPU a call reaches, of every recorded host.
RECORDED_GPUS = [
    (host_id, gpu["index"])
    for host_id, host in HOSTS.items()
    for gpu in host["gpus"]
    if not is_lost(gpu)
]


def raw_host(host_id: str) -> dict[str, Any]:
    """A fresh, mutable copy of one recorded host."""
    copy: dict[str, Any] = json.loads(json.dumps(HOSTS[host_id]))
    return copy


def inventory(host: dict[str, Any] | str, sysfs_root: Path | None = None, **fake: Any) -> Inventory:
    """A recorded host's inventory (by id or as an edited object) through the fake NVML."""
    loaded = load_host(FIXTURES, host) if isinstance(host, str) else load_host(host)
    return inventory_from(FakeNvml(loaded, **fake), host_facts(loaded), sysfs_root)


def write(path: Path, text: str) -> None:
    """Write one file of a fake root, making its directories."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def expected_processes(host: dict[str, Any]) -> dict[str, list[int]]:
    """The UUID → sorted pids map a recorded host's NVML lists (a lost GPU: left out, as one
    NVML cannot say anything of)."""
    found: dict[str, list[int]] = {}
    for gpu in host["gpus"]:
        if is_lost(gpu):
            continue
        found[gpu["uuid"]] = sorted({p["pid"] for p in gpu["compute_processes"]})
        for mig in gpu["mig"].get("instances", []):
            found[mig["uuid"]] = sorted({p["pid"] for p in mig.get("compute_processes", [])})
    return found


@pytest.fixture
def debug_logs() -> Iterator[list[MutableMapping[str, Any]]]:
    """Every log line, debug included, whatever level an earlier test configured."""
    kept = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG))
    try:
        with structlog.testing.capture_logs() as logs:
            yield logs
    finally:
        structlog.configure(**kept)


# --- the recorded hosts through the fake NVML ----------------------------------------


@pytest.mark.parametrize("host_id", HOST_IDS)
def test_recorded_gpus_report_where_they_sit(host_id: str) -> None:
    """D1: each GPU reports the recording's minor number, NUMA node and CPU affinity."""
    inv = collect_inventory(FIXTURES, host_id)
    for gpu, want in zip(inv.gpus, HOSTS[host_id]["gpus"], strict=True):
        if is_lost(want):  # never reached: nothing is known of where it sits
            assert (gpu.minor_number, gpu.numa_node, gpu.cpu_affinity) == (None, None, None)
            continue
        assert gpu.minor_number == want["minor_number"]
        assert gpu.numa_node == want["numa_node"]
        assert gpu.cpu_affinity == want["cpu_affinity"]


@pytest.mark.parametrize("host_id", HOST_IDS)
def test_recorded_gpu_links(host_id: str) -> None:
    """D1: one link per pair of reachable GPUs, a < b in index order, with the recording's
    level (by name) and NVLink flag (P2P status OK)."""
    raw = HOSTS[host_id]
    lost = {g["index"] for g in raw["gpus"] if is_lost(g)}
    want = {
        (link["a"], link["b"]): (
            link["level_name"],
            link["p2p_nvlink_status"] == pynvml.NVML_P2P_STATUS_OK,
        )
        for link in raw["gpu_links"]
        if not {link["a"], link["b"]} & lost
    }
    assert all(LEVELS[link["level"]] == link["level_name"] for link in raw["gpu_links"])
    inv = collect_inventory(FIXTURES, host_id)
    assert [(link.a, link.b) for link in inv.gpu_links] == sorted(want)
    assert {(link.a, link.b): (link.level, link.nvlink) for link in inv.gpu_links} == want
    reachable = len(raw["gpus"]) - len(lost)
    assert len(inv.gpu_links) == math.comb(reachable, 2)


def test_lost_gpu_has_no_links() -> None:
    """D1: a lost GPU (hgx-h200-ecc GPU 7) is in no link; the other pairs are all there."""
    inv = collect_inventory(FIXTURES, "hgx-h200-ecc")
    assert inv.gpus[7].health_reasons == ["gpu_lost"]
    assert not [link for link in inv.gpu_links if 7 in (link.a, link.b)]
    assert len(inv.gpu_links) == math.comb(7, 2)


@pytest.mark.parametrize("host_id", HOST_IDS)
def test_recorded_numa_nodes_and_cores(host_id: str) -> None:
    """D1: the recording's NUMA nodes (cpus, MemTotal) and thread siblings replace the
    machine's."""
    raw = HOSTS[host_id]
    inv = collect_inventory(FIXTURES, host_id)
    assert inv.cpu.numa_nodes == [
        NumaNode(id=n["id"], cpus=n["cpus"], memory_bytes=n["memory_total_bytes"])
        for n in raw["numa_nodes"]
    ]
    assert inv.cpu.thread_siblings == raw["cpu"]["thread_siblings"]


@pytest.mark.parametrize("host_id", HOST_IDS)
def test_topology_fits_the_wire_model_and_is_stable(host_id: str) -> None:
    """D1: the inventory with its topology decodes as the wire model (cpulists, counts), and
    two collections of an unchanged host encode the same (its digest does not move)."""
    first = msgspec.json.encode(collect_inventory(FIXTURES, host_id))
    assert msgspec.json.decode(first, type=Inventory).gpu_links == (
        collect_inventory(FIXTURES, host_id).gpu_links
    )
    assert first == msgspec.json.encode(collect_inventory(FIXTURES, host_id))


# --- the fake's topology calls, with pynvml's return types ---------------------------


@pytest.mark.parametrize(("host_id", "index"), RECORDED_GPUS)
def test_fake_cpu_affinity_words(host_id: str, index: int) -> None:
    """D1: nvmlDeviceGetCpuAffinity(h, ceil(logical_cpus/64)) is a c_ulonglong array of that
    length with bit cpu % 64 of word cpu // 64 set for exactly the recorded CPUs."""
    raw = HOSTS[host_id]
    want_gpu = raw["gpus"][index]
    words = math.ceil(raw["cpu"]["logical_cpus"] / 64)
    fake = FakeNvml(load_host(FIXTURES, host_id))
    fake.nvmlInit()
    mask = fake.nvmlDeviceGetCpuAffinity(fake.nvmlDeviceGetHandleByIndex(index), words)
    assert isinstance(mask, ctypes.Array)
    assert mask._type_ is ctypes.c_ulonglong
    assert len(mask) == words
    want = [0] * words
    for cpu_id in cpulist.parse(want_gpu["cpu_affinity"]):
        want[cpu_id // 64] |= 1 << (cpu_id % 64)
    assert list(mask) == want


def test_fake_cpu_affinity_fills_only_the_words_asked_for() -> None:
    """D1: a mask one word long holds only CPUs 0-63, as the driver fills what it is given."""
    fake = FakeNvml(load_host(FIXTURES, "dgx-h100-01"))
    fake.nvmlInit()
    [word] = fake.nvmlDeviceGetCpuAffinity(fake.nvmlDeviceGetHandleByIndex(0), 1)
    low = [c for c in cpulist.parse(HOSTS["dgx-h100-01"]["gpus"][0]["cpu_affinity"]) if c < 64]
    assert word == sum(1 << c for c in low)


def test_fake_topology_calls_answer_as_pynvml() -> None:
    """D1: minor number and NUMA node are ints; the common ancestor and NVLink P2P status are
    ints, symmetric, with a GPU and itself INTERNAL and OK."""
    raw = HOSTS["dgx-a100-02"]
    fake = FakeNvml(load_host(FIXTURES, "dgx-a100-02"))
    fake.nvmlInit()
    handles = [fake.nvmlDeviceGetHandleByIndex(i) for i in range(len(raw["gpus"]))]
    for handle, want in zip(handles, raw["gpus"], strict=True):
        assert type(fake.nvmlDeviceGetMinorNumber(handle)) is int
        assert fake.nvmlDeviceGetNumaNodeId(handle) == want["numa_node"]
        assert fake.nvmlDeviceGetTopologyCommonAncestor(handle, handle) == (
            pynvml.NVML_TOPOLOGY_INTERNAL
        )
        nvlink = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        assert fake.nvmlDeviceGetP2PStatus(handle, handle, nvlink) == pynvml.NVML_P2P_STATUS_OK
    for link in raw["gpu_links"]:
        a, b = handles[link["a"]], handles[link["b"]]
        nvlink = pynvml.NVML_P2P_CAPS_INDEX_NVLINK
        levels = {
            fake.nvmlDeviceGetTopologyCommonAncestor(a, b),
            fake.nvmlDeviceGetTopologyCommonAncestor(b, a),
        }
        assert levels == {link["level"]}
        statuses = {
            fake.nvmlDeviceGetP2PStatus(a, b, nvlink),
            fake.nvmlDeviceGetP2PStatus(b, a, nvlink),
        }
        assert statuses == {link["p2p_nvlink_status"]}


def test_fake_numa_node_unknown_is_not_supported() -> None:
    """D1: a recording without a NUMA node (a one-node desktop) makes NVML say NotSupported."""
    fake = FakeNvml(load_host(FIXTURES, "ws-rtx4090"))
    fake.nvmlInit()
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetNumaNodeId(fake.nvmlDeviceGetHandleByIndex(0))


def test_fake_pair_calls_fail_for_a_lost_gpu_either_way() -> None:
    """D1, H5: a lost GPU as either GPU of a pair makes the pair calls raise GpuIsLost."""
    fake = FakeNvml(load_host(FIXTURES, "hgx-h200-ecc"))
    fake.nvmlInit()
    well, lost = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(7)
    for first, second in ((well, lost), (lost, well)):
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            fake.nvmlDeviceGetTopologyCommonAncestor(first, second)
        with pytest.raises(pynvml.NVMLError_GpuIsLost):
            fake.nvmlDeviceGetP2PStatus(first, second, pynvml.NVML_P2P_CAPS_INDEX_NVLINK)


# --- when NVML cannot say ------------------------------------------------------------


@pytest.mark.parametrize(
    "error", [pynvml.NVMLError_FunctionNotFound, pynvml.NVMLError_NotSupported]
)
def test_numa_node_falls_back_to_sysfs(tmp_path: Path, error: type[Exception]) -> None:
    """D1: without nvmlDeviceGetNumaNodeId the GPU's sysfs numa_node is read (lowercase bus id
    with a 4-digit domain); -1 or no file is null."""
    devices = tmp_path / "sys/bus/pci/devices"
    write(devices / "0000:18:00.0/numa_node", "1\n")  # the recording says 0: sysfs is read
    write(devices / "0000:2a:00.0/numa_node", "-1\n")
    failures = {("nvmlDeviceGetNumaNodeId", None): error}
    inv = inventory("dgx-h100-01", sysfs_root=tmp_path, failures=failures)
    assert [g.numa_node for g in inv.gpus[:3]] == [1, None, None]
    assert {g.numa_node for g in inventory("dgx-h100-01", failures=failures).gpus} == {None}


def test_numa_node_sysfs_address_of_a_non_zero_domain(tmp_path: Path) -> None:
    """D1: NVML's "00000009:0A:00.0" is sysfs's 0009:0a:00.0 (a GH200-style domain)."""
    host = raw_host("dgx-h100-01")
    host["gpus"][0]["pci"]["busId"] = "00000009:0A:00.0"
    write(tmp_path / "sys/bus/pci/devices/0009:0a:00.0/numa_node", "3\n")
    failures = {("nvmlDeviceGetNumaNodeId", None): pynvml.NVMLError_FunctionNotFound}
    assert inventory(host, sysfs_root=tmp_path, failures=failures).gpus[0].numa_node == 3


def test_cpu_affinity_falls_back_to_local_cpulist(tmp_path: Path) -> None:
    """D1: when nvmlDeviceGetCpuAffinity fails, the GPU's sysfs local_cpulist is its affinity."""
    write(tmp_path / "sys/bus/pci/devices/0000:18:00.0/local_cpulist", "0-3,8\n")
    failures = {("nvmlDeviceGetCpuAffinity", None): pynvml.NVMLError_NotSupported}
    inv = inventory("dgx-h100-01", sysfs_root=tmp_path, failures=failures)
    assert inv.gpus[0].cpu_affinity == "0-3,8"
    assert inv.gpus[1].cpu_affinity is None  # no file either: unknown


def test_failing_topology_calls_null_the_fact_and_keep_the_gpu() -> None:
    """D1: an NVML error on a GPU's minor number or NUMA node nulls that fact only."""
    inv = inventory(
        "dgx-h100-01",
        failures={
            ("nvmlDeviceGetMinorNumber", 1): pynvml.NVMLError_Unknown,
            ("nvmlDeviceGetNumaNodeId", 2): pynvml.NVMLError_NoPermission,
        },
    )
    assert (inv.gpus[1].minor_number, inv.gpus[1].numa_node) == (None, 0)
    assert (inv.gpus[2].minor_number, inv.gpus[2].numa_node) == (2, None)
    assert {g.health for g in inv.gpus} == {"healthy"}


def test_a_pair_whose_calls_fail_is_left_out() -> None:
    """D1: a link whose common-ancestor or P2P call fails is left out; the rest stay."""
    inv = inventory(
        "dgx-h100-01",
        failures={  # keyed by the first GPU of the pair, as the fake's failures are
            ("nvmlDeviceGetP2PStatus", 2): pynvml.NVMLError_Unknown,
            ("nvmlDeviceGetTopologyCommonAncestor", 5): pynvml.NVMLError_GpuIsLost,
        },
    )
    gone = {(2, b) for b in range(3, 8)} | {(5, 6), (5, 7)}
    all_pairs = {(a, b) for a in range(8) for b in range(a + 1, 8)}
    assert {(link.a, link.b) for link in inv.gpu_links} == all_pairs - gone
    assert len(inv.gpus) == 8


# --- host facts from sysfs -----------------------------------------------------------


def test_numa_nodes_from_sysfs(tmp_path: Path) -> None:
    """D1: one NUMA node per sysfs node<id> (by id, not by name), with its cpulist and
    MemTotal kB × 1024; a memory-less or CPU-less node is kept."""
    nodes = tmp_path / "sys/devices/system/node"
    write(nodes / "node0/cpulist", "0-3,8-11\n")
    write(nodes / "node0/meminfo", "Node 0 MemTotal:       1000 kB\nNode 0 MemFree:   10 kB\n")
    write(nodes / "node10/cpulist", "\n")  # CPU-less memory (CXL)
    write(nodes / "node10/meminfo", "Node 10 MemTotal:       2048 kB\n")
    write(nodes / "node2/cpulist", "4-7\n")  # memory-less
    write(nodes / "node2/meminfo", "Node 2 MemTotal:       0 kB\n")
    write(nodes / "possible", "0-10\n")
    write(nodes / "has_cpu", "0,2\n")
    assert numa_nodes(tmp_path) == [
        NumaNode(id=0, cpus="0-3,8-11", memory_bytes=1_024_000),
        NumaNode(id=2, cpus="4-7", memory_bytes=0),
        NumaNode(id=10, cpus="", memory_bytes=2_097_152),
    ]
    assert cpu(tmp_path).numa_nodes == numa_nodes(tmp_path)


def test_thread_siblings_from_sysfs(tmp_path: Path) -> None:
    """D1: the distinct thread_siblings_list values, one per core, ordered by first CPU."""
    cpus = tmp_path / "sys/devices/system/cpu"
    for cpu_id, siblings in {
        0: "0,4",
        4: "0,4",
        2: "2-3",
        3: "2-3",
        10: "10-11",
        11: "10-11",
    }.items():
        write(cpus / f"cpu{cpu_id}/topology/thread_siblings_list", f"{siblings}\n")
    write(cpus / "online", "0-11\n")
    assert thread_siblings(tmp_path) == ["0,4", "2-3", "10-11"]
    assert cpu(tmp_path).thread_siblings == ["0,4", "2-3", "10-11"]


def test_host_topology_without_sysfs(tmp_path: Path) -> None:
    """D1: a host whose sysfs has no nodes or topology reports empty lists."""
    assert (numa_nodes(tmp_path), thread_siblings(tmp_path)) == ([], [])


# --- compute processes for delivery and release --------------------------------------


@pytest.mark.parametrize("host_id", HOST_IDS)
def test_recorded_processes(host_id: str) -> None:
    """D5, D7: every GPU and MIG instance of a recorded host maps to its recorded pids; a host
    without NVML maps nothing."""
    found = compute_processes(FIXTURES, host_id)
    assert found == (
        expected_processes(HOSTS[host_id]) if HOSTS[host_id]["nvml"]["available"] else {}
    )


def test_a_process_appears_when_the_fixture_is_rewritten(tmp_path: Path) -> None:
    """D5: a fixture rewritten between two runs makes a process appear on a GPU and on a MIG
    instance; the fixture is read when the collector is created."""
    path = tmp_path / "hosts.json"
    path.write_text(json.dumps(RAW))
    h100 = HOSTS["dgx-h100-01"]["gpus"]
    before = compute_processes(path, "dgx-h100-01")
    assert before == {g["uuid"]: [] for g in h100}
    early = InventoryCollector(path, "dgx-a100-02")
    edited = json.loads(json.dumps(RAW))
    by_id = {h["id"]: h for h in edited["hosts"]}
    by_id["dgx-h100-01"]["gpus"][2]["compute_processes"] = [
        {"pid": 4242, "used_gpu_memory_bytes": 1 << 30},
        {"pid": 17, "used_gpu_memory_bytes": None},
    ]
    mig = by_id["dgx-a100-02"]["gpus"][5]["mig"]["instances"][1]
    mig["compute_processes"] = [{"pid": 99, "used_gpu_memory_bytes": 4096}]
    path.write_text(json.dumps(edited))
    after = compute_processes(path, "dgx-h100-01")
    assert after == {**before, h100[2]["uuid"]: [17, 4242]}
    assert compute_processes(path, "dgx-a100-02")[mig["uuid"]] == [99]
    with early:
        assert early.compute_processes()[mig["uuid"]] == []


@pytest.mark.parametrize(
    "error",
    [pynvml.NVMLError_NoPermission, pynvml.NVMLError_NotSupported, pynvml.NVMLError_GpuIsLost],
)
def test_a_failing_process_listing_is_left_out_and_logged_once(
    error: type[Exception], debug_logs: list[MutableMapping[str, Any]]
) -> None:
    """D5, D7: a GPU whose process listing fails is left out (NVML cannot say what runs
    there: no release is confirmed on it), the others as recorded, and the failure is
    logged once at debug, not every cycle."""
    host = raw_host("dgx-h100-01")
    for gpu in host["gpus"][2:4]:
        gpu["compute_processes"] = [{"pid": 7, "used_gpu_memory_bytes": 1}]
    fake = FakeNvml(load_host(host), failures={("nvmlDeviceGetComputeRunningProcesses", 3): error})
    uuids = [g["uuid"] for g in host["gpus"]]
    with NvmlSession(fake) as session:
        first, second = session.compute_processes(), session.compute_processes()
    assert (
        first
        == second
        == {
            **{uuid: [] for n, uuid in enumerate(uuids) if n != 3},
            uuids[2]: [7],
        }
    )
    failures = [e for e in debug_logs if e["event"] == "nvml.processes_unknown"]
    assert [(e["log_level"], e["device"], e["error"]) for e in failures] == [
        ("debug", uuids[3], error.__name__)
    ]


def test_a_hidden_gpu_is_left_out_of_the_processes() -> None:
    """D5: a GPU this process may not open (NoPermission at its handle) is in no map, as it is
    in no inventory."""
    host = load_host(FIXTURES, "dgx-h100-01")
    failures = {("nvmlDeviceGetHandleByIndex", 4): pynvml.NVMLError_NoPermission}
    with NvmlSession(FakeNvml(host, failures=failures)) as session:
        found = session.compute_processes()
    assert list(found) == [g.uuid for g in host.gpus if g.index != 4]


def test_fake_processes_are_what_pynvml_returns() -> None:
    """D5: the fake lists processes as the installed pynvml does (its c_nvmlProcessInfo_t made
    an nvmlFriendlyObject: pid, usedGpuMemory in bytes or None, instance ids 0xFFFFFFFF for
    the whole GPU); a MIG device lists none unless recorded."""
    host = raw_host("dgx-a100-02")
    host["gpus"][0]["compute_processes"] = [
        {"pid": 4242, "used_gpu_memory_bytes": 1 << 30},
        {"pid": 17, "used_gpu_memory_bytes": None},
    ]
    fake = FakeNvml(load_host(host))
    fake.nvmlInit()
    listed = fake.nvmlDeviceGetComputeRunningProcesses(fake.nvmlDeviceGetHandleByIndex(0))
    assert {type(p) for p in listed} == {pynvml.nvmlFriendlyObject}
    assert [(p.pid, p.usedGpuMemory, p.gpuInstanceId, p.computeInstanceId) for p in listed] == [
        (4242, 1 << 30, 0xFFFFFFFF, 0xFFFFFFFF),
        (17, None, 0xFFFFFFFF, 0xFFFFFFFF),
    ]
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(fake.nvmlDeviceGetHandleByIndex(4), 0)
    assert fake.nvmlDeviceGetComputeRunningProcesses(mig) == []
