"""What the agent trusts (F3): a control plane over TLS or on loopback, and of a NodeSpec only
the files and commands its own renderer and deliveries produce.

A lying or broken control plane must not make a root shell of the agent. Every file a NodeSpec
names (its file units, the kernel arguments' boot loader drop-in, its bookings' slices and
environment files) must resolve, after ``..`` and symlinks, inside the apply root under one of
``WRITE_DIRS``; every command its units and bookings run must have one of the shapes of
``COMMANDS`` (kernel arguments, sysctl keys and service names are held to the renderer's own).
These lists are what shared/render and agent/delivery.py produce, checked against every render
by tests/test_agent_trust.py. ``check_spec`` raises ``Untrusted`` for a spec that asks for
anything else, so that none of it is applied.

Paths and command shapes alone would still let a lying control plane write any service unit
into /etc/systemd/system (and enable it) or an ``install`` line into modprobe.d. So
``check_rendered`` renders the NodeSpec again from what it carries (the pool's policy, sharing
mode and GPU model, the GPUs it holds back) with the agent's own renderer, on this host's
inventory, and refuses every unit that is not exactly one of that render's (its content, path,
mode, commands); the GPUs a drain-gated unit lists follow bookings and are not compared.

The state directories are the agent's own: no spec writes there. The root applier's systemd
unit (better-compute-agent-apply.service, the only one that writes the host) is confined to
``WRITE_DIRS``, ``APPLIER_STATE_DIR`` and what the commands themselves write
(``COMMAND_WRITES``, ``COMMAND_WRITES_IF_PRESENT``); tests/test_systemd_hardening.py compares
its ``ReadWritePaths=`` with them. The network process writes only ``STATE_DIR``.
"""

import ipaddress
import os
import re
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import msgspec

from agent.apply import BOOT_DROP_IN, unit_commands
from agent.delivery import RELOAD, RESERVATION_ID, paths_of, slice_name
from shared.errors import InvalidInput
from shared.gpu import with_families
from shared.ids import ID_BODY
from shared.inventory import Inventory
from shared.nodespec import Booking, NodeSpecUnits, RenderRefused, Unit
from shared.policy import parse_policy
from shared.render import render

# The directories NodeSpec files are written under (host paths).
WRITE_DIRS = (
    "/etc/modprobe.d",  # kernelModules: blacklist and options
    "/etc/modules-load.d",  # kernelModules.load, the kubelet's modules
    "/etc/sysctl.d",  # 2 MiB huge pages, the kubelet's sysctls
    "/etc/default/grub.d",  # the kernel command line (huge pages, isolcpus, IOMMU)
    "/etc/systemd/system",  # the CPU governor's and the MPS control daemon's units
    "/etc/nvidia-device-plugin",  # the device plugin's sharing config
    "/etc/nvidia-mig-manager",  # migLayout for nvidia-mig-parted
    "/etc/kubernetes",  # the kubeadm join configuration
    "/run/systemd/system",  # bookings' slices (D5)
    "/run/better-compute",  # bookings' environment files (D5)
)
STATE_DIR = "/var/lib/better-compute-agent"  # the network unit's --state-dir
APPLIER_STATE_DIR = "/var/lib/better-compute-agent-apply"  # the applier unit's --state-dir
# What the commands below write themselves, outside WRITE_DIRS.
COMMAND_WRITES = ("/var/lib/kubelet",)  # kubeadm join: the kubelet's config and flags
COMMAND_WRITES_IF_PRESENT = (
    "/boot",  # update-grub: /boot/grub/grub.cfg
    "/swap.img",  # swapoff -a opens each swap file read-write (Ubuntu's installer, guides)
    "/swapfile",
)

SYSCTL_KEYS = (
    "vm.nr_hugepages",
    "net.bridge.bridge-nf-call-iptables",
    "net.bridge.bridge-nf-call-ip6tables",
    "net.ipv4.ip_forward",
)
CPULIST = r"[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*"
# Each kernel argument the renderer writes, and the values it takes. The drop-in they go in is
# shell that update-grub sources as root: nothing else may reach it.
KERNEL_ARGS = {
    "intel_iommu": re.compile("on|off"),
    "amd_iommu": re.compile("on|off"),
    "iommu": re.compile("pt"),
    "hugepagesz": re.compile("1G"),
    "hugepages": re.compile("[0-9]{1,6}"),
    "isolcpus": re.compile(CPULIST),
    "nohz_full": re.compile(CPULIST),
    "rcu_nocbs": re.compile(CPULIST),
}
# No leading "-": an argument never becomes an option.
MODULE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,63}")
SERVICE = re.compile(r"better-compute-[a-z0-9][a-z0-9-]{0,63}\.service")
SLICE = re.compile(rf"better-compute-res_{ID_BODY}{{26,52}}\.slice")
# As NVML names a GPU (or, for one lost from the bus, the inventory does).
GPU_UUID = re.compile(r"GPU-[0-9A-Za-z-]{1,64}")
IMAGE = re.compile(r"[a-z0-9][A-Za-z0-9._/:@-]{0,511}")
SYSCTL = re.compile(f"({'|'.join(map(re.escape, SYSCTL_KEYS))})=[0-9]{{1,10}}")

Word = str | re.Pattern[str]  # a literal argument, or the pattern an argument matches whole
COMMANDS: tuple[tuple[Word, ...], ...] = (
    ("update-grub",),  # kernel arguments
    ("modprobe", MODULE),  # kernelModules.load, the kubelet's modules
    ("sysctl", "-w", SYSCTL),  # 2 MiB huge pages, the kubelet's sysctls
    # services, and bookings' slices (D5, D7)
    ("systemctl", "daemon-reload"),
    ("systemctl", "enable", "--now", SERVICE),
    ("systemctl", "restart", SERVICE),
    ("systemctl", "disable", "--now", SERVICE),
    ("systemctl", "start", SLICE),
    ("systemctl", "stop", SLICE),
    # gpu: persistence mode, compute mode, power limit
    ("nvidia-smi", "-pm", re.compile("[01]")),
    ("nvidia-smi", "-c", re.compile("DEFAULT|EXCLUSIVE_PROCESS|PROHIBITED")),
    ("nvidia-smi", "-i", GPU_UUID, "-pl", re.compile("[1-9][0-9]{0,4}")),
    # migLayout
    (
        "nvidia-mig-parted",
        "apply",
        "-f",
        "/etc/nvidia-mig-manager/better-compute.yaml",
        "-c",
        "better-compute",
    ),
    # kubernetes
    ("swapoff", "-a"),
    ("kubeadm", "join", "--config", "/etc/kubernetes/better-compute-join.yaml"),
    ("crictl", "pull", IMAGE),  # prewarmImages
)
# NodeSpec files are configuration: no execute bit, no group or world write, no setuid, setgid
# or sticky bit.
MODE_MASK = 0o644
SHOWN = 80  # characters of a spec's value quoted in a refusal


class Untrusted(ValueError):
    """A NodeSpec asks for something this agent does not do; the message says what."""


def _shown(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."


def plain_http_off_loopback(url: str) -> bool:
    """Whether ``url`` is plain HTTP to a host that is not loopback (127.0.0.0/8, ::1,
    ``localhost``): its tokens and answers would cross a network unencrypted."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname
    except ValueError:  # a malformed IPv6 literal: nothing shows it is loopback
        return True
    if parts.scheme.lower() != "http":
        return False
    if host == "localhost":
        return False
    try:
        return not ipaddress.ip_address(host or "").is_loopback
    except ValueError:  # a name other than localhost
        return True


def write_dir_of(root: Path, path: str) -> str | None:
    """The one of WRITE_DIRS that host path ``path`` lies under once resolved inside ``root``
    (``..`` and symlinks followed); None when it lies under none."""
    base = os.path.realpath(root)
    target = os.path.realpath(os.path.join(base, path.lstrip("/")))
    # The allowed directories as they are named, not resolved: a symlink on the way out of
    # one (or one that is itself a link elsewhere) leads outside.
    for allowed in WRITE_DIRS:
        if target.startswith(os.path.join(base, allowed.lstrip("/")) + "/"):
            return allowed
    return None


def check_path(root: Path, path: str | None) -> None:
    """Untrusted unless host path ``path`` lies, inside ``root``, under one of WRITE_DIRS."""
    if path is None or not path.startswith("/"):
        raise Untrusted(f"{_shown(path)} is not an absolute path")
    try:
        allowed = write_dir_of(root, path)
    except ValueError:  # a NUL byte
        raise Untrusted(f"{_shown(path)} is not a path") from None
    if allowed is None:
        raise Untrusted(f"{_shown(path)} is outside the directories this agent writes under")


def command_shape(argv: Sequence[str]) -> tuple[Word, ...] | None:
    """The one of COMMANDS that ``argv`` has the shape of; None when it has none."""
    for shape in COMMANDS:
        if len(shape) == len(argv) and all(
            arg == word if isinstance(word, str) else word.fullmatch(arg) is not None
            for word, arg in zip(shape, argv, strict=True)
        ):
            return shape
    return None


def check_command(argv: Sequence[str]) -> None:
    """Untrusted unless ``argv`` has the shape of one of COMMANDS."""
    if command_shape(argv) is None:
        raise Untrusted(f"the command {_shown(list(argv))} is not one this agent runs")


def check_kernel_args(content: str) -> None:
    """Untrusted unless each argument is one of KERNEL_ARGS with a value it takes."""
    for arg in content.split(" "):
        name, _, value = arg.partition("=")
        pattern = KERNEL_ARGS.get(name)
        if pattern is None or pattern.fullmatch(value) is None:
            raise Untrusted(f"the kernel argument {_shown(arg)} is not one this agent sets")


def check_unit(root: Path, unit: Unit) -> None:
    """Untrusted unless every file and command of the unit is one this agent writes or runs."""
    try:
        if unit.kind == "file":
            check_path(root, unit.path)
            if unit.mode & ~MODE_MASK:
                raise Untrusted(f"the file mode {unit.mode:04o} is not one this agent writes")
        if unit.kind == "kernel-args":
            check_kernel_args(unit.content)
            check_path(root, "/" + BOOT_DROP_IN)
        # A service is enabled the first time and restarted after.
        for argv in [*unit_commands(unit), *unit_commands(unit, enabled=True)]:
            check_command(argv)
    except Untrusted as exc:
        raise Untrusted(f"unit {_shown(unit.id)}: {exc}") from None


def check_booking(root: Path, booking: Booking) -> None:
    """Untrusted unless the booking names a reservation whose files lie where bookings' do."""
    rid = booking.reservation_id
    if RESERVATION_ID.fullmatch(rid) is None:
        raise Untrusted(f"booking {_shown(rid)}: not a reservation id")
    try:
        for path in paths_of(rid):
            check_path(root, path)
        for verb in ("start", "stop"):
            check_command(("systemctl", verb, slice_name(rid)))
        check_command(RELOAD)
    except Untrusted as exc:
        raise Untrusted(f"booking {rid}: {exc}") from None


def check_spec(root: Path, spec: NodeSpecUnits, bookings: Sequence[Booking]) -> None:
    """Untrusted (with the first reason found) unless every unit and booking of the NodeSpec
    asks only for what this agent does, applied under ``root``."""
    for unit in spec.units:
        check_unit(root, unit)
    for booking in bookings:
        check_booking(root, booking)


def check_rendered(spec: Mapping[str, Any], units: NodeSpecUnits, inventory: Inventory) -> None:
    """Untrusted unless every unit of the NodeSpec is one that this agent's renderer makes of
    the policy, sharing mode and GPU model the spec carries, for the host of ``inventory``
    (with the spec's booked GPUs held back as the control plane held them)."""
    if not units.units:
        return  # nothing to compare: a spec of bookings alone
    policy, sharing, model = spec.get("policy"), spec.get("sharing"), spec.get("gpuModel")
    if not isinstance(policy, dict) or not isinstance(sharing, str):
        raise Untrusted("the spec carries no policy and sharing mode to render its units from")
    if model is not None and not isinstance(model, str):
        raise Untrusted(f"the spec's gpuModel {_shown(model)} is not a GPU model")
    try:
        rendered = render(
            parse_policy(policy),
            sharing=sharing,
            gpu_model=model,
            inventory=with_families(inventory),
            booked_gpus=frozenset(units.booked_gpus),
        )
    except (InvalidInput, RenderRefused) as exc:
        raise Untrusted(f"the spec's policy does not render on this host: {exc}") from None
    made = {unit.id: msgspec.structs.replace(unit, gpus=[]) for unit in rendered.units}
    for unit in units.units:
        if made.get(unit.id) != msgspec.structs.replace(unit, gpus=[]):
            what = "file" if unit.kind == "file" else unit.kind
            raise Untrusted(
                f"unit {_shown(unit.id)}: the {what} is not what this agent renders of the "
                "spec's policy"
            )
