"""A recorded host (reference/host-fixtures.json format) served as pynvml and host facts.

``FakeNvml`` answers the pynvml calls the inventory makes the way the driver
does: the real module's exception classes, constants and struct types; opaque,
unequal, unhashable handles (``ctypes`` pointers to one ``struct_c_nvmlDevice_t``
per GPU, as pynvml's are); reference-counted init; ``Uninitialized`` before
init; ``NotSupported`` for MIG on GPUs without it; ``NotFound`` for empty MIG
slots; ``bytes`` strings in ``bytes_mode`` (nvidia-ml-py ≤ 11.510); and failures
injected per call and per GPU. The privileged GI/CI calls are not faked: the
inventory does not make them.

A GPU's ``health`` record is served as gpu-health.md §7 says: its XID events
through event sets (one-shot: queued into the first set the GPU is registered
on, lost when that set is freed; ``NVMLError_Timeout`` at once when nothing is
queued, never sleeping), its ECC, retired-page and remapped-row counters, and
``lost``: every call taking its handle raises ``NVMLError_GpuIsLost`` while
``nvmlDeviceGetCount`` still counts it and ``nvmlDeviceGetHandleByIndex`` still
hands out a handle.

D1's recorded topology is served with pynvml's return types: the minor number and
NUMA node as ints (``NotSupported`` where the recording has no NUMA node), the CPU
affinity as a ``c_ulonglong`` word array, each pair's common-ancestor level and
NVLink P2P status as ints (symmetric; a GPU with itself INTERNAL and OK), and the
compute processes as pynvml's friendly objects made from ``c_nvmlProcessInfo_t``.

The fixture's precomputed ``family`` is never read (``FixtureGpu`` has no such
field): the inventory derives the family from the name, as it does on hardware.
"""

import collections
import ctypes
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Concatenate, Final, ParamSpec, TypeVar

from agent.inventory.nvml.api import load_pynvml
from agent.inventory.recording import (
    FixtureGpu,
    FixtureHealth,
    FixtureHost,
    FixtureLink,
    FixtureMig,
    FixtureMigInstance,
    FixtureProcess,
)
from shared import cpulist

P = ParamSpec("P")
R = TypeVar("R")

# --- the fake --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Device:
    """What a handle points at: a GPU, or one MIG device of it."""

    gpu: FixtureGpu
    mig: FixtureMigInstance | None = None


@dataclass(slots=True)
class _EventSet:
    """One event set: the XID events queued for each GPU registered on it."""

    struct: Any  # the pynvml.struct_c_nvmlEventSet_t its handle points at
    queued: dict[int, collections.deque[int]] = field(default_factory=dict)  # GPU index → XIDs


_HEALTHY: Final = FixtureHealth()
_WHOLE_GPU: Final = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of an event for the whole GPU
# Calls that take no handle of a lost GPU, or still answer for one (gpu-health.md §7).
_ANSWER_WHEN_LOST: Final = frozenset({"nvmlDeviceGetHandleByIndex"})


Failure = BaseException | type[BaseException]


def _nvml_call(
    fn: Callable[Concatenate["FakeNvml", P], R],
) -> Callable[Concatenate["FakeNvml", P], R]:
    """Refuse the call before init (``Uninitialized``) and raise any failure injected for it."""
    name = fn.__name__

    def call(self: "FakeNvml", /, *args: P.args, **kwargs: P.kwargs) -> R:
        self._enter(name, args[0] if args else None)
        return fn(self, *args, **kwargs)

    call.__name__ = call.__qualname__ = name
    return call


_ARCHITECTURES = {
    "volta": "NVML_DEVICE_ARCH_VOLTA",
    "turing": "NVML_DEVICE_ARCH_TURING",
    "ampere": "NVML_DEVICE_ARCH_AMPERE",
    "ada": "NVML_DEVICE_ARCH_ADA",
    "hopper": "NVML_DEVICE_ARCH_HOPPER",
    "blackwell": "NVML_DEVICE_ARCH_BLACKWELL",
}


class FakeNvml:
    """pynvml's inventory functions over one recorded host.

    ``failures`` maps ``(function name, GPU index or None for any)`` to the
    exception (class or instance) that call raises, e.g.
    ``{("nvmlDeviceGetHandleByIndex", 3): pynvml.NVMLError_GpuIsLost}``.
    ``init_error`` overrides what ``nvmlInit`` raises (default: the fixture's
    ``init_exception``, or ``LibraryNotFound`` when NVML is not available).
    Any other pynvml attribute (constants, exception classes, struct types)
    is the real module's; other pynvml functions do not exist here.
    ``calls`` counts every call made, by function name.
    """

    def __init__(
        self,
        host: FixtureHost,
        *,
        bytes_mode: bool = False,
        failures: Mapping[tuple[str, int | None], Failure] | None = None,
        init_error: type[Exception] | None = None,
    ) -> None:
        real: Any = load_pynvml()
        self._real = real
        self._host = host
        self._bytes = bytes_mode
        self._failures = dict(failures or {})
        self._refcount = 0
        self._init_error = init_error or (
            None
            if host.nvml.available
            else getattr(real, host.nvml.init_exception or "", real.NVMLError_LibraryNotFound)
        )
        self._pci_type: Any = _legacy_pci_type(real) if bytes_mode else real.nvmlPciInfo_t
        self.calls: collections.Counter[str] = collections.Counter()
        # One device struct per GPU and per MIG device: handles are pointers to them, so two
        # lookups of one GPU are unequal objects that point at the same address.
        self._structs: dict[tuple[int, int | None], Any] = {}
        self._devices: dict[int, _Device] = {}  # struct address → what it stands for
        for gpu in host.gpus:
            self._add_device(_Device(gpu))
            for instance in gpu.mig.instances:
                self._add_device(_Device(gpu, instance))
        self._sets: dict[int, _EventSet] = {}  # event set struct address → the set
        self._links: dict[tuple[int, int], FixtureLink] = {(k.a, k.b): k for k in host.gpu_links}
        self._xids_queued: set[int] = set()  # GPUs whose XID events went into a set already
        # What collect_gpus reads off the module (NvmlApi), spelled out for mypy.
        self.NVMLError: type[Exception] = real.NVMLError
        self.NVMLError_NotSupported: type[Exception] = real.NVMLError_NotSupported
        self.NVMLError_NotFound: type[Exception] = real.NVMLError_NotFound
        self.NVMLError_InvalidArgument: type[Exception] = real.NVMLError_InvalidArgument
        self.NVMLError_GpuIsLost: type[Exception] = real.NVMLError_GpuIsLost
        self.NVMLError_ResetRequired: type[Exception] = real.NVMLError_ResetRequired
        self.NVMLError_FunctionNotFound: type[Exception] = real.NVMLError_FunctionNotFound
        self.NVMLError_Timeout: type[Exception] = real.NVMLError_Timeout
        self.NVMLError_Unknown: type[Exception] = real.NVMLError_Unknown
        self.NVML_DEVICE_MIG_ENABLE: int = real.NVML_DEVICE_MIG_ENABLE
        self.NVML_FEATURE_ENABLED: int = real.NVML_FEATURE_ENABLED
        self.NVML_TEMPERATURE_GPU: int = real.NVML_TEMPERATURE_GPU
        self.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int = real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        self.NVML_VOLATILE_ECC: int = real.NVML_VOLATILE_ECC
        self.NVML_TOPOLOGY_INTERNAL: int = real.NVML_TOPOLOGY_INTERNAL
        self.NVML_TOPOLOGY_SINGLE: int = real.NVML_TOPOLOGY_SINGLE
        self.NVML_TOPOLOGY_MULTIPLE: int = real.NVML_TOPOLOGY_MULTIPLE
        self.NVML_TOPOLOGY_HOSTBRIDGE: int = real.NVML_TOPOLOGY_HOSTBRIDGE
        self.NVML_TOPOLOGY_NODE: int = real.NVML_TOPOLOGY_NODE
        self.NVML_TOPOLOGY_SYSTEM: int = real.NVML_TOPOLOGY_SYSTEM
        self.NVML_P2P_CAPS_INDEX_NVLINK: int = real.NVML_P2P_CAPS_INDEX_NVLINK
        self.NVML_P2P_STATUS_OK: int = real.NVML_P2P_STATUS_OK
        # "nvml…" names are functions to __getattr__; these constants are spelled out.
        self.nvmlEventTypeXidCriticalError: int = real.nvmlEventTypeXidCriticalError
        self.nvmlEventTypeSingleBitEccError: int = real.nvmlEventTypeSingleBitEccError
        self.nvmlEventTypeDoubleBitEccError: int = real.nvmlEventTypeDoubleBitEccError

    def __getattr__(self, name: str) -> Any:
        if name.startswith("nvml") or name.startswith("_"):
            raise AttributeError(name)  # a function this fake does not serve
        return getattr(self._real, name)

    # --- plumbing ---

    def _add_device(self, device: _Device) -> None:
        struct = self._real.struct_c_nvmlDevice_t()
        key = (device.gpu.index, device.mig.mig_device_index if device.mig else None)
        self._structs[key] = struct
        self._devices[ctypes.addressof(struct)] = device

    def _handle(self, gpu: FixtureGpu, mig: FixtureMigInstance | None = None) -> Any:
        """A new pointer to the device's struct (an ``LP_struct_c_nvmlDevice_t``, as pynvml's)."""
        return ctypes.pointer(self._structs[gpu.index, mig.mig_device_index if mig else None])

    def _resolve(self, handle: object) -> _Device | None:
        """The device a handle points at; None for anything that is not one of ours."""
        if not isinstance(handle, self._real.c_nvmlDevice_t) or not handle:
            return None
        return self._devices.get(ctypes.addressof(handle.contents))

    def _enter(self, name: str, first: object) -> None:
        self.calls[name] += 1
        if self._refcount == 0:
            raise self._real.NVMLError_Uninitialized()
        device = self._resolve(first)
        index = device.gpu.index if device is not None else None
        if name == "nvmlDeviceGetHandleByIndex" and isinstance(first, int):
            index = first
        failure = self._failures.get((name, index)) or self._failures.get((name, None))
        if failure is not None:
            raise failure() if isinstance(failure, type) else failure
        if device is not None and name not in _ANSWER_WHEN_LOST and _health(device.gpu).lost:
            raise self._real.NVMLError_GpuIsLost()  # fallen off the bus: every call on it fails

    def _str(self, value: str) -> str | bytes:
        return value.encode() if self._bytes else value

    def _arg(self, value: str | bytes) -> str:
        if isinstance(value, str) and self._bytes:
            # ≤ 11.510 passed arguments straight to ctypes, which refuses str
            raise ctypes.ArgumentError("argument 1: TypeError: wrong type")
        return value.decode() if isinstance(value, bytes) else value

    def _any(self, handle: object) -> _Device:
        device = self._resolve(handle)
        if device is None:
            raise self._real.NVMLError_InvalidArgument()
        return device

    def _device(self, handle: object) -> FixtureGpu:
        """The GPU of a full-device handle; per-device facts are refused on MIG handles."""
        h = self._any(handle)
        if h.mig is not None:
            raise self._real.NVMLError_NotSupported()
        return h.gpu

    def _mig(self, handle: object) -> FixtureMigInstance:
        h = self._any(handle)
        if h.mig is None:
            raise self._real.NVMLError_NotSupported()
        return h.mig

    def _supported(self, value: R | None) -> R:
        if value is None:
            raise self._real.NVMLError_NotSupported()
        return value

    # --- lifecycle and system ---

    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        failure = self._failures.get(("nvmlInit", None))
        if failure is not None:
            raise failure() if isinstance(failure, type) else failure
        if self._init_error is not None:
            raise self._init_error()
        self._refcount += 1

    @_nvml_call
    def nvmlShutdown(self) -> None:
        self._refcount -= 1
        if self._refcount == 0:
            self._sets.clear()  # a set does not outlive its init, nor do its queued events

    @_nvml_call
    def nvmlSystemGetDriverVersion(self) -> str | bytes:
        return self._str(self._supported(self._host.nvml.driver_version))

    @_nvml_call
    def nvmlSystemGetNVMLVersion(self) -> str | bytes:
        return self._str(self._supported(self._host.nvml.nvml_version))

    @_nvml_call
    def nvmlSystemGetCudaDriverVersion(self) -> int:
        return self._supported(self._host.nvml.cuda_driver_version)

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        return self.nvmlSystemGetCudaDriverVersion()

    # --- enumeration ---

    @_nvml_call
    def nvmlDeviceGetCount(self) -> int:
        return len(self._host.gpus)

    @_nvml_call
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object:
        if not 0 <= index < len(self._host.gpus):
            raise self._real.NVMLError_InvalidArgument()
        return self._handle(self._host.gpus[index])  # a lost GPU's too: its calls then fail

    @_nvml_call
    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes, /) -> object:
        wanted = self._arg(uuid)
        for gpu in self._host.gpus:
            if gpu.uuid == wanted:
                return self._found(gpu)
        raise self._real.NVMLError_NotFound()

    @_nvml_call
    def nvmlDeviceGetHandleByPciBusId(self, bus_id: str | bytes, /) -> object:
        wanted = self._arg(bus_id).upper()
        for gpu in self._host.gpus:
            if wanted in (gpu.pci.busId.upper(), gpu.pci.busIdLegacy.upper()):
                return self._found(gpu)
        raise self._real.NVMLError_NotFound()

    def _found(self, gpu: FixtureGpu) -> object:
        """A GPU looked up by UUID or bus id: a lost one cannot be reached that way."""
        if _health(gpu).lost:
            raise self._real.NVMLError_GpuIsLost()
        return self._handle(gpu)

    @_nvml_call
    def nvmlDeviceGetIndex(self, handle: object, /) -> int:
        return self._device(handle).index

    @_nvml_call
    def nvmlDeviceGetMinorNumber(self, handle: object, /) -> int:
        gpu = self._device(handle)
        return gpu.minor_number if gpu.minor_number is not None else gpu.index

    # --- topology and processes (D1, fake-nvml.md §6) ---

    def _peer(self, handle: object) -> FixtureGpu:
        """The second GPU of a pair call: a lost one fails the call, as the first does."""
        gpu = self._device(handle)
        if _health(gpu).lost:
            raise self._real.NVMLError_GpuIsLost()
        return gpu

    def _link(self, first: object, second: object) -> FixtureLink | None:
        """The recorded link between two GPUs, either way round; None for a GPU with itself."""
        a, b = self._device(first).index, self._peer(second).index
        if a == b:
            return None
        link = self._links.get((min(a, b), max(a, b)))
        if link is None:
            raise self._real.NVMLError_NotSupported()  # a pair the recording lacks
        return link

    @_nvml_call
    def nvmlDeviceGetNumaNodeId(self, handle: object, /) -> int:
        return self._supported(self._device(handle).numa_node)

    @_nvml_call
    def nvmlDeviceGetCpuAffinity(self, handle: object, cpu_set_size: int, /) -> Any:
        recorded = self._supported(self._device(handle).cpu_affinity)
        if cpu_set_size < 1:
            raise self._real.NVMLError_InvalidArgument()
        words = (ctypes.c_ulonglong * cpu_set_size)()
        for cpu in cpulist.parse(recorded):
            if cpu // 64 < cpu_set_size:  # as the driver, only the words the caller gave room for
                words[cpu // 64] |= 1 << (cpu % 64)
        return words

    @_nvml_call
    def nvmlDeviceGetTopologyCommonAncestor(self, first: object, second: object, /) -> int:
        link = self._link(first, second)
        return int(self._real.NVML_TOPOLOGY_INTERNAL) if link is None else link.level

    @_nvml_call
    def nvmlDeviceGetP2PStatus(self, first: object, second: object, index: int, /) -> int:
        link = self._link(first, second)
        if index != self._real.NVML_P2P_CAPS_INDEX_NVLINK:
            raise self._real.NVMLError_NotSupported()  # only NVLink's status is recorded
        return int(self._real.NVML_P2P_STATUS_OK) if link is None else link.p2p_nvlink_status

    @_nvml_call
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object, /) -> list[Any]:
        h = self._any(handle)
        if h.mig is None:
            return [self._process(p, _WHOLE_GPU, _WHOLE_GPU) for p in h.gpu.compute_processes]
        mig = h.mig
        return [
            self._process(p, mig.gpu_instance_id, mig.compute_instance_id)
            for p in mig.compute_processes
        ]

    def _process(self, process: FixtureProcess, gpu_instance: int, compute_instance: int) -> Any:
        """One process as pynvml returns it: its c_nvmlProcessInfo_t made a friendly object,
        with usedGpuMemory None where NVML says NVML_VALUE_NOT_AVAILABLE."""
        unknown = int(self._real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value)
        used = process.used_gpu_memory_bytes
        friendly = self._real.nvmlStructToFriendlyObject(
            self._real.c_nvmlProcessInfo_t(
                pid=process.pid,
                usedGpuMemory=unknown if used is None else used,
                gpuInstanceId=gpu_instance,
                computeInstanceId=compute_instance,
            )
        )
        if friendly.usedGpuMemory == unknown:
            friendly.usedGpuMemory = None
        return friendly

    # --- identity and properties ---

    @_nvml_call
    def nvmlDeviceGetName(self, handle: object, /) -> str | bytes:
        h = self._any(handle)
        return self._str(h.mig.nvml_name if h.mig is not None else h.gpu.name)

    @_nvml_call
    def nvmlDeviceGetUUID(self, handle: object, /) -> str | bytes:
        h = self._any(handle)
        return self._str(h.mig.uuid if h.mig is not None else h.gpu.uuid)

    @_nvml_call
    def nvmlDeviceGetSerial(self, handle: object, /) -> str | bytes:
        return self._str(self._supported(self._device(handle).serial))

    @_nvml_call
    def nvmlDeviceGetPciInfo(self, handle: object, /) -> Any:
        pci = self._device(handle).pci
        # Built from bytes, so reading .busId runs the binding's own decoding.
        return self._pci_type(
            busIdLegacy=(pci.busIdLegacy or pci.busId[4:]).encode(),
            domain=pci.domain,
            bus=pci.bus,
            device=pci.device,
            pciDeviceId=int(pci.pciDeviceId, 16),
            pciSubSystemId=int(pci.pciSubSystemId, 16),
            busId=pci.busId.encode(),
        )

    def nvmlDeviceGetPciInfo_v3(self, handle: object, /) -> Any:
        return self.nvmlDeviceGetPciInfo(handle)

    @_nvml_call
    def nvmlDeviceGetMemoryInfo(self, handle: object, /, version: int | None = None) -> Any:
        h = self._any(handle)
        total = h.mig.memory_total_bytes if h.mig is not None else h.gpu.memory_total_bytes
        if version:
            return self._real.c_nvmlMemory_v2_t(
                version=version, total=total, reserved=0, free=total, used=0
            )
        return self._real.c_nvmlMemory_t(total=total, free=total, used=0)

    @_nvml_call
    def nvmlDeviceGetCudaComputeCapability(self, handle: object, /) -> tuple[int, int]:
        return self._supported(self._device(handle).cuda_compute_capability)

    @_nvml_call
    def nvmlDeviceGetArchitecture(self, handle: object, /) -> int:
        arch = _ARCHITECTURES.get(self._device(handle).architecture or "")
        return int(getattr(self._real, arch or "NVML_DEVICE_ARCH_UNKNOWN"))

    @_nvml_call
    def nvmlDeviceGetPersistenceMode(self, handle: object, /) -> int:
        return self._supported(self._device(handle).persistence_mode)

    @_nvml_call
    def nvmlDeviceGetPowerManagementLimit(self, handle: object, /) -> int:
        return self._supported(self._device(handle).power_management_limit_mw)

    @_nvml_call
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: object, /) -> list[int]:
        return list(self._supported(self._device(handle).power_limit_constraints_mw))

    @_nvml_call
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object, /) -> int:
        return self._supported(self._device(handle).power_management_limit_mw)

    @_nvml_call
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int, /) -> int:
        if sensor != self._real.NVML_TEMPERATURE_GPU:
            raise self._real.NVMLError_NotSupported()
        return self._supported(self._device(handle).temperature_gpu_c)

    def nvmlDeviceGetTemperatureV(self, handle: object, sensor: int, /, version: int = 0) -> int:
        return self.nvmlDeviceGetTemperature(handle, sensor)

    @_nvml_call
    def nvmlDeviceGetEccMode(self, handle: object, /) -> list[int]:
        return list(self._supported(self._device(handle).ecc_mode))

    # --- health counters (gpu-health.md §1, §7) ---

    @_nvml_call
    def nvmlDeviceGetTotalEccErrors(
        self, handle: object, error_type: int, counter_type: int, /
    ) -> int:
        gpu = self._device(handle)
        if not gpu.ecc_mode or not gpu.ecc_mode[0]:
            raise self._real.NVMLError_NotSupported()  # no counters while ECC is off
        if error_type != self._real.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0  # corrected errors: none recorded
        if counter_type not in (self._real.NVML_VOLATILE_ECC, self._real.NVML_AGGREGATE_ECC):
            raise self._real.NVMLError_InvalidArgument()
        recorded = _health(gpu).ecc_uncorrected_volatile
        # The aggregate counter gives the same number: nothing older was recorded.
        return recorded if recorded is not None else gpu.ecc_uncorrected_volatile

    @_nvml_call
    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: object, /) -> int:
        pending = self._supported(_health(self._device(handle)).retired_pages_pending)
        return int(self._real.NVML_FEATURE_ENABLED if pending else self._real.NVML_FEATURE_DISABLED)

    @_nvml_call
    def nvmlDeviceGetRemappedRows(self, handle: object, /) -> tuple[int, int, int, int]:
        # Served as recorded even with MIG on (real drivers say NotSupported while instances exist).
        h = self._any(handle)
        if h.mig is not None:
            raise self._real.NVMLError_NotSupported()
        rows = self._supported(_health(h.gpu).remapped_rows)
        return (rows.correctable, rows.uncorrectable, int(rows.pending), int(rows.failure))

    # --- events (gpu-health.md §5, §7) ---

    def _supported_events(self, gpu: FixtureGpu) -> int:
        """XID always; single- and double-bit ECC events only with ECC on (this fake's choice)."""
        mask = int(self._real.nvmlEventTypeXidCriticalError)
        if gpu.ecc_mode and gpu.ecc_mode[0]:
            mask |= self._real.nvmlEventTypeSingleBitEccError
            mask |= self._real.nvmlEventTypeDoubleBitEccError
        return mask

    def _set(self, event_set: object) -> _EventSet:
        if not isinstance(event_set, self._real.c_nvmlEventSet_t) or not event_set:
            raise self._real.NVMLError_InvalidArgument()
        found = self._sets.get(ctypes.addressof(event_set.contents))
        if found is None:  # freed, or never created here
            raise self._real.NVMLError_InvalidArgument()
        return found

    @_nvml_call
    def nvmlEventSetCreate(self) -> Any:
        struct = self._real.struct_c_nvmlEventSet_t()
        self._sets[ctypes.addressof(struct)] = _EventSet(struct)
        return ctypes.pointer(struct)

    @_nvml_call
    def nvmlEventSetFree(self, event_set: object, /) -> None:
        found = self._set(event_set)
        del self._sets[ctypes.addressof(found.struct)]  # what was still queued is gone

    @_nvml_call
    def nvmlDeviceGetSupportedEventTypes(self, handle: object, /) -> int:
        return self._supported_events(self._device(handle))

    @_nvml_call
    def nvmlDeviceRegisterEvents(
        self, handle: object, event_types: int, event_set: object, /
    ) -> None:
        # No per-instance events: MIG device handles are refused (nvml.h, nvmlEventSetWait_v2).
        gpu = self._device(handle)
        found = self._set(event_set)
        if not event_types or event_types & ~self._supported_events(gpu):
            raise self._real.NVMLError_NotSupported()
        xid = int(self._real.nvmlEventTypeXidCriticalError)
        if event_types & xid and gpu.index not in self._xids_queued:
            # One-shot, as the driver: an event reaches the set registered when it happened,
            # never a later one.
            self._xids_queued.add(gpu.index)
            found.queued[gpu.index] = collections.deque(e.xid for e in _health(gpu).xid_events)

    @_nvml_call
    def nvmlEventSetWait_v2(self, event_set: object, timeoutms: int, /) -> Any:
        found = self._set(event_set)
        for index in sorted(found.queued):  # GPUs in index order
            queue = found.queued[index]
            if queue:
                return self._real.c_nvmlEventData_t(
                    device=self._handle(self._host.gpus[index]),
                    eventType=self._real.nvmlEventTypeXidCriticalError,
                    eventData=queue.popleft(),
                    gpuInstanceId=_WHOLE_GPU,
                    computeInstanceId=_WHOLE_GPU,
                )
        raise self._real.NVMLError_Timeout()  # at once, whatever timeoutms says: never sleeps

    def nvmlEventSetWait(self, event_set: object, timeoutms: int, /) -> Any:
        return self.nvmlEventSetWait_v2(event_set, timeoutms)  # an alias in pynvml 13.x

    # --- MIG, unprivileged path ---

    def _mig_config(self, handle: object) -> FixtureMig:
        mig = self._device(handle).mig
        if not mig.supported:
            raise self._real.NVMLError_NotSupported()
        return mig

    @_nvml_call
    def nvmlDeviceGetMigMode(self, handle: object, /) -> list[int]:
        mig = self._mig_config(handle)
        return [mig.current_mode, mig.pending_mode]

    @_nvml_call
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object, /) -> int:
        return self._mig_config(handle).max_mig_device_count

    @_nvml_call
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int, /) -> object:
        gpu = self._device(handle)
        mig = self._mig_config(handle)
        if not mig.current_mode:
            raise self._real.NVMLError_NotSupported()
        if not 0 <= index < mig.max_mig_device_count:
            raise self._real.NVMLError_InvalidArgument()
        for instance in mig.instances:
            if instance.mig_device_index == index:
                return self._handle(gpu, instance)
        raise self._real.NVMLError_NotFound()  # an empty slot: callers continue

    @_nvml_call
    def nvmlDeviceIsMigDeviceHandle(self, handle: object, /) -> ctypes.c_uint:
        # a c_uint object, as pynvml returns: `== 1` is False, `.value` is the answer
        return ctypes.c_uint(1 if self._any(handle).mig is not None else 0)

    @_nvml_call
    def nvmlDeviceGetDeviceHandleFromMigDeviceHandle(self, handle: object, /) -> object:
        h = self._any(handle)
        if h.mig is None:
            raise self._real.NVMLError_InvalidArgument()
        return self._handle(h.gpu)

    @_nvml_call
    def nvmlDeviceGetGpuInstanceId(self, handle: object, /) -> int:
        return self._mig(handle).gpu_instance_id

    @_nvml_call
    def nvmlDeviceGetComputeInstanceId(self, handle: object, /) -> int:
        return self._mig(handle).compute_instance_id

    @_nvml_call
    def nvmlDeviceGetAttributes(self, handle: object, /) -> Any:
        mig = self._mig(handle)
        return self._real.c_nvmlDeviceAttributes(
            multiprocessorCount=mig.multiprocessor_count,
            gpuInstanceSliceCount=mig.gpu_instance_slice_count,
            computeInstanceSliceCount=mig.compute_instance_slice_count,
            memorySizeMB=mig.memory_size_mib,
        )


def _health(gpu: FixtureGpu) -> FixtureHealth:
    """The GPU's health record; without one, a healthy GPU's answers."""
    return gpu.health if gpu.health is not None else _HEALTHY


@functools.cache
def _legacy_pci_type(real: Any) -> type[ctypes.Structure]:
    """nvmlPciInfo_t as bindings ≤ 11.510 had it: char fields read back as bytes."""
    fields: Sequence[tuple[str, Any]] = real.nvmlPciInfo_t._fields_
    return type("nvmlPciInfo_t", (ctypes.Structure,), {"_fields_": list(fields)})
