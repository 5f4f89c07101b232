"""Host facts outside NVML: CPUs, memory, huge pages, filesystems, identity.

psutil for what it does well (CPU counts, MemTotal, mounts); files under
``sysfs_root`` for the rest, so tests point it at a temporary tree instead of
patching the machine. Every read tolerates absence: a container without
``/sys/devices/system/cpu`` still yields an inventory.
"""

import hashlib
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import psutil  # type: ignore[import-untyped]  # no types-psutil in the dev deps

from shared import cpulist
from shared.inventory import Cpu, Filesystem, HugepagePool, Hugepages, NumaNode

# Filesystems that hold no tenant-usable disk even when psutil lists them
# (psutil's all=False already drops "nodev" types such as tmpfs and overlay).
_PSEUDO_FS: Final = frozenset(
    {
        "squashfs",  # snaps and read-only images
        "iso9660",
        "udf",
        "erofs",
        "tmpfs",
        "devtmpfs",
        "overlay",
        "proc",
        "sysfs",
        "cgroup",
        "cgroup2",
        "autofs",
        "fuse.lxcfs",
        "nsfs",
    }
)
_MAX_FILESYSTEMS: Final = 256  # the inventory's limit
_MAX_TEXT: Final = 256


@dataclass(frozen=True, slots=True)
class HostFacts:
    """Everything in an inventory but the GPUs: from this machine or from a fixture."""

    machine_id: str
    hostname: str
    cpu: Cpu
    memory_total_bytes: int
    hugepages: Hugepages
    filesystems: list[Filesystem] = field(default_factory=list)


def collect_host(sysfs_root: Path = Path("/")) -> HostFacts:
    """This machine's facts; ``sysfs_root`` stands for ``/`` when reading /sys, /proc and /etc."""
    hostname = socket.gethostname() or "localhost"
    return HostFacts(
        machine_id=machine_id(sysfs_root, hostname),
        hostname=hostname,
        cpu=cpu(sysfs_root),
        memory_total_bytes=int(psutil.virtual_memory().total),
        hugepages=hugepages(sysfs_root),
        filesystems=filesystems(),
    )


def cpu(root: Path) -> Cpu:
    """Logical CPUs and cores (psutil), sockets, NUMA nodes and cores' threads (sysfs, D1),
    model and vendor (cpuinfo)."""
    info = _cpuinfo(root)
    sockets = _sockets(root) or len({v for k, v in info if k == "physical id"}) or 1
    model = next((v for k, v in info if k == "model name"), None)
    vendor = next((v for k, v in info if k == "vendor_id"), None)
    return Cpu(
        sockets=sockets,
        logical_cpus=int(psutil.cpu_count(logical=True) or os.cpu_count() or 1),
        physical_cores=_int_or_none(psutil.cpu_count(logical=False)),
        model=model[:_MAX_TEXT] if model else None,
        vendor=vendor[:_MAX_TEXT] if vendor else None,
        numa_nodes=numa_nodes(root),
        thread_siblings=thread_siblings(root),
    )


def numa_nodes(root: Path) -> list[NumaNode]:
    """D1: each /sys/devices/system/node/node<id>: its cpulist and MemTotal, by id; [] without."""
    found: list[NumaNode] = []
    for directory in (root / "sys/devices/system/node").glob("node[0-9]*"):
        suffix = directory.name.removeprefix("node")
        cpus = read_cpulist(directory / "cpulist")
        if not suffix.isdigit() or cpus is None:
            continue
        found.append(
            NumaNode(id=int(suffix), cpus=cpus, memory_bytes=_node_memory(directory / "meminfo"))
        )
    return sorted(found, key=lambda node: node.id)


def _node_memory(path: Path) -> int:
    """A node's MemTotal in bytes ("Node 0 MemTotal:  1056776704 kB"); 0 when it has none."""
    for line in (_read(path) or "").splitlines():
        _, found, rest = line.partition("MemTotal:")
        fields = rest.split()
        if found and fields and fields[0].isdigit():
            return int(fields[0]) * 1024
    return 0


def thread_siblings(root: Path) -> list[str]:
    """D1: one cpulist per physical core, the distinct thread_siblings_list values of
    /sys/devices/system/cpu/cpu*/topology, ordered by first CPU; [] without."""
    cores: set[str] = set()
    for path in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/topology/thread_siblings_list"):
        siblings = read_cpulist(path)
        if siblings:
            cores.add(siblings)
    return sorted(cores, key=lambda core: cpulist.parse(core)[0])


def read_cpulist(path: Path) -> str | None:
    """A sysfs cpulist file in canonical form; None when unreadable or not a cpulist."""
    value = _read(path)
    if value is None:
        return None
    try:
        return cpulist.format(cpulist.parse(value))
    except ValueError:
        return None


def _sockets(root: Path) -> int:
    """Distinct physical packages in /sys/devices/system/cpu/cpu*/topology; 0 if unreadable."""
    packages: set[str] = set()
    for path in (root / "sys/devices/system/cpu").glob("cpu[0-9]*/topology/physical_package_id"):
        value = _read(path)
        if value is not None:
            packages.add(value)
    return len(packages)


def _cpuinfo(root: Path) -> list[tuple[str, str]]:
    """The ``key: value`` lines of /proc/cpuinfo (every processor's), in order."""
    content = _read(root / "proc/cpuinfo") or ""
    pairs = []
    for line in content.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            pairs.append((key.strip(), value.strip()))
    return pairs


def hugepages(root: Path) -> Hugepages:
    """Configured and free pages of each size; None for a size the kernel does not offer."""
    base = root / "sys/kernel/mm/hugepages"
    return Hugepages(
        pages_2mi=_hugepage_pool(base / "hugepages-2048kB"),
        pages_1gi=_hugepage_pool(base / "hugepages-1048576kB"),
    )


def _hugepage_pool(directory: Path) -> HugepagePool | None:
    """One size's pool; None when the directory (the size) is absent."""
    total = read_int(directory / "nr_hugepages")
    free = read_int(directory / "free_hugepages")
    if total is None:
        return None
    return HugepagePool(total=total, free=free if free is not None else 0)


def filesystems() -> list[Filesystem]:
    """Mounted block-device filesystems with their sizes, one per device.

    Bind mounts show a device several times; the shortest mount path names it
    (``/`` rather than ``/var/lib/kubelet/…``).
    """
    seen: set[str] = set()
    found: list[Filesystem] = []
    partitions = sorted(psutil.disk_partitions(all=False), key=lambda p: len(p.mountpoint))
    for part in partitions:
        path, device, fstype = str(part.mountpoint), str(part.device), str(part.fstype)
        if fstype in _PSEUDO_FS or device in seen or len(path) > _MAX_TEXT:
            continue
        try:
            total = int(psutil.disk_usage(path).total)
        except OSError:  # unmounted meanwhile, or not ours to stat
            continue
        seen.add(device)
        found.append(Filesystem(path=path, total_bytes=total, device=device[:_MAX_TEXT]))
    return found[:_MAX_FILESYSTEMS]


def machine_id(root: Path, hostname: str) -> str:
    """systemd's /etc/machine-id, or a stable hash of the hostname where there is none."""
    value = _read(root / "etc/machine-id")
    if value:
        return value[:128]
    return "host-" + hashlib.sha256(hostname.encode()).hexdigest()[:32]


def boot_id(root: Path) -> str | None:
    """The kernel's boot id (a new one each boot): what GPU health verdicts are kept for."""
    return _read(root / "proc/sys/kernel/random/boot_id") or None


def _int_or_none(value: object) -> int | None:
    """psutil's count, or None where it cannot tell (it answers None, untyped here)."""
    return int(value) if isinstance(value, int) else None


def _read(path: Path) -> str | None:
    """A small file's stripped text, or None when it cannot be read."""
    try:
        return path.read_text(errors="replace").strip()
    except OSError:
        return None


def read_int(path: Path) -> int | None:
    """A file holding one integer, or None."""
    value = _read(path)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None
