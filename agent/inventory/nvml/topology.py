"""D1: where each GPU sits (minor number, NUMA node, CPU affinity) and how GPU pairs connect.

NVML answers first. Where the driver cannot say, the GPU's PCI device in sysfs
(``/sys/bus/pci/devices/<bdf>``) does, when the session has a sysfs root: a recorded
host has none, since this machine's sysfs is not the recorded one's. A fact neither
gives is None; a GPU pair whose calls fail is left out of the links. A lost GPU is
re-raised from the per-GPU facts (its caller reports it lost) and has no links.
"""

import math
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

import msgspec

from agent.inventory.host import read_cpulist, read_int
from agent.inventory.nvml.api import NvmlApi, log, optional
from shared import cpulist
from shared.inventory import Gpu, GpuLink, LinkLevel

_WORD_BITS: Final = 64  # nvmlDeviceGetCpuAffinity fills 64-bit words


def cpu_words(logical_cpus: int) -> int:
    """The ``cpuSetSize`` for nvmlDeviceGetCpuAffinity: enough 64-bit words for every CPU."""
    return max(1, math.ceil(logical_cpus / _WORD_BITS))


def placed(nvml: NvmlApi, gpu: Gpu, handle: object, words: int, sysfs_root: Path | None) -> Gpu:
    """The GPU with its minor number, NUMA node and CPU affinity (each None when unknown)."""
    device = _pci_device(sysfs_root, gpu.pci_bus_id)
    return msgspec.structs.replace(
        gpu,
        minor_number=optional(nvml, nvml.nvmlDeviceGetMinorNumber, handle),
        numa_node=_numa_node(nvml, handle, device),
        cpu_affinity=_cpu_affinity(nvml, handle, words, device),
    )


def links(nvml: NvmlApi, handles: Mapping[int, object]) -> list[GpuLink]:
    """Every pair a < b of the reachable GPUs (index → handle), in index order."""
    levels = _levels(nvml)
    found: list[GpuLink] = []
    indices = sorted(handles)
    for position, a in enumerate(indices):
        for b in indices[position + 1 :]:
            try:
                level = nvml.nvmlDeviceGetTopologyCommonAncestor(handles[a], handles[b])
                status = nvml.nvmlDeviceGetP2PStatus(
                    handles[a], handles[b], nvml.NVML_P2P_CAPS_INDEX_NVLINK
                )
            except nvml.NVMLError as exc:  # lost meanwhile, or the driver cannot say
                log().debug("nvml.link_unknown", a=a, b=b, error=type(exc).__name__)
                continue
            name = levels.get(level)
            if name is None:  # a level this agent does not know: not a guess
                log().debug("nvml.link_unknown", a=a, b=b, level=level)
                continue
            found.append(GpuLink(a=a, b=b, level=name, nvlink=status == nvml.NVML_P2P_STATUS_OK))
    return found


def _levels(nvml: NvmlApi) -> dict[int, LinkLevel]:
    """NVML_TOPOLOGY_* → the inventory's level (nvidia-smi topo: PIX, PXB, PHB, NODE, SYS)."""
    return {
        nvml.NVML_TOPOLOGY_INTERNAL: "internal",
        nvml.NVML_TOPOLOGY_SINGLE: "single",
        nvml.NVML_TOPOLOGY_MULTIPLE: "multiple",
        nvml.NVML_TOPOLOGY_HOSTBRIDGE: "hostbridge",
        nvml.NVML_TOPOLOGY_NODE: "node",
        nvml.NVML_TOPOLOGY_SYSTEM: "system",
    }


def _pci_device(sysfs_root: Path | None, bus_id: str | None) -> Path | None:
    """The GPU's sysfs directory: NVML's "00000000:18:00.0" as sysfs spells it, "0000:18:00.0"."""
    if sysfs_root is None or bus_id is None:
        return None
    domain, sep, rest = bus_id.partition(":")
    try:
        number = int(domain, 16)
    except ValueError:
        return None
    return sysfs_root / "sys/bus/pci/devices" / f"{number:04x}:{rest.lower()}" if sep else None


def _numa_node(nvml: NvmlApi, handle: object, device: Path | None) -> int | None:
    """nvmlDeviceGetNumaNodeId, else sysfs ``numa_node`` where the driver lacks it; -1 is None."""
    get: Callable[[object], int] | None = getattr(nvml, "nvmlDeviceGetNumaNodeId", None)
    if get is not None:
        try:
            return _known(get(handle))
        except nvml.NVMLError_GpuIsLost:
            raise
        except (nvml.NVMLError_FunctionNotFound, nvml.NVMLError_NotSupported):
            pass  # an older driver, or a platform NVML has no NUMA answer for: ask sysfs
        except nvml.NVMLError:
            return None
    return _known(read_int(device / "numa_node")) if device is not None else None


def _known(node: int | None) -> int | None:
    """A NUMA node id; None for the platform's -1 (unknown)."""
    return node if node is not None and node >= 0 else None


def _cpu_affinity(nvml: NvmlApi, handle: object, words: int, device: Path | None) -> str | None:
    """The GPU's ideal CPUs as a cpulist, from NVML's bitmask, else sysfs ``local_cpulist``."""
    mask = optional(nvml, nvml.nvmlDeviceGetCpuAffinity, handle, words)
    if mask is not None:
        # Bit (cpu % 64) of word (cpu // 64) is set for each CPU.
        cpus = [
            word_index * _WORD_BITS + bit
            for word_index, word in enumerate(mask)
            for bit in range(_WORD_BITS)
            if int(word) >> bit & 1
        ]
        if cpus:  # an empty mask says nothing: ask sysfs
            return cpulist.format(cpus)
    local = read_cpulist(device / "local_cpulist") if device is not None else None
    return local or None
