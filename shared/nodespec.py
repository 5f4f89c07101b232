"""The NodeSpec: a pool policy rendered for one host as ordered configuration units.

``render`` is pure and deterministic: (policy, sharing mode, GPU model, host
inventory, booked GPUs) → NodeSpec. The control plane serves it to nodes and
renders it against representative inventories to refuse, at the API, a
policy no node could take (P6); the agent applies it, or writes it under a
directory for a local dry-run. A policy a given host cannot take raises
``RenderRefused`` with the policy field and the reason.

Units (what applying each means is the agent's job, agent/apply.py):

| kind          | content                         | applying it                                        |
| ------------- | ------------------------------- | -------------------------------------------------- |
| `file`        | the file's text, at `path`      | write atomically (temp, fsync, rename), `mode`     |
| `kernel-args` | space-separated kernel args     | write the boot loader drop-in; takes a reboot      |
| `module`      | a module name                   | `modprobe NAME` (its modules-load.d file is a file unit) |
| `sysctl`      | `key=value`                     | `sysctl -w key=value` (its sysctl.d file is a file unit) |
| `service`     | a systemd unit name             | `systemctl enable --now`; restart when `restarts` names it |
| `command`     | an argv, one string per element | run once per change of its content (and after each boot with `everyBoot`) |

`needs` says what taking the unit asks of the host: nothing, a service
restart, a drain (workloads off the GPUs), or a reboot.
"""

from typing import Literal

from msgspec import Struct

UnitKind = Literal["file", "kernel-args", "module", "sysctl", "service", "command"]
Needs = Literal["nothing", "restart", "drain", "reboot"]


class Unit(Struct, rename="camel", kw_only=True, omit_defaults=True, frozen=True):
    id: str  # stable across renders, e.g. "hugepages/sysctl-file"; the key of apply results
    kind: UnitKind
    content: str = ""
    argv: list[str] = []  # kind command
    path: str | None = None  # kind file: an absolute path on the host
    mode: int = 0o644
    needs: Needs = "nothing"
    restarts: list[str] = []  # services to restart when this unit changes
    every_boot: bool = False  # kind command: its effect does not survive a reboot (nvidia-smi, MIG)
    # needs drain (H4): the GPUs (UUIDs) the unit repartitions or reconfigures. From the render
    # on they leave placement until the node reports the unit applied; the agent applies it
    # only while none of them is booked.
    gpus: list[str] = []
    # needs drain: ``gpus`` are those the host's inventory shows not yet as the unit makes
    # them (a MIG layout). They stay held until an inventory shows them done, whatever the
    # agent reported; otherwise they return once the unit is reported applied.
    gpus_from_inventory: bool = False


class Booking(Struct, rename="camel", kw_only=True, frozen=True):
    """D5: one reservation booked on the node, as the agent delivers it. ``live``: write its
    slice and environment file and start the slice; ``release``: it ended: stop the slice,
    remove its files, and report it released once NVML shows no compute process left on its
    devices. Devices are UUIDs (GPUs, or MIG instances) in placement order; ``cpus`` and
    ``memoryNodes`` are cpulists ("" when nothing is pinned). No tenant secret is in it."""

    reservation_id: str
    gpus: list[str] = []
    mig_instances: list[str] = []
    cpus: str = ""
    cpu_quota: int | None = None  # percent (vcpu × 100) where CPUs are a share, not pinned
    memory_bytes: int | None = None
    memory_nodes: str = ""
    state: Literal["live", "release"] = "live"


class NodeSpecUnits(Struct, rename="camel", kw_only=True, frozen=True):
    version: str  # sha256 of the units: moves exactly when what a host must do moves
    units: list[Unit]
    reboot: bool  # some unit needs a reboot to take effect
    # H4: the node's GPUs (UUIDs) with a live booking when this spec was rendered; a
    # drain-gated unit touching one of them waits (the agent reports it "waiting-drain").
    booked_gpus: list[str] = []


class RenderRefused(ValueError):
    """The policy cannot be taken by this host; ``field`` is the path inside the policy."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
