"""Host units: huge pages, kernel modules, the CPU governor, and the kernel command line.

Everything the boot loader must carry (1 GiB huge pages, isolated CPUs, the
IOMMU) is gathered into one ``kernel-args`` unit: a host has one command line
and the agent writes it as one boot loader drop-in, so per-field units would
overwrite each other.
"""

import math
import re
from collections.abc import Sequence
from typing import Literal

from msgspec import UNSET

from shared.inventory import Inventory
from shared.nodespec import RenderRefused, Unit
from shared.policy.model import Policy, cpu_ranges
from shared.render.text import HEADER, file_unit, service_unit, systemd_unit

GiB = 2**30
PAGE_2MI = 2 * 2**20
PAGE_1GI = GiB
# Whatever hostReserve says, the kernel, systemd, the agent and sshd keep this much
# memory outside huge pages: pages are taken from the kernel's free memory for good,
# and a host with none left is an out-of-memory host that no one can log into.
MIN_HOST_MEMORY = 1 * GiB

HUGEPAGES_CONF = "/etc/sysctl.d/90-better-compute-hugepages.conf"
MODULES_LOAD_CONF = "/etc/modules-load.d/better-compute.conf"
MODPROBE_CONF = "/etc/modprobe.d/better-compute.conf"
GOVERNOR_SERVICE = "better-compute-cpu-governor.service"
GOVERNOR_UNIT_FILE = f"/etc/systemd/system/{GOVERNOR_SERVICE}"

Vendor = Literal["intel", "amd"]


# --- huge pages ------------------------------------------------------------------


def check_hugepages(policy: Policy, inventory: Inventory, *, host_size_checks: bool) -> None:
    """Refuse pages the host cannot offer or hold beside its reserve (never an OOM host)."""
    pages = policy.hugepages
    if pages is UNSET:
        return
    if pages.pages_1gi and inventory.hugepages.pages_1gi is None:
        # sysfs has no hugepages-1048576kB: the CPU lacks pdpe1gb (common on VMs).
        raise RenderRefused(
            "hugepages.1Gi", "this host offers no 1 GiB pages (its CPU lacks pdpe1gb)"
        )
    if pages.pages_2mi and inventory.hugepages.pages_2mi is None:
        raise RenderRefused("hugepages.2Mi", "this host offers no 2 MiB pages")
    wanted = pages.pages_2mi * PAGE_2MI + pages.pages_1gi * PAGE_1GI
    if not host_size_checks or not wanted:
        return
    reserve_gib = policy.hostReserve.memoryGiB if policy.hostReserve is not UNSET else 0
    kept = max(math.ceil(reserve_gib * GiB), MIN_HOST_MEMORY)
    room = inventory.memory_total_bytes - kept
    if wanted > room:
        raise RenderRefused(
            "hugepages",
            f"{_gib(wanted)} GiB of huge pages do not fit: "
            f"{_gib(inventory.memory_total_bytes)} GiB of memory less {_gib(kept)} GiB "
            f"kept for the host leaves {_gib(max(room, 0))} GiB",
        )


def _gib(size: int) -> str:
    return f"{size / GiB:.1f}"


def hugepages_units(policy: Policy) -> list[Unit]:
    """2 MiB pages are set at runtime by sysctl, and kept across boots by its drop-in."""
    pages = policy.hugepages
    if pages is UNSET or not pages.pages_2mi:
        return []
    count = pages.pages_2mi
    return [
        file_unit(
            "hugepages/sysctl-file",
            HUGEPAGES_CONF,
            f"# {HEADER}\nvm.nr_hugepages = {count}\n",
        ),
        Unit(id="hugepages/sysctl", kind="sysctl", content=f"vm.nr_hugepages={count}"),
    ]


def hugepages_args(policy: Policy) -> list[str]:
    """1 GiB pages must be reserved at boot, before memory fragments."""
    pages = policy.hugepages
    if pages is UNSET or not pages.pages_1gi:
        return []
    # The default page size stays 2 MiB: vm.nr_hugepages sizes the default pool, and a
    # later policy adding 2 MiB pages must not reserve that many 1 GiB pages instead.
    return ["hugepagesz=1G", f"hugepages={pages.pages_1gi}"]


# --- kernel modules --------------------------------------------------------------


def kernel_module_units(policy: Policy) -> list[Unit]:
    """modprobe.d first, so that a module loaded below already gets its options."""
    modules = policy.kernelModules
    if modules is UNSET:
        return []
    units = []
    load = list(dict.fromkeys(modules.load))  # order is load order; duplicates once
    blacklist = sorted(set(modules.blacklist))
    if blacklist or modules.options:
        lines = [f"blacklist {name}\n" for name in blacklist]
        lines += [f"options {name} {modules.options[name]}\n" for name in sorted(modules.options)]
        # A blacklisted module that is loaded stays loaded, and a loaded module keeps
        # its old options: both take effect at the next boot.
        units.append(
            file_unit(
                "kernel-modules/modprobe-file",
                MODPROBE_CONF,
                f"# {HEADER}\n" + "".join(lines),
                needs="reboot",
            )
        )
    if load:
        units.append(
            file_unit(
                "kernel-modules/load-file",
                MODULES_LOAD_CONF,
                f"# {HEADER}\n" + "".join(f"{name}\n" for name in load),
            )
        )
        units += [
            Unit(id=f"kernel-modules/load/{name}", kind="module", content=name) for name in load
        ]
    return units


# --- CPU -------------------------------------------------------------------------


def governor_units(policy: Policy) -> list[Unit]:
    """A oneshot service sets the governor at every boot; restarting it sets a new one now."""
    cpu = policy.cpu
    if cpu is UNSET or cpu.governor is UNSET:
        return []
    governor = cpu.governor
    # `$$` is a literal `$` for systemd. VMs often have no cpufreq: the condition
    # skips the unit there instead of failing it.
    script = (
        "for g in /sys/devices/system/cpu/cpu*/cpufreq/scaling_governor; "
        f'do echo {governor} > "$$g"; done'
    )
    text = systemd_unit(
        {
            "Unit": [
                ("Description", f"Better Compute: CPU frequency governor {governor}"),
                ("ConditionPathExists", "/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"),
            ],
            "Service": [
                ("Type", "oneshot"),
                ("RemainAfterExit", "yes"),
                ("ExecStart", f"/bin/sh -c '{script}'"),
            ],
            "Install": [("WantedBy", "multi-user.target")],
        }
    )
    return [
        file_unit("cpu/governor-unit-file", GOVERNOR_UNIT_FILE, text, restarts=[GOVERNOR_SERVICE]),
        service_unit("cpu/governor-service", GOVERNOR_SERVICE),
    ]


def isolation_args(
    policy: Policy, inventory: Inventory, *, host_size_checks: bool = True
) -> list[str]:
    """Isolated CPUs leave the scheduler, the timer tick and RCU callbacks to the others."""
    cpu = policy.cpu
    if cpu is UNSET or cpu.isolate is UNSET:
        return []
    spec = cpu.isolate
    count = inventory.cpu.logical_cpus
    isolated: set[int] = set()
    for low, high in cpu_ranges(spec):
        if low > high:
            raise RenderRefused("cpu.isolate", f"the range {low}-{high} runs backwards")
        if host_size_checks and high >= count:
            raise RenderRefused(
                "cpu.isolate",
                f"this host has CPUs 0-{count - 1}; it cannot isolate CPU {high}",
            )
        isolated.update(range(low, high + 1))
    if host_size_checks and len(isolated) >= count:
        raise RenderRefused(
            "cpu.isolate",
            "isolating every CPU leaves none to run the host",
        )
    return [f"isolcpus={spec}", f"nohz_full={spec}", f"rcu_nocbs={spec}"]


# --- IOMMU -----------------------------------------------------------------------


def cpu_vendor(inventory: Inventory) -> Vendor | None:
    """The CPU vendor from cpuinfo's vendor_id, else from the model name's maker."""
    vendor = (inventory.cpu.vendor or "").strip()
    if vendor == "GenuineIntel":
        return "intel"
    if vendor == "AuthenticAMD":
        return "amd"
    if vendor:
        return None  # a vendor we know nothing of (HygonGenuine, an ARM implementer…)
    # Recorded hosts and older agents give no vendor_id, but a model name such as
    # "Intel(R) Xeon(R) …" or "AMD EPYC …" names its maker just as surely.
    model = inventory.cpu.model or ""
    if re.match(r"^Intel\b", model):
        return "intel"
    if re.match(r"^AMD\b", model):
        return "amd"
    return None


def iommu_args(policy: Policy, inventory: Inventory) -> list[str]:
    """The vendor's IOMMU switch; passthrough adds iommu=pt so host DMA skips translation."""
    iommu = policy.iommu
    if iommu is UNSET:
        return []
    vendor = cpu_vendor(inventory)
    if vendor is None:
        seen = inventory.cpu.vendor or inventory.cpu.model or "unknown"
        raise RenderRefused(
            "iommu.mode",
            f"the IOMMU switch of this host's CPU ({seen}) is unknown: "
            "only Intel (intel_iommu) and AMD (amd_iommu) CPUs are supported",
        )
    switch = f"{vendor}_iommu"
    if iommu.mode == "off":
        return [f"{switch}=off"]
    # The AMD driver is on by default when the firmware exposes the IOMMU; `amd_iommu=on`
    # states the intent on the command line and only `off` changes its behaviour.
    args = [f"{switch}=on"]
    if iommu.mode == "passthrough":
        args.append("iommu=pt")
    return args


def kernel_args_units(args: Sequence[str]) -> list[Unit]:
    if not args:
        return []
    return [Unit(id="kernel/cmdline", kind="kernel-args", content=" ".join(args), needs="reboot")]
