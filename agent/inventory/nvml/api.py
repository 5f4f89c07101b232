"""The pynvml seam: the function surface the inventory calls, and the wrappers that read it.

``NvmlApi`` is anything with that surface: the real ``pynvml`` module (nvidia-ml-py,
loaded by ``load_pynvml()``) or the fixture's fake. The same code runs on both, so the
fixture tests exercise it as it runs on hardware.
"""

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import structlog

T = TypeVar("T")


def log() -> Any:
    """A logger bound at the time of logging: a module-level one would be cached by
    ``cache_logger_on_first_use`` and escape ``structlog.testing.capture_logs``."""
    return structlog.get_logger("agent.inventory.nvml")


class NvmlApi(Protocol):
    """The part of pynvml the inventory calls (nvidia-ml-py 11.495 … 13.615 names).

    Strings may come back as ``bytes`` (bindings ≤ 11.510) or ``str``. Handles are
    opaque: never compared, hashed or stored beyond one collection. The health
    calls (events, remapped rows, retired pages, ECC counters) are looked up with
    ``getattr``: a binding without one does not watch that signal. So is
    ``nvmlDeviceGetNumaNodeId`` (13.x only): without it the NUMA node comes from sysfs.
    """

    NVMLError: type[Exception]
    NVMLError_NotSupported: type[Exception]
    NVMLError_NotFound: type[Exception]
    NVMLError_InvalidArgument: type[Exception]
    NVMLError_GpuIsLost: type[Exception]
    NVMLError_ResetRequired: type[Exception]
    NVMLError_FunctionNotFound: type[Exception]
    NVMLError_Timeout: type[Exception]
    NVMLError_Unknown: type[Exception]
    NVML_DEVICE_MIG_ENABLE: int
    NVML_FEATURE_ENABLED: int
    NVML_TEMPERATURE_GPU: int
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int
    NVML_VOLATILE_ECC: int
    nvmlEventTypeXidCriticalError: int
    NVML_TOPOLOGY_INTERNAL: int
    NVML_TOPOLOGY_SINGLE: int
    NVML_TOPOLOGY_MULTIPLE: int
    NVML_TOPOLOGY_HOSTBRIDGE: int
    NVML_TOPOLOGY_NODE: int
    NVML_TOPOLOGY_SYSTEM: int
    NVML_P2P_CAPS_INDEX_NVLINK: int
    NVML_P2P_STATUS_OK: int

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlSystemGetDriverVersion(self) -> str | bytes: ...
    def nvmlSystemGetNVMLVersion(self) -> str | bytes: ...
    def nvmlSystemGetCudaDriverVersion(self) -> int: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int, /) -> object: ...
    def nvmlDeviceGetName(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetUUID(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetSerial(self, handle: object, /) -> str | bytes: ...
    def nvmlDeviceGetPciInfo(self, handle: object, /) -> Any: ...
    def nvmlDeviceGetMemoryInfo(self, handle: object, /) -> Any: ...
    def nvmlDeviceGetCudaComputeCapability(self, handle: object, /) -> tuple[int, int]: ...
    def nvmlDeviceGetPersistenceMode(self, handle: object, /) -> int: ...
    def nvmlDeviceGetPowerManagementLimit(self, handle: object, /) -> int: ...
    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle: object, /) -> list[int]: ...
    def nvmlDeviceGetEccMode(self, handle: object, /) -> Sequence[int]: ...
    def nvmlDeviceGetTemperature(self, handle: object, sensor: int, /) -> int: ...
    def nvmlDeviceGetMigMode(self, handle: object, /) -> Sequence[int]: ...
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: object, /) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: object, index: int, /) -> object: ...
    def nvmlDeviceGetGpuInstanceId(self, handle: object, /) -> int: ...
    def nvmlDeviceGetComputeInstanceId(self, handle: object, /) -> int: ...
    def nvmlDeviceGetMinorNumber(self, handle: object, /) -> int: ...
    def nvmlDeviceGetCpuAffinity(self, handle: object, cpu_set_size: int, /) -> Any: ...
    def nvmlDeviceGetTopologyCommonAncestor(self, first: object, second: object, /) -> int: ...
    def nvmlDeviceGetP2PStatus(self, first: object, second: object, index: int, /) -> int: ...
    def nvmlDeviceGetComputeRunningProcesses(self, handle: object, /) -> list[Any]: ...


def load_pynvml() -> NvmlApi:
    """The real nvidia-ml-py module. Importing it loads no library and initialises nothing."""
    import pynvml  # type: ignore[import-untyped]

    module: NvmlApi = pynvml
    return module


def text(value: str | bytes) -> str:
    """A string from any binding: ≤ 11.510 returns bytes, later ones str."""
    return value.decode() if isinstance(value, bytes) else value


def optional(nvml: NvmlApi, call: Callable[..., T], *args: object) -> T | None:
    """The call's answer, or None on any NVML error but a lost GPU.

    NotSupported is the usual one (no ECC, no MIG, GeForce serial); FunctionNotFound
    comes from an older driver; NoPermission from an unprivileged caller. A lost
    GPU is re-raised: every later call would fail too, so the GPU is reported lost.
    """
    try:
        return call(*args)
    except nvml.NVMLError_GpuIsLost:
        raise
    except nvml.NVMLError:
        return None


def optional_text(nvml: NvmlApi, call: Callable[..., str | bytes], *args: object) -> str | None:
    """A string fact, or None when the GPU cannot give it (serial on GeForce)."""
    value = optional(nvml, call, *args)
    return text(value) if value is not None else None
