"""The host inventory: GPUs and their health from NVML, everything else from psutil and sysfs.

``collect_inventory()`` reads this machine once; ``collect_inventory(fixture=…)``
reads a recorded host instead, through a fake of the same pynvml calls, so the
one GPU reader runs in both cases. ``InventoryCollector`` is the agent loop's
form: it keeps one NVML session (one init, one XID event set) from its first
collection to ``close()``, so XID events are read once each, as they happen,
and a GPU's XID verdict sticks (gpu-health.md §5). Each GPU reports where it
sits and the inventory how GPU pairs connect (D1); ``compute_processes()`` lists
the compute processes NVML sees on each GPU and MIG instance, for delivery and
release (D5, D7). Importing this package initialises nothing.
"""

from pathlib import Path
from types import TracebackType

from agent.inventory.fixture import FakeNvml
from agent.inventory.host import HostFacts, boot_id, collect_host
from agent.inventory.nvml.api import NvmlApi, load_pynvml
from agent.inventory.nvml.health import HEALTH_FILE
from agent.inventory.nvml.session import NvmlSession, Reading
from agent.inventory.recording import FixtureError, host_facts, load_host
from shared.inventory import Inventory, Nvml

__all__ = [
    "FixtureError",
    "HostFacts",
    "InventoryCollector",
    "collect_inventory",
    "compute_processes",
    "inventory_from",
]


class InventoryCollector:
    """This host's inventory (or a recorded host's), cycle after cycle, through one NVML session.

    With a fixture, its GPUs come from one fake NVML kept for the collector's life
    (its XID events are delivered once, as a driver's are) and its CPU, memory, huge
    page, disk and identity facts replace this machine's. Without one, NVML is the
    real module and the host facts are read under ``sysfs_root`` each cycle (where the
    driver cannot place a GPU, its NUMA node and CPU affinity too). With ``state_dir``,
    XID verdicts are also kept in its ``gpu-health.json`` for this boot.
    Raises ``FixtureError`` for a fixture it cannot use; a host without NVML is
    reported as CPU-only, never an error. ``close()`` frees the event set and shuts
    NVML down.
    """

    def __init__(
        self,
        fixture: Path | None = None,
        fixture_host: str | None = None,
        sysfs_root: Path = Path("/"),
        state_dir: Path | None = None,
    ) -> None:
        self._sysfs_root = sysfs_root
        self._facts: HostFacts | None = None
        self._unavailable = ""  # why there is no NVML module at all
        nvml: NvmlApi | None = None
        if fixture is not None:
            host = load_host(fixture, fixture_host)
            self._facts = host_facts(host)
            nvml = FakeNvml(host)
        elif fixture_host is not None:
            raise ValueError("fixture_host needs a fixture")
        else:
            try:
                nvml = load_pynvml()
            except ImportError as exc:  # nvidia-ml-py missing: a CPU-only report, not a crash
                self._unavailable = type(exc).__name__
        self._session = (
            NvmlSession(
                nvml,
                boot_id=boot_id(sysfs_root),
                state_file=state_dir / HEALTH_FILE if state_dir is not None else None,
                # A recorded host's GPUs are not this machine's PCI devices.
                sysfs_root=sysfs_root if fixture is None else None,
            )
            if nvml is not None
            else None
        )

    def collect(self) -> Inventory:
        """One cycle's inventory; XID events since the last cycle are read now."""
        facts = self._facts or collect_host(self._sysfs_root)
        if self._session is None:
            return _assemble(Reading(Nvml(available=False, error=self._unavailable)), facts)
        return _assemble(self._session.read(facts.cpu.logical_cpus), facts)

    __call__ = collect

    def compute_processes(self) -> dict[str, list[int]]:
        """D5, D7: each GPU's and MIG instance's UUID → the sorted pids NVML lists on it now.

        A device whose call fails maps to []; a host without NVML gives {}. With a
        fixture, its ``compute_processes`` as they were when the collector was created.
        """
        if self._session is None:
            return {}
        return self._session.compute_processes()

    def close(self) -> None:
        if self._session is not None:
            self._session.close()

    def __enter__(self) -> "InventoryCollector":
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def collect_inventory(
    fixture: Path | None = None,
    fixture_host: str | None = None,
    sysfs_root: Path = Path("/"),
) -> Inventory:
    """This host's inventory, or the recorded ``fixture_host`` of ``fixture``: one collection.

    With a fixture, its GPUs come from a fake NVML and its CPU, memory, huge
    page, disk and identity facts replace this machine's (``sysfs_root`` is
    then unused). Raises ``FixtureError`` for a fixture it cannot use; a host
    without NVML is reported as CPU-only, never an error.
    """
    with InventoryCollector(fixture, fixture_host, sysfs_root) as collector:
        return collector.collect()


def compute_processes(
    fixture: Path | None = None, fixture_host: str | None = None
) -> dict[str, list[int]]:
    """D5, D7: this host's (or the recorded host's) GPU and MIG UUIDs → the sorted pids NVML
    lists on each: one collection, as ``collect_inventory``. Raises ``FixtureError`` for a
    fixture it cannot use; a host without NVML gives {}."""
    with InventoryCollector(fixture, fixture_host) as collector:
        return collector.compute_processes()


def inventory_from(nvml: NvmlApi, facts: HostFacts, sysfs_root: Path | None = None) -> Inventory:
    """An inventory from any pynvml-like module and a host's facts (one collection).

    ``sysfs_root``: where to place GPUs the driver cannot (D1); None looks nowhere else.
    """
    with NvmlSession(nvml, sysfs_root=sysfs_root) as session:
        return _assemble(session.read(facts.cpu.logical_cpus), facts)


def _assemble(reading: Reading, facts: HostFacts) -> Inventory:
    """The wire model from its parts."""
    return Inventory(
        machine_id=facts.machine_id,
        hostname=facts.hostname,
        cpu=facts.cpu,
        memory_total_bytes=facts.memory_total_bytes,
        hugepages=facts.hugepages,
        nvml=reading.nvml,
        filesystems=facts.filesystems,
        gpus=reading.gpus,
        gpu_links=reading.links,
    )
