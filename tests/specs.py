"""NodeSpecs as the control plane serves them: units rendered by the real renderer from the
policy the spec carries, since the agent renders every spec's units again and refuses any
that differ (F3)."""

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from agent.apply import Applier, RecordingRunner
from agent.delivery import ComputeProcesses, Deliverer
from agent.gate import HostApply
from shared.gpu import with_families
from shared.inventory import Inventory
from shared.policy import parse_policy
from shared.render import render
from tests.nodes import recorded

HUGEPAGES = {"hugepages": {"2Mi": 64}}
# What HUGEPAGES renders on any host: this file, then `sysctl -w vm.nr_hugepages=64`.
HUGEPAGES_FILE = "etc/sysctl.d/90-better-compute-hugepages.conf"
HUGEPAGES_TEXT = (
    "# Managed by better-compute-agent from the pool policy; local edits are overwritten.\n"
    "vm.nr_hugepages = 64\n"
)


def served(
    version: str,
    policy: dict[str, Any] | None = None,
    inventory: Inventory | None = None,
    *,
    sharing: str = "exclusive",
    gpu_model: str | None = "H100",
    bookings: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """The spec of ``policy`` (HUGEPAGES by default) for ``inventory`` (the DGX H100)."""
    policy = HUGEPAGES if policy is None else policy
    host = with_families(inventory or recorded("dgx-h100-01"))
    units = render(parse_policy(policy), sharing=sharing, gpu_model=gpu_model, inventory=host)
    return {
        "version": version,
        "reboot": units.reboot,
        "units": msgspec.to_builtins(units.units),
        "bookedGpus": units.booked_gpus,
        "policy": policy,
        "sharing": sharing,
        "gpuModel": gpu_model,
        "bookings": list(bookings),
    }


def host_apply(
    root: Path, state_dir: Path, processes: ComputeProcesses = dict, **deliverer: Any
) -> HostApply:
    """The in-process gate, applier and deliverer under ``root``, commands recorded there."""
    runner = RecordingRunner(root)
    return HostApply(
        Applier(root, state_dir, runner),
        Deliverer(root, state_dir, runner, processes, **deliverer),
    )
