"""The host inventory an agent reports: what the control plane turns into capacity.

Built by the agent from NVML (GPUs, MIG instances) and psutil/sysfs (CPUs,
memory, huge pages, filesystems), sent on join and on every report. Sizes are
bytes, power is watts, and a fact the host could not give is null.
"""

import hashlib
from typing import Annotated, Literal

import msgspec
from msgspec import Meta, Struct

from shared.validation import whole

Count = Annotated[int, Meta(ge=0)]
Text = Annotated[str, Meta(max_length=256)]
# A Linux cpulist ("0-55,112-167"), as sysfs and NVML's CPU affinity give it (shared/cpulist.py):
# numbers below 10,000, so no list a host sends stands for more CPUs than a host has.
CpuList = Annotated[
    str,
    Meta(
        max_length=8192, pattern=whole(r"^([0-9]{1,4}(-[0-9]{1,4})?(,[0-9]{1,4}(-[0-9]{1,4})?)*)?$")
    ),
]
LinkLevel = Literal["internal", "single", "multiple", "hostbridge", "node", "system"]


class Wire(Struct, rename="camel", forbid_unknown_fields=True, kw_only=True):
    """Inventory parts: camelCase on the wire, unknown fields refused."""


class MigInstance(Wire):
    uuid: Text
    profile: Text  # e.g. "1g.10gb", the text after " MIG " in the MIG device's NVML name
    gpu_instance_id: Count
    compute_instance_id: Count
    memory_bytes: Count | None = None


class Gpu(Wire):
    index: Count
    uuid: Text
    name: Text  # nvmlDeviceGetName(), exactly
    family: Text | None  # derived from the name (shared.gpu.family_of); None: not a pool member
    memory_bytes: Count
    serial: Text | None = None
    pci_bus_id: Text | None = None  # "00000000:18:00.0"
    pci_device_id: Count | None = None  # (device << 16) | 0x10DE
    compute_capability: Text | None = None  # "9.0"
    mig_supported: bool = False
    mig_current: bool = False
    mig_pending: bool = False
    mig_instances: list[MigInstance] = []
    persistence_mode: bool | None = None
    power_limit_w: Annotated[float, Meta(ge=0)] | None = None  # the limit in force now
    power_limit_min_w: Annotated[float, Meta(ge=0)] | None = None  # what the board allows
    power_limit_max_w: Annotated[float, Meta(ge=0)] | None = None
    ecc_current: bool | None = None
    ecc_pending: bool | None = None
    ecc_uncorrected_volatile: Count | None = None  # a health signal: non-zero means trouble
    temperature_c: int | None = None
    # H5 (reference/gpu-health.md §4): the agent's verdict from NVML's signals; unhealthy wins
    # over unknown, unknown over healthy. Reasons such as "xid:79", "row_remap_pending",
    # "ecc_uncorrected_volatile:2", "gpu_lost", "retired_pages_pending", "unknown:<signal>".
    health: Literal["healthy", "unhealthy", "unknown"] = "healthy"
    health_reasons: Annotated[list[Text], Meta(max_length=32)] = []
    # D1: where the GPU sits. minorNumber is N of /dev/nvidiaN (may differ from the index);
    # numaNode is null when unknown (the platform says -1); cpuAffinity its ideal CPUs.
    minor_number: Count | None = None
    numa_node: Count | None = None
    cpu_affinity: CpuList | None = None


class GpuLink(Wire):
    """D1: how two GPUs (by index, a < b) reach each other: the PCIe common ancestor's level
    (nvidia-smi topo PIX=single, PXB=multiple, PHB=hostbridge, NODE=node, SYS=system) and
    whether NVLink (direct or through NVSwitch) joins them."""

    a: Count
    b: Count
    level: LinkLevel
    nvlink: bool


class NumaNode(Wire):
    id: Count
    cpus: CpuList
    memory_bytes: Count


class Nvml(Wire):
    available: bool
    error: Text | None = None  # e.g. "NVMLError_LibraryNotFound" when there is no driver
    driver_version: Text | None = None
    nvml_version: Text | None = None
    cuda_driver_version: Text | None = None  # "12.4"


class Cpu(Wire):
    sockets: Count
    logical_cpus: Count
    physical_cores: Count | None = None
    model: Text | None = None
    vendor: Text | None = None  # "GenuineIntel", "AuthenticAMD", …
    # D1: /sys/devices/system/node/node<id> (cpulist, MemTotal) and one cpulist per physical
    # core (the distinct thread_siblings_list values, by first CPU).
    numa_nodes: Annotated[list[NumaNode], Meta(max_length=1024)] = []
    thread_siblings: Annotated[list[CpuList], Meta(max_length=8192)] = []


class HugepagePool(Wire):
    total: Count  # configured pages
    free: Count


class Hugepages(Wire, rename={"pages_2mi": "2Mi", "pages_1gi": "1Gi"}):
    pages_2mi: HugepagePool | None = None  # None: the size is not available on this host
    pages_1gi: HugepagePool | None = None


class Filesystem(Wire):
    path: Text
    total_bytes: Count
    device: Text | None = None


class Inventory(Wire):
    machine_id: Annotated[str, Meta(min_length=1, max_length=128)]
    hostname: Annotated[str, Meta(min_length=1, max_length=253)]
    cpu: Cpu
    memory_total_bytes: Count  # MemTotal (psutil.virtual_memory().total)
    hugepages: Hugepages
    nvml: Nvml
    filesystems: Annotated[list[Filesystem], Meta(max_length=256)] = []
    gpus: Annotated[list[Gpu], Meta(max_length=64)] = []
    gpu_links: Annotated[list[GpuLink], Meta(max_length=2016)] = []  # D1: every GPU pair


def _settled_pages(pool: HugepagePool | None) -> HugepagePool | None:
    return None if pool is None else msgspec.structs.replace(pool, free=0)


def settled(inventory: Inventory) -> Inventory:
    """What capacity, identity and health depend on: the inventory without its temperatures
    and free huge pages, which move all the time. The agent sends an inventory whole only
    when this view of it moved (F9); the control plane digests this view."""
    gpus = [msgspec.structs.replace(gpu, temperature_c=None) for gpu in inventory.gpus]
    pages = msgspec.structs.replace(
        inventory.hugepages,
        pages_2mi=_settled_pages(inventory.hugepages.pages_2mi),
        pages_1gi=_settled_pages(inventory.hugepages.pages_1gi),
    )
    return msgspec.structs.replace(inventory, gpus=gpus, hugepages=pages)


def stable_digest(inventory: Inventory) -> str:
    """The digest of the settled inventory: counting temperatures as a changed inventory
    would make every report a write."""
    return hashlib.sha256(msgspec.json.encode(settled(inventory))).hexdigest()
