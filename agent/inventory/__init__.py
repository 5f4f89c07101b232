"""The host inventory: GPUs from NVML, everything else from psutil and sysfs.

``collect_inventory()`` reads this machine; ``collect_inventory(fixture=…)``
reads a recorded host instead, through a fake of the same pynvml calls, so the
one ``collect_gpus`` runs in both cases. Importing this package initialises
nothing: NVML is opened and closed inside each collection.
"""

from pathlib import Path

from agent.inventory.fixture import FakeNvml
from agent.inventory.host import HostFacts, collect_host
from agent.inventory.nvml import NvmlApi, collect_gpus, load_pynvml
from agent.inventory.recording import FixtureError, host_facts, load_host
from shared.inventory import Gpu, Inventory, Nvml

__all__ = ["FixtureError", "HostFacts", "collect_inventory", "inventory_from"]


def collect_inventory(
    fixture: Path | None = None,
    fixture_host: str | None = None,
    sysfs_root: Path = Path("/"),
) -> Inventory:
    """This host's inventory, or the recorded ``fixture_host`` of ``fixture``.

    With a fixture, its GPUs come from a fake NVML and its CPU, memory, huge
    page, disk and identity facts replace this machine's (``sysfs_root`` is
    then unused). Raises ``FixtureError`` for a fixture it cannot use; a host
    without NVML is reported as CPU-only, never an error.
    """
    if fixture is not None:
        host = load_host(fixture, fixture_host)
        return inventory_from(FakeNvml(host), host_facts(host))
    if fixture_host is not None:
        raise ValueError("fixture_host needs a fixture")
    facts = collect_host(sysfs_root)
    try:
        nvml = load_pynvml()
    except ImportError as exc:  # nvidia-ml-py missing: a CPU-only report, not a crash
        return _assemble(Nvml(available=False, error=type(exc).__name__), [], facts)
    return inventory_from(nvml, facts)


def inventory_from(nvml: NvmlApi, facts: HostFacts) -> Inventory:
    """An inventory from any pynvml-like module and a host's facts."""
    info, gpus = collect_gpus(nvml)
    return _assemble(info, gpus, facts)


def _assemble(info: Nvml, gpus: list[Gpu], facts: HostFacts) -> Inventory:
    """The wire model from its parts."""
    return Inventory(
        machine_id=facts.machine_id,
        hostname=facts.hostname,
        cpu=facts.cpu,
        memory_total_bytes=facts.memory_total_bytes,
        hugepages=facts.hugepages,
        nvml=info,
        filesystems=facts.filesystems,
        gpus=gpus,
    )
