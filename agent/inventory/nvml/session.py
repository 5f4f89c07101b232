"""The NVML session: one init and one XID event set held across collections.

A session holds one ``nvmlInit`` and one XID event set from its first
``collect()`` to ``close()``, so the agent's loop keeps both open across
cycles (gpu-health.md §5). ``collect_gpus`` is the one-shot form: a session of
one collection, NVML shut down again after it.

A host without a driver is a CPU-only host, not a crash. A lost GPU stays in
the report, unhealthy, with what an earlier cycle saw of it; a GPU hidden
from this process (NoPermission) is left out and logged.
"""

from collections.abc import Collection
from pathlib import Path

import msgspec

from agent.inventory.nvml import facts
from agent.inventory.nvml.api import NvmlApi, log
from agent.inventory.nvml.events import EVENT_DRAIN_CAP, XidEvents
from agent.inventory.nvml.health import SKIP_XIDS, Cycle, StickyXids, Verdict
from shared.inventory import Gpu, Nvml


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
    """

    def __init__(
        self,
        nvml: NvmlApi,
        *,
        boot_id: str | None = None,
        state_file: Path | None = None,
        skip_xids: Collection[int] = SKIP_XIDS,
        drain_cap: int = EVENT_DRAIN_CAP,
    ) -> None:
        self.nvml = nvml
        self._initialised = False
        self._events = XidEvents(nvml, skip_xids, drain_cap)
        self._xids = StickyXids(state_file, boot_id)  # GPU UUID → critical XIDs this boot
        self._seen: dict[int, Gpu] = {}  # GPU index → what the last cycle that could read it saw
        self._shown: dict[int, tuple[str, list[str]]] = {}  # the verdict last logged per GPU

    def __enter__(self) -> "NvmlSession":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def collect(self) -> tuple[Nvml, list[Gpu]]:
        """The NVML facts and every GPU with its health verdict."""
        nvml = self.nvml
        if not self._initialised:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                # LibraryNotFound (no driver), DriverNotLoaded, LibRmVersionMismatch, …: the
                # report carries the error; a CPU-only host is normal, not worth a line per cycle.
                log().debug("nvml.unavailable", error=type(exc).__name__)
                return Nvml(available=False, error=type(exc).__name__), []
            self._initialised = True
        info = facts.system(nvml)
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            log().warning("nvml.device_count_failed", error=type(exc).__name__)
            info.error = type(exc).__name__
            self.close()  # start afresh next cycle: NVML itself is in trouble
            return info, []
        cycle = Cycle()
        added = [self._xids.add(uuid, xid) for uuid, xid in self._events.watch(count, cycle)]
        gpus = [gpu for index in range(count) if (gpu := self._gpu(index, cycle)) is not None]
        gpus += self._vanished(count, gpus)
        if any(added):
            self._xids.save()
        self._show(gpus)
        return info, gpus

    def _gpu(self, index: int, cycle: Cycle) -> Gpu | None:
        """One GPU with its verdict; a lost one from what was seen of it; None if hidden."""
        nvml = self.nvml
        verdict = cycle.of(index)
        try:
            gpu = facts.gpu(nvml, index, nvml.nvmlDeviceGetHandleByIndex(index), verdict)
        except nvml.NVMLError_GpuIsLost:
            return self._unreachable(index, verdict, "gpu_lost")
        except nvml.NVMLError_ResetRequired:
            return self._unreachable(index, verdict, "reset_required")
        except nvml.NVMLError as exc:
            # NoPermission: not in this process's cgroup. The rest of the host is still
            # worth reporting.
            log().warning("nvml.gpu_skipped", index=index, error=type(exc).__name__)
            return None
        self._seen[index] = gpu
        return verdict.apply(gpu, self._xids.of(gpu.uuid))

    def _unreachable(self, index: int, verdict: Verdict, reason: str) -> Gpu:
        """A GPU no call reaches: as an earlier cycle saw it (live readings dropped), unhealthy.

        Never seen: only its index, with a placeholder UUID and no name or family.
        """
        seen = self._seen.get(index)
        if seen is None:
            gpu = Gpu(index=index, uuid=f"GPU-lost-{index}", name="", family=None, memory_bytes=0)
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

    def close(self) -> None:
        """Free the event set, then shut NVML down; the next ``collect()`` starts afresh."""
        self._events.free()
        if self._initialised:
            self._initialised = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as exc:
                log().warning("nvml.shutdown_failed", error=type(exc).__name__)
