"""A recorded host: the reference/host-fixtures.json format, loading it, and its host facts.

Only the fields the fake NVML (agent/inventory/fixture.py) and the host facts serve are
read. The fixture's precomputed ``family`` is never read (``FixtureGpu`` has no such
field): the inventory derives the family from the name, as it does on hardware.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec
from msgspec import Struct, field

from agent.inventory.host import HostFacts
from shared.inventory import Cpu, Filesystem, HugepagePool, Hugepages, NumaNode


class FixtureError(ValueError):
    """The fixture file or host cannot be used."""


class FixturePci(Struct):
    busId: str
    pciDeviceId: str  # "0x233010DE"
    busIdLegacy: str = ""
    domain: int = 0
    bus: int = 0
    device: int = 0
    pciSubSystemId: str = "0x0"


class FixtureProcess(Struct):
    """One compute process NVML lists on a device (nvmlDeviceGetComputeRunningProcesses)."""

    pid: int
    used_gpu_memory_bytes: int | None = None  # None: NVML cannot say (NVML_VALUE_NOT_AVAILABLE)


class FixtureMigInstance(Struct):
    nvml_name: str
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    memory_total_bytes: int
    mig_device_index: int
    multiprocessor_count: int = 0
    gpu_instance_slice_count: int = 0
    compute_instance_slice_count: int = 0
    memory_size_mib: int = 0
    compute_processes: list[FixtureProcess] = []


class FixtureMig(Struct):
    supported: bool
    current_mode: int = 0
    pending_mode: int = 0
    max_mig_device_count: int = 0
    instances: list[FixtureMigInstance] = []


class FixtureXid(Struct):
    xid: int


class FixtureRemappedRows(Struct):
    """nvmlDeviceGetRemappedRows(h) as recorded: (correctable, uncorrectable, pending, failure)."""

    correctable: int = 0
    uncorrectable: int = 0
    pending: bool = False
    failure: bool = False


class FixtureHealth(Struct):
    """A GPU's ``health`` record (the reference's ``conventions``, gpu-health.md §7).

    A key left out takes a healthy GPU's answer; an explicit null in
    ``retired_pages_pending`` or ``remapped_rows`` is NotSupported.
    """

    lost: bool = False  # every call taking the GPU's handle raises GpuIsLost
    xid_events: list[FixtureXid] = []  # queued, once, into the first event set it is registered on
    ecc_uncorrected_volatile: int | None = None  # None: the GPU's own ecc_uncorrected_volatile
    retired_pages_pending: bool | None = False
    remapped_rows: FixtureRemappedRows | None = field(default_factory=FixtureRemappedRows)


class FixtureGpu(Struct):
    index: int
    name: str
    uuid: str
    pci: FixturePci
    memory_total_bytes: int
    mig: FixtureMig
    minor_number: int | None = None
    serial: str | None = None  # None: GetSerial raises NotSupported (GeForce)
    cuda_compute_capability: tuple[int, int] | None = None
    architecture: str | None = None
    persistence_mode: int | None = None
    power_management_limit_mw: int | None = None
    # [min, max] mW; the reference recordings do not have them: NotSupported, as old drivers say.
    power_limit_constraints_mw: tuple[int, int] | None = None
    temperature_gpu_c: int | None = None
    ecc_mode: tuple[int, int] | None = None  # None: GetEccMode raises NotSupported
    ecc_uncorrected_volatile: int = 0
    health: FixtureHealth | None = None  # None: a healthy GPU (no events, counters clear)
    # D1: None makes nvmlDeviceGetNumaNodeId / nvmlDeviceGetCpuAffinity raise NotSupported.
    numa_node: int | None = None
    cpu_affinity: str | None = None  # a cpulist
    compute_processes: list[FixtureProcess] = []


class FixtureNvml(Struct):
    available: bool
    init_exception: str | None = None  # "NVMLError_LibraryNotFound"
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: int | None = None


class FixtureCpu(Struct):
    sockets: int
    logical_cpus: int
    physical_cores: int | None = None
    model: str | None = None
    vendor: str | None = None
    thread_siblings: list[str] = []  # one cpulist per physical core, by first CPU


class FixtureNumaNode(Struct):
    id: int
    cpus: str  # a cpulist
    memory_total_bytes: int


class FixtureLink(Struct):
    """D1: one GPU pair a < b, as nvmlDeviceGetTopologyCommonAncestor and …GetP2PStatus answer."""

    a: int
    b: int
    level: int  # NVML_TOPOLOGY_* (0, 10, 20, 30, 40, 50)
    p2p_nvlink_status: int  # NVML_P2P_STATUS_* for NVML_P2P_CAPS_INDEX_NVLINK (0: OK)


class FixturePool(Struct):
    total: int
    free: int


class FixtureHugepages(Struct, rename={"pages_2mi": "2Mi", "pages_1gi": "1Gi"}):
    pages_2mi: FixturePool | None = None
    pages_1gi: FixturePool | None = None


class FixtureDisk(Struct):
    path: str
    total_bytes: int
    device: str | None = None


class FixtureHost(Struct):
    id: str
    hostname: str
    nvml: FixtureNvml
    cpu: FixtureCpu
    memory_total_bytes: int
    hugepages: FixtureHugepages
    disks: list[FixtureDisk] = []
    gpus: list[FixtureGpu] = []
    machine_id: str | None = None
    numa_nodes: list[FixtureNumaNode] = []
    gpu_links: list[FixtureLink] = []


def load_host(source: Path | Mapping[str, Any], host_id: str | None = None) -> FixtureHost:
    """One recorded host: from the whole fixture file (pick ``host_id``) or one host object."""
    data: Any = source
    if isinstance(source, Path):
        try:
            data = msgspec.json.decode(source.read_bytes())
        except (OSError, msgspec.DecodeError) as exc:
            raise FixtureError(f"cannot read fixture {source}: {exc}") from exc
    if not isinstance(data, Mapping):
        raise FixtureError("a fixture is a JSON object: the whole file or one host")
    if "hosts" in data:
        hosts = [h for h in data["hosts"] if isinstance(h, Mapping)]
        ids = [str(h.get("id")) for h in hosts]
        if host_id is None and len(hosts) != 1:
            raise FixtureError(f"the fixture holds several hosts; pick one of {ids}")
        matches = [h for h in hosts if host_id is None or h.get("id") == host_id]
        if not matches:
            raise FixtureError(f"no host {host_id!r} in the fixture; it has {ids}")
        data = matches[0]
    elif host_id is not None and data.get("id") != host_id:
        raise FixtureError(f"the fixture is host {data.get('id')!r}, not {host_id!r}")
    try:
        host = msgspec.convert(data, FixtureHost)
    except msgspec.ValidationError as exc:
        raise FixtureError(f"fixture host {data.get('id')!r}: {exc}") from exc
    if [g.index for g in host.gpus] != list(range(len(host.gpus))):
        raise FixtureError(f"fixture host {host.id!r}: GPU indices must be 0…n-1 in order")
    if any(not 0 <= link.a < link.b < len(host.gpus) for link in host.gpu_links):
        raise FixtureError(f"fixture host {host.id!r}: a GPU link is not a pair of its GPUs, a < b")
    return host


def host_facts(host: FixtureHost) -> HostFacts:
    """The recorded host's CPU (with its NUMA nodes and cores, D1), memory, huge page, disk
    and identity facts."""
    pages = host.hugepages
    return HostFacts(
        machine_id=host.machine_id or f"fixture-{host.id}",
        hostname=host.hostname,
        cpu=Cpu(
            sockets=host.cpu.sockets,
            logical_cpus=host.cpu.logical_cpus,
            physical_cores=host.cpu.physical_cores,
            model=host.cpu.model,
            vendor=host.cpu.vendor,
            numa_nodes=[
                NumaNode(id=n.id, cpus=n.cpus, memory_bytes=n.memory_total_bytes)
                for n in host.numa_nodes
            ],
            thread_siblings=list(host.cpu.thread_siblings),
        ),
        memory_total_bytes=host.memory_total_bytes,
        hugepages=Hugepages(pages_2mi=_pool(pages.pages_2mi), pages_1gi=_pool(pages.pages_1gi)),
        filesystems=[
            Filesystem(path=d.path, total_bytes=d.total_bytes, device=d.device) for d in host.disks
        ],
    )


def _pool(pool: FixturePool | None) -> HugepagePool | None:
    return HugepagePool(total=pool.total, free=pool.free) if pool is not None else None
