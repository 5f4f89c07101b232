"""The agent's inventory (DESIGN §6) on the six recorded hosts, the fake NVML, and host facts.

Fixtures are the recorded hosts shipped with the agent (agent/fixtures/host-fixtures.json,
a copy of the team's reference/host-fixtures.json).
"""

import ctypes.util
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil  # type: ignore[import-untyped]
import pynvml  # type: ignore[import-untyped]
import pytest
import structlog

from agent.inventory import collect_inventory, inventory_from
from agent.inventory.fixture import FakeNvml
from agent.inventory.host import collect_host, cpu, filesystems, hugepages, machine_id
from agent.inventory.nvml.api import load_pynvml
from agent.inventory.nvml.session import collect_gpus
from agent.inventory.recording import FixtureError, host_facts, load_host
from shared.inventory import HugepagePool, Inventory

FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
RAW = json.loads(FIXTURES.read_text())
HOSTS = {h["id"]: h for h in RAW["hosts"]}
HOST_IDS = list(HOSTS)


def raw_host(host_id: str) -> dict[str, Any]:
    """A fresh, mutable copy of one recorded host."""
    copy: dict[str, Any] = json.loads(json.dumps(HOSTS[host_id]))
    return copy


def inventory(host: dict[str, Any] | str, **fake: Any) -> Inventory:
    """The inventory of a recorded host (by id or as an edited object) through the fake NVML."""
    loaded = load_host(FIXTURES, host) if isinstance(host, str) else load_host(host)
    return inventory_from(FakeNvml(loaded, **fake), host_facts(loaded))


# --- the six recorded hosts ------------------------------------------------------


@pytest.mark.parametrize("host_id", HOST_IDS)
def test_recorded_host_gpus(host_id: str) -> None:
    """§6: each recorded host reports its GPUs as NVML gives them, in index order."""
    raw = HOSTS[host_id]
    inv = collect_inventory(FIXTURES, host_id)
    assert len(inv.gpus) == raw["gpu_count"] == len(raw["gpus"])
    for gpu, want in zip(inv.gpus, raw["gpus"], strict=True):
        assert gpu.index == want["index"]
        if (want.get("health") or {}).get("lost"):  # H5: no call reaches it; reported lost
            assert (gpu.uuid, gpu.health) == (f"GPU-lost-{gpu.index}", "unhealthy")
            continue
        assert gpu.name == want["name"]
        assert gpu.uuid == want["uuid"]
        assert gpu.serial == want["serial"]
        assert gpu.memory_bytes == want["memory_total_bytes"]
        assert gpu.pci_bus_id == want["pci"]["busId"]
        assert gpu.pci_device_id == int(want["pci"]["pciDeviceId"], 16)
        assert gpu.compute_capability == "{}.{}".format(*want["cuda_compute_capability"])
        assert gpu.power_limit_w == want["power_management_limit_mw"] / 1000
        assert gpu.temperature_c == want["temperature_gpu_c"]
        assert gpu.persistence_mode is bool(want["persistence_mode"])
        assert gpu.mig_supported is want["mig"]["supported"]


@pytest.mark.parametrize("host_id", HOST_IDS)
def test_recorded_host_facts(host_id: str) -> None:
    """§6: the fixture's CPU, memory, huge page, disk and identity facts replace the machine's."""
    raw = HOSTS[host_id]
    inv = collect_inventory(FIXTURES, host_id)
    assert inv.hostname == raw["hostname"]
    assert inv.machine_id == f"fixture-{host_id}"
    assert (inv.cpu.sockets, inv.cpu.logical_cpus, inv.cpu.physical_cores, inv.cpu.model) == (
        raw["cpu"]["sockets"],
        raw["cpu"]["logical_cpus"],
        raw["cpu"]["physical_cores"],
        raw["cpu"]["model"],
    )
    assert inv.memory_total_bytes == raw["memory_total_bytes"]
    assert [(f.path, f.device, f.total_bytes) for f in inv.filesystems] == [
        (d["path"], d["device"], d["total_bytes"]) for d in raw["disks"]
    ]
    assert sum(f.total_bytes for f in inv.filesystems) == raw["disk_total_bytes"]
    assert inv.nvml.available is raw["nvml"]["available"]
    assert inv.nvml.driver_version == raw["nvml"]["driver_version"]
    assert inv.nvml.cuda_driver_version == raw["nvml"]["cuda_driver_version_str"]


@pytest.mark.parametrize("host_id", HOST_IDS)
def test_recorded_host_families_match_the_rule(host_id: str) -> None:
    """N1: each GPU's family, derived from its name, is the one the reference records."""
    inv = collect_inventory(FIXTURES, host_id)
    assert [g.family for g in inv.gpus] == [
        None if (g.get("health") or {}).get("lost") else g["family"]  # H5: a lost GPU has no name
        for g in HOSTS[host_id]["gpus"]
    ]


def test_fixture_family_is_never_read() -> None:
    """§6: a wrong precomputed family in the fixture changes nothing; the name decides."""
    host = raw_host("dgx-h100-01")
    for gpu in host["gpus"]:
        gpu["family"] = "H200"
    assert {g.family for g in inventory(host).gpus} == {"H100"}


def test_family_follows_the_name() -> None:
    """N1: renaming the recorded GPU renames its family (H20 is not H200)."""
    host = raw_host("hgx-h200-01")
    host["gpus"][0]["name"] = "NVIDIA H20"
    assert [g.family for g in inventory(host).gpus][:2] == ["H20", "H200"]


def test_dgx_a100_mig_instances() -> None:
    """S1: MIG on GPUs 4-7 only, each instance with its profile, ids and memory."""
    inv = collect_inventory(FIXTURES, "dgx-a100-02")
    assert [g.mig_current for g in inv.gpus] == [False] * 4 + [True] * 4
    assert all(not g.mig_instances for g in inv.gpus[:4])
    assert [[m.profile for m in g.mig_instances] for g in inv.gpus[4:]] == [
        ["3g.40gb", "2g.20gb", "1g.10gb", "1g.10gb"],
        ["1g.10gb"] * 7,
        ["4g.40gb", "3g.40gb"],
        ["2g.20gb", "2g.20gb", "1g.20gb", "1g.10gb"],
    ]
    for gpu, raw in zip(inv.gpus[4:], HOSTS["dgx-a100-02"]["gpus"][4:], strict=True):
        want = raw["mig"]["instances"]
        assert [
            (m.uuid, m.gpu_instance_id, m.compute_instance_id, m.memory_bytes)
            for m in gpu.mig_instances
        ] == [
            (w["uuid"], w["gpu_instance_id"], w["compute_instance_id"], w["memory_total_bytes"])
            for w in want
        ]
        assert gpu.memory_bytes == raw["memory_total_bytes"]  # the parent's, not a slice's


def test_mig_slots_with_holes() -> None:
    """mig-profiles §4: empty MIG slots (NotFound) are skipped, later ones still read."""
    host = raw_host("dgx-a100-02")
    instances = host["gpus"][6]["mig"]["instances"]
    instances[0]["mig_device_index"], instances[1]["mig_device_index"] = 2, 6
    gpu = inventory(host).gpus[6]
    assert [m.profile for m in gpu.mig_instances] == ["4g.40gb", "3g.40gb"]


def test_mig_enabled_without_instances() -> None:
    """mig-profiles §6: MIG on with no instances is a real state: on, and nothing to book."""
    host = raw_host("dgx-a100-02")
    host["gpus"][5]["mig"]["instances"] = []
    gpu = inventory(host).gpus[5]
    assert (gpu.mig_current, gpu.mig_instances) == (True, [])


def test_mig_pending_differs_from_current() -> None:
    """mig-profiles §6: turning MIG on waits for a reset: pending on, current off."""
    host = raw_host("dgx-h100-01")
    host["gpus"][0]["mig"]["pending_mode"] = 1
    gpu = inventory(host).gpus[0]
    assert (gpu.mig_supported, gpu.mig_current, gpu.mig_pending) == (True, False, True)


def test_non_mig_gpu() -> None:
    """fake-nvml §4.5: GetMigMode raising NotSupported means no MIG at all."""
    gpu = collect_inventory(FIXTURES, "l40s-node-03").gpus[0]
    assert (gpu.mig_supported, gpu.mig_current, gpu.mig_instances) == (False, False, [])


def test_geforce_gaps_are_null() -> None:
    """fake-nvml §2: a GeForce card has no serial; with ECC off there is no error counter."""
    gpu = collect_inventory(FIXTURES, "ws-rtx4090").gpus[0]
    assert gpu.family == "RTX-4090"
    assert gpu.serial is None
    assert (gpu.ecc_current, gpu.ecc_pending, gpu.ecc_uncorrected_volatile) == (False, False, None)
    assert (gpu.persistence_mode, gpu.power_limit_w) == (False, 450.0)


def test_ecc_not_supported_is_null() -> None:
    """fake-nvml §2: GetEccMode raising NotSupported gives null ECC facts, not False."""
    host = raw_host("l40s-node-03")
    host["gpus"][0]["ecc_mode"] = None
    gpu = inventory(host).gpus[0]
    assert (gpu.ecc_current, gpu.ecc_pending, gpu.ecc_uncorrected_volatile) == (None, None, None)


def test_ecc_uncorrected_errors_are_reported() -> None:
    """Health: the volatile uncorrected ECC count is read where ECC is on."""
    host = raw_host("dgx-h100-01")
    host["gpus"][3]["ecc_uncorrected_volatile"] = 2
    assert [g.ecc_uncorrected_volatile for g in inventory(host).gpus] == [0, 0, 0, 2, 0, 0, 0, 0]


def test_ecc_counter_call_missing_from_the_binding() -> None:
    """Bindings without nvmlDeviceGetTotalEccErrors still give an inventory, count null."""

    class OldBinding(FakeNvml):
        nvmlDeviceGetTotalEccErrors = None  # type: ignore[assignment]  # absent, as getattr sees it

    host = load_host(FIXTURES, "dgx-h100-01")
    inv = inventory_from(OldBinding(host), host_facts(host))
    assert [g.ecc_uncorrected_volatile for g in inv.gpus] == [None] * 8
    assert [g.ecc_current for g in inv.gpus] == [True] * 8


def test_cpu_only_vps() -> None:
    """§6: without an NVIDIA driver the host is CPU-only and the 1Gi pool is null, not 0."""
    inv = collect_inventory(FIXTURES, "vps-cpu-01")
    assert inv.nvml.available is False
    assert inv.nvml.error == "NVMLError_LibraryNotFound"
    assert inv.gpus == []
    assert inv.hugepages.pages_2mi == HugepagePool(total=0, free=0)
    assert inv.hugepages.pages_1gi is None


def test_recorded_hugepages() -> None:
    """N3: huge page pools are counts of pages, per size, as recorded."""
    h200 = collect_inventory(FIXTURES, "hgx-h200-01").hugepages
    l40s = collect_inventory(FIXTURES, "l40s-node-03").hugepages
    assert (h200.pages_2mi, h200.pages_1gi) == (
        HugepagePool(total=0, free=0),
        HugepagePool(total=128, free=96),
    )
    assert (l40s.pages_2mi, l40s.pages_1gi) == (
        HugepagePool(total=65536, free=40960),
        HugepagePool(total=0, free=0),
    )


@pytest.mark.parametrize("host_id", HOST_IDS)
def test_bytes_mode_gives_the_same_inventory(host_id: str) -> None:
    """fake-nvml §1: bindings ≤ 11.510 return bytes; the inventory is the same."""
    assert inventory(host_id, bytes_mode=True) == inventory(host_id)


def test_bytes_mode_really_returns_bytes() -> None:
    """fake-nvml §1: in bytes mode names and struct char fields are bytes, as in 11.510."""
    fake = FakeNvml(load_host(FIXTURES, "dgx-h100-01"), bytes_mode=True)
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetName(handle) == b"NVIDIA H100 80GB HBM3"
    assert fake.nvmlDeviceGetPciInfo(handle).busId == b"00000000:18:00.0"
    assert fake.nvmlSystemGetDriverVersion() == b"550.54.15"


# --- failures ----------------------------------------------------------------------


def test_one_hidden_gpu_leaves_the_others() -> None:
    """fake-nvml §4.9: a GPU hidden at GetHandleByIndex (NoPermission) is skipped and logged."""
    error = pynvml.NVMLError_NoPermission
    with structlog.testing.capture_logs() as logs:
        inv = inventory("dgx-h100-01", failures={("nvmlDeviceGetHandleByIndex", 3): error})
    assert [g.index for g in inv.gpus] == [0, 1, 2, 4, 5, 6, 7]
    assert {"event": "nvml.gpu_skipped", "index": 3, "error": error.__name__}.items() <= logs[
        -1
    ].items()


def test_gpu_lost_at_its_handle_is_reported_lost() -> None:
    """H5: a GPU lost at GetHandleByIndex stays in the report, unhealthy gpu_lost."""
    inv = inventory(
        "dgx-h100-01", failures={("nvmlDeviceGetHandleByIndex", 3): pynvml.NVMLError_GpuIsLost}
    )
    assert [g.index for g in inv.gpus] == list(range(8))
    assert (inv.gpus[3].uuid, inv.gpus[3].health, inv.gpus[3].health_reasons) == (
        "GPU-lost-3",
        "unhealthy",
        ["gpu_lost"],
    )


def test_gpu_lost_mid_read_is_reported_lost() -> None:
    """H5, fake-nvml §2: a GPU lost during its reads is reported lost; the others are whole."""
    inv = inventory(
        "dgx-a100-02",
        failures={
            ("nvmlDeviceGetTemperature", 2): pynvml.NVMLError_GpuIsLost,
            ("nvmlDeviceGetUUID", 6): pynvml.NVMLError_GpuIsLost,
        },
    )
    assert [g.index for g in inv.gpus] == list(range(8))
    assert [g.index for g in inv.gpus if g.health_reasons == ["gpu_lost"]] == [2, 6]
    assert {g.health for i, g in enumerate(inv.gpus) if i not in (2, 6)} == {"healthy"}


def test_unsupported_optional_facts_are_null() -> None:
    """fake-nvml §2: NotSupported on an optional call nulls that fact and keeps the GPU."""
    inv = inventory(
        "dgx-h100-01",
        failures={
            ("nvmlDeviceGetTemperature", None): pynvml.NVMLError_NotSupported,
            ("nvmlDeviceGetPowerManagementLimit", 1): pynvml.NVMLError_NoPermission,
        },
    )
    assert len(inv.gpus) == 8
    assert {g.temperature_c for g in inv.gpus} == {None}
    assert [g.power_limit_w for g in inv.gpus][:3] == [700.0, None, 700.0]


def test_memory_refused_on_a_mig_parent() -> None:
    """mig-profiles §4: unprivileged memory on a MIG parent may be refused; the GPU stays, 0 bytes."""
    inv = inventory(
        "dgx-a100-02",
        failures={("nvmlDeviceGetMemoryInfo", 4): pynvml.NVMLError_NoPermission},
    )
    assert len(inv.gpus) == 8
    assert inv.gpus[4].memory_bytes == 0
    assert inv.gpus[5].memory_bytes == 85899345920


@pytest.mark.parametrize(
    "error", [pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_LibRmVersionMismatch]
)
def test_init_failure_is_a_cpu_only_host(error: type[Exception]) -> None:
    """fake-nvml §4.1: any NVML init error gives a CPU-only report naming the error."""
    inv = inventory("dgx-h100-01", init_error=error)
    assert (inv.nvml.available, inv.nvml.error, inv.gpus) == (False, error.__name__, [])


def test_device_count_failure_keeps_the_host() -> None:
    """An NVML that starts but cannot count its GPUs is reported with its error, no GPUs."""
    inv = inventory(
        "dgx-h100-01", failures={("nvmlDeviceGetCount", None): pynvml.NVMLError_Unknown}
    )
    assert (inv.nvml.available, inv.nvml.error, inv.gpus) == (True, "NVMLError_Unknown", [])


def test_nvml_is_shut_down_after_a_collection() -> None:
    """fake-nvml §2: each init is matched by a shutdown; afterwards calls are Uninitialized."""
    fake = FakeNvml(load_host(FIXTURES, "dgx-h100-01"))
    collect_gpus(fake)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_nvml_is_shut_down_even_when_collection_fails() -> None:
    """An unexpected error escapes, but NVML is still shut down."""
    fake = FakeNvml(
        load_host(FIXTURES, "dgx-h100-01"),
        failures={("nvmlDeviceGetName", 2): RuntimeError("boom")},
    )
    with pytest.raises(RuntimeError):
        collect_gpus(fake)
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


# --- the fake itself ---------------------------------------------------------------


def test_fake_refuses_calls_before_init() -> None:
    """fake-nvml §4.2: every call before nvmlInit raises the real NVMLError_Uninitialized."""
    fake = FakeNvml(load_host(FIXTURES, "dgx-h100-01"))
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlShutdown()


def test_fake_init_is_reference_counted() -> None:
    """fake-nvml §2: two inits need two shutdowns."""
    fake = FakeNvml(load_host(FIXTURES, "dgx-h100-01"))
    fake.nvmlInit()
    fake.nvmlInit()
    fake.nvmlShutdown()
    assert fake.nvmlDeviceGetCount() == 8
    fake.nvmlShutdown()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        fake.nvmlDeviceGetCount()


def test_fake_library_not_found() -> None:
    """fake-nvml §4.1: a host without NVML raises the real LibraryNotFound at init."""
    fake = FakeNvml(load_host(FIXTURES, "vps-cpu-01"))
    with pytest.raises(pynvml.NVMLError_LibraryNotFound):
        fake.nvmlInit()


def test_fake_handles_are_opaque() -> None:
    """fake-nvml §2: two lookups of one GPU compare unequal, and handles are unhashable."""
    fake = FakeNvml(load_host(FIXTURES, "dgx-h100-01"))
    fake.nvmlInit()
    first, second = fake.nvmlDeviceGetHandleByIndex(0), fake.nvmlDeviceGetHandleByIndex(0)
    assert first != second
    with pytest.raises(TypeError):
        hash(first)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetHandleByIndex(8)


def test_fake_uses_real_structs_and_errors() -> None:
    """fake-nvml §4: real struct types and exception classes, so `except` clauses match."""
    fake = FakeNvml(load_host(FIXTURES, "ws-rtx4090"))
    fake.nvmlInit()
    handle = fake.nvmlDeviceGetHandleByIndex(0)
    assert type(fake.nvmlDeviceGetPciInfo(handle)) is pynvml.nvmlPciInfo_t
    assert type(fake.nvmlDeviceGetMemoryInfo(handle)) is pynvml.c_nvmlMemory_t
    assert fake.nvmlDeviceGetPciInfo(handle).busId == "00000000:01:00.0"
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetSerial(handle)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetMigMode(handle)
    assert fake.NVMLError_NotSupported is pynvml.NVMLError_NotSupported
    assert fake.NVML_DEVICE_ARCH_ADA == pynvml.NVML_DEVICE_ARCH_ADA


def test_fake_mig_slots() -> None:
    """mig-profiles §4: empty slots raise NotFound, past the maximum InvalidArgument."""
    fake = FakeNvml(load_host(FIXTURES, "dgx-a100-02"))
    fake.nvmlInit()
    gpu4 = fake.nvmlDeviceGetHandleByIndex(4)
    assert fake.nvmlDeviceGetMaxMigDeviceCount(gpu4) == 7
    mig = fake.nvmlDeviceGetMigDeviceHandleByIndex(gpu4, 0)
    assert fake.nvmlDeviceGetName(mig) == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert fake.nvmlDeviceIsMigDeviceHandle(mig).value == 1
    with pytest.raises(pynvml.NVMLError_NotFound):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(gpu4, 4)
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(gpu4, 7)
    with pytest.raises(pynvml.NVMLError_NotSupported):
        fake.nvmlDeviceGetMigDeviceHandleByIndex(fake.nvmlDeviceGetHandleByIndex(0), 0)


def test_fake_serves_no_unfaked_function() -> None:
    """A pynvml function the fake does not model is absent, not silently the real one."""
    fake = FakeNvml(load_host(FIXTURES, "dgx-h100-01"))
    assert not hasattr(fake, "nvmlDeviceGetGpuInstances")


# --- loading fixtures --------------------------------------------------------------


def test_fixture_file_needs_a_host_id() -> None:
    """§6: the whole file takes --fixture-host; a missing or unknown one is a clear error."""
    with pytest.raises(FixtureError, match="several hosts"):
        load_host(FIXTURES)
    with pytest.raises(FixtureError, match="no host 'dgx-x'"):
        load_host(FIXTURES, "dgx-x")


def test_fixture_of_one_host(tmp_path: Path) -> None:
    """§6: a file holding one host object is a fixture on its own."""
    path = tmp_path / "one.json"
    path.write_text(json.dumps(HOSTS["ws-rtx4090"]))
    assert collect_inventory(path) == collect_inventory(FIXTURES, "ws-rtx4090")
    with pytest.raises(FixtureError, match="not 'dgx-h100-01'"):
        collect_inventory(path, "dgx-h100-01")


def test_bad_fixture_is_a_fixture_error(tmp_path: Path) -> None:
    """A fixture that is not JSON, or misses fields, is reported as such."""
    path = tmp_path / "bad.json"
    path.write_text("{not json")
    with pytest.raises(FixtureError):
        collect_inventory(path)
    path.write_text(json.dumps({"id": "x", "hostname": "x"}))
    with pytest.raises(FixtureError, match="'x'"):
        collect_inventory(path)


# --- NVML lifecycle on the real module ---------------------------------------------


def test_no_nvml_init_at_import() -> None:
    """STYLE: importing the agent's inventory (and collecting a fixture) never touches NVML."""
    script = """
import sys
import pynvml
calls = []
pynvml.nvmlInit = pynvml.nvmlInitWithFlags = lambda *a: calls.append(a)
import agent.inventory, agent.inventory.nvml, agent.inventory.host, agent.inventory.fixture
from pathlib import Path
agent.inventory.collect_inventory(Path(sys.argv[1]), "dgx-h100-01")
assert calls == [], calls
assert pynvml.nvmlLib is None
print("ok")
"""
    result = subprocess.run(
        [sys.executable, "-c", script, str(FIXTURES)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


@pytest.mark.skipif(
    ctypes.util.find_library("nvidia-ml") is not None, reason="an NVIDIA driver is present"
)
def test_real_pynvml_without_a_driver() -> None:
    """§6: on a machine without the driver, the real pynvml gives a CPU-only report."""
    info, gpus = collect_gpus(load_pynvml())
    assert (info.available, info.error, gpus) == (False, "NVMLError_LibraryNotFound", [])


def test_dgx_h100_cycle_is_fast() -> None:
    """§6: one inventory cycle of the DGX H100 fixture (read, parse, collect) is ≤ 20 ms."""
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        collect_inventory(FIXTURES, "dgx-h100-01")
        best = min(best, time.perf_counter() - start)
    assert best <= 0.020, best


# --- host facts from psutil and a fake sysfs tree ----------------------------------


def write(path: Path, text: str) -> None:
    """Write one file of the fake root, making its directories."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def fake_root(root: Path, packages: list[int], *, one_gig: bool) -> Path:
    """A /sys, /proc, /etc tree: CPUs in ``packages``, 2Mi pages, 1Gi pages if ``one_gig``."""
    for n, package in enumerate(packages):
        write(root / f"sys/devices/system/cpu/cpu{n}/topology/physical_package_id", f"{package}\n")
    write(root / "sys/devices/system/cpu/online", "0-3\n")  # not a cpuN directory
    pages = root / "sys/kernel/mm/hugepages"
    write(pages / "hugepages-2048kB/nr_hugepages", "512\n")
    write(pages / "hugepages-2048kB/free_hugepages", "500\n")
    if one_gig:
        write(pages / "hugepages-1048576kB/nr_hugepages", "16\n")
        write(pages / "hugepages-1048576kB/free_hugepages", "4\n")
    write(
        root / "proc/cpuinfo",
        "processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654 96-Core Processor\n"
        "physical id\t: 0\n\nprocessor\t: 1\nvendor_id\t: AuthenticAMD\n"
        "model name\t: AMD EPYC 9654 96-Core Processor\nphysical id\t: 1\n",
    )
    write(root / "etc/machine-id", "0123456789abcdef0123456789abcdef\n")
    return root


def test_host_sockets_from_topology(tmp_path: Path) -> None:
    """N3 inputs: sockets are distinct physical_package_id values; counts come from psutil."""
    facts = cpu(fake_root(tmp_path, [0, 0, 1, 1, 3], one_gig=True))
    assert facts.sockets == 3
    assert facts.model == "AMD EPYC 9654 96-Core Processor"
    assert facts.vendor == "AuthenticAMD"
    assert facts.logical_cpus == psutil.cpu_count(logical=True)
    assert facts.physical_cores == psutil.cpu_count(logical=False)


def test_host_sockets_without_topology(tmp_path: Path) -> None:
    """Without sysfs topology (some containers) sockets come from cpuinfo's physical ids."""
    write(
        tmp_path / "proc/cpuinfo",
        "processor\t: 0\nphysical id\t: 0\n\nprocessor\t: 1\nphysical id\t: 1\n",
    )
    assert cpu(tmp_path).sockets == 2
    assert cpu(tmp_path / "missing").sockets == 1


def test_host_hugepages_present(tmp_path: Path) -> None:
    """N3 inputs: configured and free pages of each size from sysfs."""
    pages = hugepages(fake_root(tmp_path, [0], one_gig=True))
    assert pages.pages_2mi == HugepagePool(total=512, free=500)
    assert pages.pages_1gi == HugepagePool(total=16, free=4)


def test_host_hugepages_size_absent(tmp_path: Path) -> None:
    """N3 inputs: a page size the kernel lacks is null, not 0."""
    pages = hugepages(fake_root(tmp_path, [0], one_gig=False))
    assert pages.pages_2mi == HugepagePool(total=512, free=500)
    assert pages.pages_1gi is None
    assert hugepages(tmp_path / "missing") == type(pages)(pages_2mi=None, pages_1gi=None)


def test_host_machine_id(tmp_path: Path) -> None:
    """Identity: /etc/machine-id, else a stable hash of the hostname."""
    assert machine_id(fake_root(tmp_path, [0], one_gig=False), "h1") == (
        "0123456789abcdef0123456789abcdef"
    )
    fallback = machine_id(tmp_path / "missing", "h1")
    assert fallback == machine_id(tmp_path / "missing", "h1") != machine_id(tmp_path / "x", "h2")
    assert fallback.startswith("host-")


def test_host_filesystems_are_real_and_unique() -> None:
    """N4 inputs: block-device filesystems with their sizes, one per device, no pseudo ones."""
    found = filesystems()
    assert len({f.device for f in found}) == len(found)
    for fs in found:
        assert fs.total_bytes == psutil.disk_usage(fs.path).total
    pseudo = {"tmpfs", "devtmpfs", "overlay", "squashfs", "proc", "sysfs"}
    types = {p.mountpoint: p.fstype for p in psutil.disk_partitions(all=True)}
    assert not [f for f in found if types.get(f.path) in pseudo]


def test_collect_host_under_a_root(tmp_path: Path) -> None:
    """§6 --sysfs-root: the whole host read takes /sys, /proc and /etc from the given root."""
    facts = collect_host(fake_root(tmp_path, [0, 1], one_gig=True))
    assert facts.cpu.sockets == 2
    assert facts.machine_id == "0123456789abcdef0123456789abcdef"
    assert facts.memory_total_bytes == psutil.virtual_memory().total
    assert facts.hugepages.pages_1gi == HugepagePool(total=16, free=4)


def test_real_host_inventory(tmp_path: Path) -> None:
    """§6: without a fixture the inventory is this machine's, and it encodes to the wire model."""
    inv = collect_inventory(sysfs_root=fake_root(tmp_path, [0], one_gig=False))
    assert inv.machine_id == "0123456789abcdef0123456789abcdef"
    assert inv.memory_total_bytes == psutil.virtual_memory().total
    with pytest.raises(ValueError, match="fixture"):
        collect_inventory(fixture_host="dgx-h100-01")


def test_power_limit_constraints_are_read_when_the_driver_gives_them() -> None:
    """The board's power range (nvmlDeviceGetPowerManagementLimitConstraints) reaches the inventory."""
    host = load_host(FIXTURES, "dgx-h100-01")
    gpus = [
        msgspec.structs.replace(g, power_limit_constraints_mw=(200_000, 700_000)) for g in host.gpus
    ]
    _, found = collect_gpus(FakeNvml(msgspec.structs.replace(host, gpus=gpus)))
    assert (found[0].power_limit_min_w, found[0].power_limit_max_w) == (200.0, 700.0)
    _, recorded = collect_gpus(FakeNvml(host))  # the reference recordings lack them: NotSupported
    assert (recorded[0].power_limit_min_w, recorded[0].power_limit_max_w) == (None, None)
