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

from shared.inventory import (
    Gpu,
    Inventory,
    Nvml,
)
from shared.mig import profiles_for

# --- the recorded hosts ------------------------------------------------------------

# The recorded hosts (agent/fixtures/host-fixtures.json) as their agents report them,
# taken once by the agent's own inventory code through the fake NVML and kept as package
# data, so the renderer needs no second reading of the fixture format. Regenerate with
# `python -m tests.test_render`; a test checks it still equals what the agent reports.
RECORDED_HOSTS = "recorded-hosts.json"


@functools.cache
def recorded_hosts() -> tuple[Inventory, ...]:
    data = resources.files("shared.render").joinpath(RECORDED_HOSTS).read_bytes()
    return tuple(msgspec.json.decode(data, type=list[Inventory]))


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
    hosts = list(recorded_hosts())
    template = next(inv for inv in hosts if inv.hostname == TEMPLATE_HOST)
    if gpu_model is None:
        return [inv for inv in hosts if not inv.gpus] + [_large_cpu_host(template)]
    matching = [inv for inv in hosts if any(g.family == gpu_model for g in inv.gpus)]
    if matching:
        return matching + [_synthetic(gpu_model, template, m) for m in VARIANTS.get(gpu_model, ())]
    return [_synthetic(gpu_model, template)]
