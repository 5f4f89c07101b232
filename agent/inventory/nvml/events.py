"""The XID event set: created once, every physical GPU registered, drained without waiting.

The set is held across collections (gpu-health.md §5): events are queued in a
registered set between cycles, and a set created anew never replays earlier ones.
"""

import ctypes
from collections.abc import Callable, Collection
from dataclasses import dataclass
from typing import Any, Final

from agent.inventory.nvml.api import NvmlApi, log, optional, text
from agent.inventory.nvml.health import Cycle

EVENT_DRAIN_CAP: Final = 256  # events taken off the set per cycle; the rest wait for the next


@dataclass(frozen=True)
class _Watched:
    """A GPU registered on the event set: what attributes an event to it when its handle fails."""

    uuid: str | None
    address: int | None


class _Broken(Exception):
    """The event set is in an undefined state (RegisterEvents said Unknown): free it."""


class XidEvents:
    """One XID event set: created on first use, every GPU registered, freed on ``free()``.

    ``watch()`` drains the set without blocking (``nvmlEventSetWait_v2(set, 0)`` until
    ``NVMLError_Timeout``, at most ``drain_cap`` events) and answers the critical XIDs,
    those not in ``skip_xids``, with their GPU's UUID. A set that fails is freed and
    built anew on the next ``watch()``; a driver or binding without event sets is
    not asked again.
    """

    def __init__(self, nvml: NvmlApi, skip_xids: Collection[int], drain_cap: int) -> None:
        self.nvml = nvml
        self.skip_xids = frozenset(skip_xids)
        self.drain_cap = drain_cap
        self._set: Any | None = None
        self._unavailable = False  # the driver or binding has no event sets
        self._wait = "nvmlEventSetWait_v2"
        self._watched: dict[int, _Watched] = {}  # GPU index → registered on the set
        self._unmonitored: set[int] = set()  # GPUs whose XIDs NVML cannot report

    def watch(self, count: int, cycle: Cycle) -> list[tuple[str, int]]:
        """Make sure the set exists and every GPU is registered, then drain it.

        The critical XIDs queued since the last drain, as (GPU UUID, XID) in order;
        what stopped a GPU's XIDs from being read goes into ``cycle`` as unknown.
        """
        if self._set is None and not self._unavailable:
            self._create(cycle)
        if self._set is None:
            return []
        try:
            for index in range(count):
                if index not in self._watched and index not in self._unmonitored:
                    self._register(index, cycle)
        except _Broken:
            found = self._drain(cycle)  # what the set still holds is read before it goes
            self.free()
            return found
        return self._drain(cycle)

    def _create(self, cycle: Cycle) -> None:
        nvml = self.nvml
        create: Callable[[], Any] | None = getattr(nvml, "nvmlEventSetCreate", None)
        if create is None:
            self._unavailable = True
            return
        try:
            self._set = create()
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound) as exc:
            log().info("nvml.xid_events_unavailable", error=type(exc).__name__)
            self._unavailable = True
        except nvml.NVMLError as exc:
            log().warning("nvml.event_set_failed", error=type(exc).__name__)
            cycle.unsure_all(f"xid_events:{type(exc).__name__}")

    def _register(self, index: int, cycle: Cycle) -> None:
        """Register one physical GPU for XID events (only the bits its driver supports)."""
        nvml = self.nvml
        supported: Callable[[object], int] | None = getattr(
            nvml, "nvmlDeviceGetSupportedEventTypes", None
        )
        register: Callable[[object, int, Any], None] | None = getattr(
            nvml, "nvmlDeviceRegisterEvents", None
        )
        if supported is None or register is None:
            self._unmonitored.add(index)  # a binding without events
            return
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except nvml.NVMLError:
            return  # lost (its own reads say so) or hidden from us: tried again next cycle
        try:
            uuid = optional(nvml, nvml.nvmlDeviceGetUUID, handle)
            mask = int(supported(handle)) & nvml.nvmlEventTypeXidCriticalError
            if mask:
                register(handle, mask, self._set)
        except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_ResetRequired):
            return  # the GPU's own reads say so; tried again next cycle
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            mask = 0
        except nvml.NVMLError as exc:
            cycle.of(index).unsure(f"xid_events:{type(exc).__name__}")
            log().warning("nvml.xid_register_failed", index=index, error=type(exc).__name__)
            if isinstance(exc, nvml.NVMLError_Unknown):
                raise _Broken from exc  # the set may be in an undefined state (nvml.h): rebuild
            return
        if not mask:
            # Too old a board or driver: its XIDs are not watched, which is not unhealthy.
            log().info("nvml.xid_events_unmonitored", index=index)
            self._unmonitored.add(index)
            return
        self._watched[index] = _Watched(text(uuid) if uuid is not None else None, _address(handle))

    def _drain(self, cycle: Cycle) -> list[tuple[str, int]]:
        """Take the queued events off the set, never waiting: timeout 0, until Timeout."""
        nvml = self.nvml
        found: list[tuple[str, int]] = []
        for _ in range(self.drain_cap):
            wait: Callable[[Any, int], Any] | None = getattr(nvml, self._wait, None)
            try:
                if wait is None:
                    raise nvml.NVMLError_FunctionNotFound()
                event = wait(self._set, 0)
            except nvml.NVMLError_Timeout:
                return found  # nothing (more) queued
            except (nvml.NVMLError_FunctionNotFound, nvml.NVMLError_NotSupported) as exc:
                if self._wait == "nvmlEventSetWait_v2":
                    self._wait = "nvmlEventSetWait"  # a driver before _v2: the first version
                    continue
                log().info("nvml.xid_events_unavailable", error=type(exc).__name__)
                self._unavailable = True
                self.free()
                return found
            except nvml.NVMLError_GpuIsLost:
                # Not every GPU: each GPU's own reads tell which fell off the bus (§5.3).
                log().warning("nvml.event_wait_gpu_lost")
                return found
            except nvml.NVMLError as exc:
                log().warning("nvml.event_wait_failed", error=type(exc).__name__)
                for index in self._watched:
                    cycle.of(index).unsure(f"xid_events:{type(exc).__name__}")
                self.free()  # built anew next cycle
                return found
            if (critical := self._event(event)) is not None:
                found.append(critical)
        log().info("nvml.xid_events_left_for_next_cycle", cap=self.drain_cap)
        return found

    def _event(self, event: Any) -> tuple[str, int] | None:
        """A critical XID with its GPU's UUID; None for any other event."""
        nvml = self.nvml
        if int(event.eventType) != nvml.nvmlEventTypeXidCriticalError:
            return None
        xid = int(event.eventData)
        uuid = self._uuid_of(event.device)
        if uuid is None:
            log().warning("gpu.xid_unattributed", xid=xid)
            return None
        if xid in self.skip_xids:
            log().info("gpu.xid_application", uuid=uuid, xid=xid)  # the job's fault, not the GPU's
            return None
        log().warning("gpu.xid", uuid=uuid, xid=xid)
        return uuid, xid

    def _uuid_of(self, device: object) -> str | None:
        """The UUID of an event's GPU; from its registration when the GPU no longer answers."""
        nvml = self.nvml
        try:
            return text(nvml.nvmlDeviceGetUUID(device))
        except nvml.NVMLError:
            address = _address(device)
            for watched in self._watched.values():
                if address is not None and watched.address == address:
                    return watched.uuid
            return None

    def free(self) -> None:
        """Free the set (if any) and forget every registration; the next ``watch()`` rebuilds."""
        nvml = self.nvml
        if self._set is not None:
            free: Callable[[Any], None] | None = getattr(nvml, "nvmlEventSetFree", None)
            try:
                if free is not None:
                    free(self._set)
            except nvml.NVMLError as exc:
                log().warning("nvml.event_set_free_failed", error=type(exc).__name__)
        self._set = None
        self._watched.clear()
        self._unmonitored.clear()


def _address(handle: object) -> int | None:
    """Where a ctypes handle points (stable per device, unlike the handle objects)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None
