"""The NVML session: one init and one XID event set held across collections.

A session holds one ``nvmlInit`` and one XID event set from its first
``collect()`` to ``close()``, so the agent's loop keeps both open across
cycles (gpu-health.md §5). ``collect_gpus`` is the one-shot form: a session of
one collection, NVML shut down again after it.

A host without a driver is a CPU-only host, not a crash. A lost GPU stays in
the report, unhealthy, with what an earlier cycle saw of it; a GPU hidden
from this process (NoPermission) is left out and logged.
"""

import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from agent.inventory.nvml import facts, topology
from agent.inventory.nvml.api import NvmlApi, log, optional, text
from agent.inventory.nvml.events import EVENT_DRAIN_CAP, XidEvents
from agent.inventory.nvml.health import SKIP_XIDS, Cycle, StickyXids, Verdict
from shared.inventory import Gpu, GpuLink, Nvml


@dataclass(frozen=True, slots=True)
class Reading:
    """One collection: the NVML facts, every GPU with its verdict, and the GPU pairs (D1)."""

    nvml: Nvml
    gpus: list[Gpu] = field(default_factory=list)
    links: list[GpuLink] = field(default_factory=list)


def collect_gpus(nvml: NvmlApi) -> tuple[Nvml, list[Gpu]]:
    """Initialise NVML, read every GPU and its MIG instances, and shut NVML down.

    One shot: XID events are those queued between this collection's registration
    and its drain (a fake's recorded ones; on hardware, practically none).
    """
    with NvmlSession(nvml) as session:
        return session.collect()


class NvmlSession:
    """NVML held open across collections: one init, one XID event set, sticky XID verdicts.

    ``collect()`` initialises NVML on first use (and again after a failure), creates
    the event set and registers every physical GPU for XID events, drains the set
    without blocking (``nvmlEventSetWait_v2(set, 0)`` until ``NVMLError_Timeout``, at
    most ``drain_cap`` events), then reads every GPU and its health. ``close()`` frees
    the set and shuts NVML down; the agent calls it at exit.

    XID verdicts are kept per GPU UUID for this boot: in memory, and in ``state_file``
    when one is given and the boot id is known, so a restarted agent still reports
    the GPU unhealthy until the host reboots (or an operator deletes the file).

    ``sysfs_root`` is where a GPU's NUMA node and CPU affinity are looked up when the
    driver cannot give them (D1); None (a recorded host) looks nowhere else.
    """

    def __init__(
        self,
        nvml: NvmlApi,
        *,
        boot_id: str | None = None,
        state_file: Path | None = None,
        skip_xids: Collection[int] = SKIP_XIDS,
        drain_cap: int = EVENT_DRAIN_CAP,
        sysfs_root: Path | None = None,
    ) -> None:
        self.nvml = nvml
        self._sysfs_root = sysfs_root
        self._initialised = False
        self._events = XidEvents(nvml, skip_xids, drain_cap)
        self._xids = StickyXids(state_file, boot_id)  # GPU UUID → critical XIDs this boot
        self._seen: dict[int, Gpu] = {}  # GPU index → what the last cycle that could read it saw
        self._shown: dict[int, tuple[str, list[str]]] = {}  # the verdict last logged per GPU
        self._process_failures: set[tuple[str, str]] = set()  # (device, error) logged once

    def __enter__(self) -> "NvmlSession":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def collect(self) -> tuple[Nvml, list[Gpu]]:
        """The NVML facts and every GPU with its health verdict."""
        reading = self.read()
        return reading.nvml, reading.gpus

    def read(self, logical_cpus: int | None = None) -> Reading:
        """One collection: NVML's facts, every GPU with its verdict and place, every GPU pair.

        ``logical_cpus`` (the host's; this machine's when not given) sizes the CPU
        affinity mask NVML fills.
        """
        nvml = self.nvml
        error = self._start()
        if error is not None:
            return Reading(Nvml(available=False, error=error))
        info = facts.system(nvml)
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            log().warning("nvml.device_count_failed", error=type(exc).__name__)
            info.error = type(exc).__name__
            self.close()  # start afresh next cycle: NVML itself is in trouble
            return Reading(info)
        words = topology.cpu_words(logical_cpus or os.cpu_count() or 1)
        cycle = Cycle()
        added = [self._xids.add(uuid, xid) for uuid, xid in self._events.watch(count, cycle)]
        found = [
            got for index in range(count) if (got := self._gpu(index, cycle, words)) is not None
        ]
        gpus = [gpu for gpu, _ in found]
        gpus += self._vanished(count, gpus)
        if any(added):
            self._xids.save()
        self._show(gpus)
        reachable = {gpu.index: handle for gpu, handle in found if handle is not None}
        return Reading(info, gpus, topology.links(nvml, reachable))

    def _start(self) -> str | None:
        """Initialise NVML unless it is; the error's name when it cannot be."""
        if self._initialised:
            return None
        try:
            self.nvml.nvmlInit()
        except self.nvml.NVMLError as exc:
            # LibraryNotFound (no driver), DriverNotLoaded, LibRmVersionMismatch, …: the
            # report carries the error; a CPU-only host is normal, not worth a line per cycle.
            log().debug("nvml.unavailable", error=type(exc).__name__)
            return type(exc).__name__
        self._initialised = True
        return None

    def _gpu(self, index: int, cycle: Cycle, words: int) -> tuple[Gpu, object | None] | None:
        """One GPU with its verdict, and its handle while calls reach it; a lost one from what
        was seen of it, without a handle; None if hidden."""
        nvml = self.nvml
        verdict = cycle.of(index)
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            gpu = facts.gpu(nvml, index, handle, verdict)
            gpu = topology.placed(nvml, gpu, handle, words, self._sysfs_root)
        except nvml.NVMLError_GpuIsLost:
            return self._unreachable(index, verdict, "gpu_lost"), None
        except nvml.NVMLError_ResetRequired:
            return self._unreachable(index, verdict, "reset_required"), None
        except nvml.NVMLError as exc:
            # NoPermission: not in this process's cgroup. The rest of the host is still
            # worth reporting.
            log().warning("nvml.gpu_skipped", index=index, error=type(exc).__name__)
            return None
        self._seen[index] = gpu
        return verdict.apply(gpu, self._xids.of(gpu.uuid)), handle

    def _unreachable(self, index: int, verdict: Verdict, reason: str) -> Gpu:
        """A GPU no call reaches: as an earlier cycle saw it (live readings dropped), unhealthy.

        Never seen: only its index, with a placeholder UUID and no name or family.
        """
        seen = self._seen.get(index)
        if seen is None:
            gpu = Gpu(index=index, uuid=_lost_uuid(index), name="", family=None, memory_bytes=0)
        else:
            gpu = msgspec.structs.replace(seen, temperature_c=None, ecc_uncorrected_volatile=None)
        verdict.bad(reason)
        return verdict.apply(gpu, self._xids.of(gpu.uuid))

    def _vanished(self, count: int, gpus: list[Gpu]) -> list[Gpu]:
        """GPUs seen before that NVML no longer enumerates at all: lost (gpu-health.md §4)."""
        present = {gpu.uuid for gpu in gpus}
        return [
            self._unreachable(index, Verdict(), "gpu_lost")
            for index, seen in sorted(self._seen.items())
            if index >= count and seen.uuid not in present
        ]

    def _show(self, gpus: list[Gpu]) -> None:
        """One log line each time a GPU's verdict changes, not one per cycle."""
        for gpu in gpus:
            now = (gpu.health, gpu.health_reasons)
            if self._shown.get(gpu.index, ("healthy", [])) != now:
                level = "info" if gpu.health == "healthy" else "warning"
                getattr(log(), level)(
                    "gpu.health",
                    index=gpu.index,
                    uuid=gpu.uuid,
                    health=gpu.health,
                    reasons=gpu.health_reasons,
                )
            self._shown[gpu.index] = now

    def compute_processes(self) -> dict[str, list[int]]:
        """D5, D7: each GPU's and MIG instance's UUID → the sorted pids NVML lists on it.

        ``nvmlDeviceGetComputeRunningProcesses`` on every GPU handle and on each MIG
        device handle. A device whose call fails (NoPermission, NotSupported, lost) is left
        out, as one NVML cannot say anything of (a release waits on it, D7), and the failure
        is logged once, at debug. A GPU hidden from this process is left out too, as it is
        from the inventory; without NVML the map is empty.
        """
        nvml = self.nvml
        if self._start() is not None:
            return {}
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            self._process_failure("host", exc)
            return {}
        found: dict[str, list[int]] = {}
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                uuid = text(nvml.nvmlDeviceGetUUID(handle))
            except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_ResetRequired) as exc:
                seen = self._seen.get(index)
                self._process_failure(seen.uuid if seen is not None else _lost_uuid(index), exc)
                continue
            except nvml.NVMLError:  # hidden from this process: collect() says so
                continue
            pids = self._pids(uuid, handle)
            if pids is not None:
                found[uuid] = pids
            try:
                mode = optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
                if mode is not None and mode[0] == nvml.NVML_DEVICE_MIG_ENABLE:
                    for _, mig in facts.mig_devices(nvml, handle):
                        mig_uuid = text(nvml.nvmlDeviceGetUUID(mig))
                        if (mig_pids := self._pids(mig_uuid, mig)) is not None:
                            found[mig_uuid] = mig_pids
            except nvml.NVMLError as exc:  # lost, or its MIG devices changed meanwhile
                self._process_failure(uuid, exc)
        return found

    def _pids(self, uuid: str, handle: object) -> list[int] | None:
        """The distinct pids NVML lists on one device, sorted; None when it cannot say."""
        nvml = self.nvml
        # 13.x's unversioned wrapper raises NVMLLibraryMismatchError (no NVMLError) on a
        # driver without the versioned call.
        mismatch = getattr(nvml, "NVMLLibraryMismatchError", None)
        errors = (nvml.NVMLError, mismatch) if mismatch is not None else (nvml.NVMLError,)
        try:
            processes = nvml.nvmlDeviceGetComputeRunningProcesses(handle)
        except errors as exc:
            self._process_failure(uuid, exc)
            return None
        return sorted({int(process.pid) for process in processes})

    def _process_failure(self, device: str, exc: Exception) -> None:
        """Log, once per device and error, that its processes could not be listed."""
        key = (device, type(exc).__name__)
        if key not in self._process_failures:
            self._process_failures.add(key)
            log().debug("nvml.processes_unknown", device=device, error=key[1])

    def close(self) -> None:
        """Free the event set, then shut NVML down; the next ``collect()`` starts afresh."""
        self._events.free()
        if self._initialised:
            self._initialised = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as exc:
                log().warning("nvml.shutdown_failed", error=type(exc).__name__)


def _lost_uuid(index: int) -> str:
    """The placeholder UUID of an unreachable GPU never seen before."""
    return f"GPU-lost-{index}"
