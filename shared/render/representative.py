"""Representative hosts of a pool's GPU model: what the API renders a policy against (P6).

A pool is validated "as nodes would get it" before any node exists, so the
control plane needs hosts to render for. Where a recorded host has the model
(agent/fixtures/host-fixtures.json, which ships in the ``agent`` package as
data), that host is it, read into the same ``Inventory`` an agent reports for
it. Other models get a synthetic 8-GPU host: the H100 host's CPUs, memory and
disks with that model's GPUs, named, sized and power-capped as the team's
reference lists them (nvml-names.md §1). No GPU model: the recorded CPU-only VPS.
"""

import functools
import hashlib
from dataclasses import dataclass
from importlib import resources

import msgspec
from msgspec import Struct

from shared.gpu import family_of
from shared.inventory import (
    Cpu,
    Filesystem,
    Gpu,
    HugepagePool,
    Hugepages,
    Inventory,
    MigInstance,
    Nvml,
)
from shared.mig import profiles_for

# --- the recorded hosts: only the fields an inventory reads -----------------------


class _Pci(Struct):
    busId: str
    pciDeviceId: str  # "0x233010DE"


class _MigInstance(Struct):
    nvml_name: str
    uuid: str
    gpu_instance_id: int
    compute_instance_id: int
    mig_device_index: int
    memory_total_bytes: int | None = None


class _Mig(Struct):
    supported: bool
    current_mode: int = 0
    pending_mode: int = 0
    instances: list[_MigInstance] = []


class _Gpu(Struct):
    index: int
    name: str
    uuid: str
    pci: _Pci
    memory_total_bytes: int
    mig: _Mig
    serial: str | None = None
    cuda_compute_capability: tuple[int, int] | None = None
    persistence_mode: int | None = None
    power_management_limit_mw: int | None = None
    temperature_gpu_c: int | None = None
    ecc_mode: tuple[int, int] | None = None
    ecc_uncorrected_volatile: int = 0


class _Nvml(Struct):
    available: bool
    init_exception: str | None = None
    driver_version: str | None = None
    nvml_version: str | None = None
    cuda_driver_version: int | None = None


class _Pool(Struct):
    total: int
    free: int


class _Hugepages(Struct, rename={"pages_2mi": "2Mi", "pages_1gi": "1Gi"}):
    pages_2mi: _Pool | None = None
    pages_1gi: _Pool | None = None


class _Disk(Struct):
    path: str
    total_bytes: int
    device: str | None = None


class _Cpu(Struct):
    sockets: int
    logical_cpus: int
    physical_cores: int | None = None
    model: str | None = None
    vendor: str | None = None


class _Host(Struct):
    id: str
    hostname: str
    nvml: _Nvml
    cpu: _Cpu
    memory_total_bytes: int
    hugepages: _Hugepages
    disks: list[_Disk] = []
    gpus: list[_Gpu] = []
    machine_id: str | None = None


class _Fixtures(Struct):
    hosts: list[_Host]


@functools.cache
def _recorded() -> tuple[_Host, ...]:
    """The recorded hosts, read once: the file is package data and never changes at runtime."""
    data = resources.files("agent").joinpath("fixtures/host-fixtures.json").read_bytes()
    return tuple(msgspec.json.decode(data, type=_Fixtures).hosts)


def _pool(pool: _Pool | None) -> HugepagePool | None:
    return HugepagePool(total=pool.total, free=pool.free) if pool is not None else None


def _mig_instance(instance: _MigInstance) -> MigInstance:
    return MigInstance(
        uuid=instance.uuid,
        profile=instance.nvml_name.partition(" MIG ")[2].strip(),
        gpu_instance_id=instance.gpu_instance_id,
        compute_instance_id=instance.compute_instance_id,
        memory_bytes=instance.memory_total_bytes,
    )


def _gpu(gpu: _Gpu) -> Gpu:
    """The GPU as the agent's NVML collector reports it (agent/inventory/nvml.py)."""
    device_id = int(gpu.pci.pciDeviceId, 16)
    ecc = gpu.ecc_mode
    mig_on = gpu.mig.supported and gpu.mig.current_mode == 1
    capability = gpu.cuda_compute_capability
    instances = sorted(gpu.mig.instances, key=lambda i: i.mig_device_index)
    return Gpu(
        index=gpu.index,
        uuid=gpu.uuid,
        name=gpu.name,
        family=family_of(gpu.name, device_id),
        memory_bytes=gpu.memory_total_bytes,
        serial=gpu.serial,
        pci_bus_id=gpu.pci.busId,
        pci_device_id=device_id,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        mig_supported=gpu.mig.supported,
        mig_current=mig_on,
        mig_pending=gpu.mig.supported and gpu.mig.pending_mode == 1,
        mig_instances=[_mig_instance(i) for i in instances] if mig_on else [],
        persistence_mode=None if gpu.persistence_mode is None else gpu.persistence_mode == 1,
        power_limit_w=(
            gpu.power_management_limit_mw / 1000
            if gpu.power_management_limit_mw is not None
            else None
        ),
        ecc_current=bool(ecc[0]) if ecc is not None else None,
        ecc_pending=bool(ecc[1]) if ecc is not None else None,
        ecc_uncorrected_volatile=gpu.ecc_uncorrected_volatile if ecc and ecc[0] else None,
        temperature_c=gpu.temperature_gpu_c,
    )


def _nvml(nvml: _Nvml) -> Nvml:
    if not nvml.available:
        return Nvml(available=False, error=nvml.init_exception or "NVMLError_LibraryNotFound")
    cuda = nvml.cuda_driver_version
    return Nvml(
        available=True,
        driver_version=nvml.driver_version,
        nvml_version=nvml.nvml_version,
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda is not None else None,
    )


def recorded_inventory(host: _Host) -> Inventory:
    """A recorded host as its agent reports it."""
    return Inventory(
        machine_id=host.machine_id or f"fixture-{host.id}",
        hostname=host.hostname,
        cpu=Cpu(
            sockets=host.cpu.sockets,
            logical_cpus=host.cpu.logical_cpus,
            physical_cores=host.cpu.physical_cores,
            model=host.cpu.model,
            vendor=host.cpu.vendor,
        ),
        memory_total_bytes=host.memory_total_bytes,
        hugepages=Hugepages(
            pages_2mi=_pool(host.hugepages.pages_2mi), pages_1gi=_pool(host.hugepages.pages_1gi)
        ),
        nvml=_nvml(host.nvml),
        filesystems=[
            Filesystem(path=d.path, total_bytes=d.total_bytes, device=d.device) for d in host.disks
        ],
        gpus=[_gpu(g) for g in host.gpus],
    )


# --- synthetic hosts ---------------------------------------------------------------


@dataclass(frozen=True)
class Model:
    """One GPU model as nvml-names.md §1 lists it; None where the table has no value."""

    name: str
    device_id: int | None
    mib: int | None
    capability: tuple[int, int] | None
    power_w: int | None


# Families with no recorded host. Where the table gives a range or two values, the
# higher one: a representative host must not refuse what a real one would take.
MODELS: dict[str, Model] = {
    "A800": Model("NVIDIA A800 80GB PCIe", 0x20F5, 81920, (8, 0), 300),
    "A30": Model("NVIDIA A30", 0x20B7, 24576, (8, 0), 165),
    "A40": Model("NVIDIA A40", 0x2235, 46068, (8, 6), 300),
    "A10": Model("NVIDIA A10", 0x2236, 23028, (8, 6), 150),
    "A10G": Model("NVIDIA A10G", 0x2237, 23028, (8, 6), 300),
    "T4": Model("Tesla T4", 0x1EB8, 15360, (7, 5), 70),
    "V100": Model("Tesla V100-SXM2-16GB", 0x1DB1, 16384, (7, 0), 300),
    "V100S": Model("Tesla V100S-PCIE-32GB", None, None, (7, 0), 250),
    "H800": Model("NVIDIA H800", 0x2324, None, (9, 0), None),
    "H20": Model("NVIDIA H20", 0x2329, 97871, (9, 0), 500),
    "GH200": Model("NVIDIA GH200 480GB", 0x2342, 97871, (9, 0), 900),
    "B100": Model("NVIDIA B100", None, None, (10, 0), None),
    "B200": Model("NVIDIA B200", 0x2901, 183359, (10, 0), 1000),
    "GB200": Model("NVIDIA GB200", 0x2941, 189471, (10, 0), 1200),
    "B300": Model("NVIDIA B300 SXM6 AC", 0x3182, None, (10, 3), None),
    "GB300": Model("NVIDIA GB300", 0x31C2, None, (10, 3), None),
    "L40": Model("NVIDIA L40", 0x26B5, 46068, (8, 9), 300),
    "L4": Model("NVIDIA L4", 0x27B8, 23034, (8, 9), 72),
    "L20": Model("NVIDIA L20", 0x26BA, None, (8, 9), None),
    "RTX-4090-D": Model("NVIDIA GeForce RTX 4090 D", 0x2685, None, (8, 9), None),
    "RTX-6000-ADA": Model("NVIDIA RTX 6000 Ada Generation", 0x26B1, 49140, (8, 9), 300),
    "RTX-A6000": Model("NVIDIA RTX A6000", 0x2230, None, (8, 6), 300),
    "QUADRO-RTX-6000": Model("Quadro RTX 6000", None, None, (7, 5), None),
    "RTX-PRO-6000-BLACKWELL": Model(
        "NVIDIA RTX PRO 6000 Blackwell Server Edition", 0x2BB5, 97887, (12, 0), 600
    ),
}

# Other memory variants of families that have a recorded host: a pool of the family may
# hold them, so a policy only they can take (their MIG profile names) is not refused.
VARIANTS: dict[str, tuple[Model, ...]] = {
    "A100": (Model("NVIDIA A100-SXM4-40GB", 0x20B0, 40960, (8, 0), 400),),
    "H100": (
        Model("NVIDIA H100 NVL", 0x2321, 95830, (9, 0), 400),
        Model("NVIDIA H100", 0x2339, 97871, (9, 0), 700),
    ),
}

TEMPLATE_HOST = "dgx-h100-01"  # the CPUs, memory, disks and PCI slots of synthetic hosts
SYNTHETIC_GPUS = 8


def _synthetic_uuid(family: str, index: int) -> str:
    digest = hashlib.sha256(f"better-compute synthetic {family} {index}".encode()).hexdigest()
    return f"GPU-{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def _synthetic(family: str, template: Inventory, variant: Model | None = None) -> Inventory:
    """An 8-GPU host of a model no recorded host has; an unknown model's facts stay unknown."""
    model = variant or MODELS.get(family, Model(f"NVIDIA {family}", None, None, None, None))
    mig_capable = bool(profiles_for(family))
    gpus = []
    for index, slot in enumerate(template.gpus[:SYNTHETIC_GPUS]):
        gpus.append(
            Gpu(
                index=index,
                uuid=_synthetic_uuid(family, index),
                name=model.name,
                family=family,
                memory_bytes=(model.mib or 0) * 2**20,  # 0: unknown, as NVML reports it
                pci_bus_id=slot.pci_bus_id,
                pci_device_id=(model.device_id << 16) | 0x10DE if model.device_id else None,
                compute_capability=(
                    f"{model.capability[0]}.{model.capability[1]}" if model.capability else None
                ),
                mig_supported=mig_capable,
                persistence_mode=True,
                power_limit_w=float(model.power_w) if model.power_w is not None else None,
            )
        )
    name = f"synthetic-{family.lower()}" + (f"-{model.mib}mib" if variant else "")
    return msgspec.structs.replace(template, machine_id=name, hostname=name, gpus=gpus)


def _large_cpu_host(template: Inventory) -> Inventory:
    """A two-socket host without GPUs (the template's CPUs, memory and 1 GiB page support)."""
    name = "synthetic-cpu-host"
    nvml = Nvml(available=False, error="NVMLError_LibraryNotFound")
    return msgspec.structs.replace(template, machine_id=name, hostname=name, gpus=[], nvml=nvml)


def representative_inventories(gpu_model: str | None) -> list[Inventory]:
    """Hosts a pool of ``gpu_model`` would hold, to render its policy for before any joins.

    The recorded hosts whose GPUs are of that family (compared exactly, N1) and synthetic
    hosts of its other memory variants, else one synthetic 8-GPU host; for no model, the
    recorded hosts without GPUs and a large CPU host. A policy is refused at the API only
    when none of them can take it; a node that cannot is quarantined when it joins.
    """
    hosts = [recorded_inventory(host) for host in _recorded()]
    template = next(inv for inv in hosts if inv.hostname == TEMPLATE_HOST)
    if gpu_model is None:
        return [inv for inv in hosts if not inv.gpus] + [_large_cpu_host(template)]
    matching = [inv for inv in hosts if any(g.family == gpu_model for g in inv.gpus)]
    if matching:
        return matching + [_synthetic(gpu_model, template, m) for m in VARIANTS.get(gpu_model, ())]
    return [_synthetic(gpu_model, template)]
