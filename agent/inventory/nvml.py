"""GPUs and MIG instances from NVML, behind one seam: a module-like ``nvml`` object.

``collect_gpus(nvml)`` takes anything with the pynvml function surface: the real
``pynvml`` module (nvidia-ml-py, loaded by ``load_pynvml()``) or the fixture's
fake. The same code runs on both, so the fixture tests exercise this module as
it runs on hardware.

NVML is initialised only inside ``collect_gpus`` and always shut down again. A
host without a driver is a CPU-only host, not a crash; a GPU that is lost or
hidden from this process is left out of the report (and logged), not the
whole inventory.
"""

from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import structlog

from shared.gpu import family_of
from shared.inventory import Gpu, MigInstance, Nvml


def _log() -> Any:
    """A logger bound at the time of logging: a module-level one would be cached by
    ``cache_logger_on_first_use`` and escape ``structlog.testing.capture_logs``."""
    return structlog.get_logger(__name__)


T = TypeVar("T")


class NvmlApi(Protocol):
    """The part of pynvml the inventory calls (nvidia-ml-py 11.495 … 13.615 names).

    Strings may come back as ``bytes`` (bindings ≤ 11.510) or ``str``. Handles are
    opaque: never compared, hashed or stored beyond one collection.
    """

    NVMLError: type[Exception]
    NVMLError_NotSupported: type[Exception]
    NVMLError_NotFound: type[Exception]
    NVMLError_InvalidArgument: type[Exception]
    NVMLError_GpuIsLost: type[Exception]
    NVML_DEVICE_MIG_ENABLE: int
    NVML_FEATURE_ENABLED: int
    NVML_TEMPERATURE_GPU: int
    NVML_MEMORY_ERROR_TYPE_UNCORRECTED: int
    NVML_VOLATILE_ECC: int

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


def load_pynvml() -> NvmlApi:
    """The real nvidia-ml-py module. Importing it loads no library and initialises nothing."""
    import pynvml  # type: ignore[import-untyped]

    module: NvmlApi = pynvml
    return module


def text(value: str | bytes) -> str:
    """A string from any binding: ≤ 11.510 returns bytes, later ones str."""
    return value.decode() if isinstance(value, bytes) else value


def collect_gpus(nvml: NvmlApi) -> tuple[Nvml, list[Gpu]]:
    """Initialise NVML, read every GPU and its MIG instances, and shut NVML down."""
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        # LibraryNotFound (no driver), DriverNotLoaded, LibRmVersionMismatch, …: the
        # report carries the error; a CPU-only host is normal, not worth a line per cycle.
        _log().debug("nvml.unavailable", error=type(exc).__name__)
        return Nvml(available=False, error=type(exc).__name__), []
    try:
        info = _system(nvml)
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            _log().warning("nvml.device_count_failed", error=type(exc).__name__)
            info.error = type(exc).__name__
            return info, []
        gpus = [gpu for index in range(count) if (gpu := _gpu_or_none(nvml, index)) is not None]
        return info, gpus
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as exc:
            _log().warning("nvml.shutdown_failed", error=type(exc).__name__)


def _system(nvml: NvmlApi) -> Nvml:
    """Driver, NVML and CUDA versions; each is None when the driver cannot say."""
    driver = _optional(nvml, nvml.nvmlSystemGetDriverVersion)
    version = _optional(nvml, nvml.nvmlSystemGetNVMLVersion)
    cuda = _optional(nvml, nvml.nvmlSystemGetCudaDriverVersion)
    return Nvml(
        available=True,
        driver_version=text(driver) if driver is not None else None,
        nvml_version=text(version) if version is not None else None,
        # 12040 → "12.4"; 13000 → "13.0"
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda is not None else None,
    )


def _gpu_or_none(nvml: NvmlApi, index: int) -> Gpu | None:
    """One GPU, or None (logged) when it is lost, hidden from us, or fails a required call."""
    try:
        return _gpu(nvml, index, nvml.nvmlDeviceGetHandleByIndex(index))
    except nvml.NVMLError as exc:
        # GpuIsLost: fell off the bus; NoPermission: not in this process's cgroup.
        # The rest of the host is still worth reporting.
        _log().warning("nvml.gpu_skipped", index=index, error=type(exc).__name__)
        return None


def _gpu(nvml: NvmlApi, index: int, handle: object) -> Gpu:
    """Every fact of one GPU. Required calls raise; optional ones give None."""
    name = text(nvml.nvmlDeviceGetName(handle))
    pci = _optional(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    pci_device_id: int | None = int(pci.pciDeviceId) if pci is not None else None
    mig_mode = _optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    mig_current = mig_mode is not None and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
    ecc = _optional(nvml, nvml.nvmlDeviceGetEccMode, handle)
    capability = _optional(nvml, nvml.nvmlDeviceGetCudaComputeCapability, handle)
    persistence = _optional(nvml, nvml.nvmlDeviceGetPersistenceMode, handle)
    power_mw = _optional(nvml, nvml.nvmlDeviceGetPowerManagementLimit, handle)
    # The range the board allows, so a policy may raise a limit someone lowered.
    constraints = _optional(nvml, nvml.nvmlDeviceGetPowerManagementLimitConstraints, handle)
    return Gpu(
        index=index,
        uuid=text(nvml.nvmlDeviceGetUUID(handle)),
        name=name,
        family=family_of(name, pci_device_id),
        memory_bytes=_memory_total(nvml, index, handle),
        serial=_optional_text(nvml, nvml.nvmlDeviceGetSerial, handle),
        pci_bus_id=text(pci.busId) if pci is not None else None,
        pci_device_id=pci_device_id,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        mig_supported=mig_mode is not None,
        mig_current=mig_current,
        mig_pending=mig_mode is not None and mig_mode[1] == nvml.NVML_DEVICE_MIG_ENABLE,
        mig_instances=_mig_instances(nvml, index, handle) if mig_current else [],
        persistence_mode=None if persistence is None else persistence == nvml.NVML_FEATURE_ENABLED,
        power_limit_w=power_mw / 1000 if power_mw is not None else None,
        power_limit_min_w=constraints[0] / 1000 if constraints else None,
        power_limit_max_w=constraints[1] / 1000 if constraints else None,
        ecc_current=bool(ecc[0]) if ecc is not None else None,
        ecc_pending=bool(ecc[1]) if ecc is not None else None,
        ecc_uncorrected_volatile=_ecc_uncorrected(nvml, handle) if ecc and ecc[0] else None,
        temperature_c=_temperature(nvml, handle),
    )


def _memory_total(nvml: NvmlApi, index: int, handle: object) -> int:
    """Framebuffer bytes. An unprivileged caller may be refused on a MIG parent: then 0."""
    memory = _optional(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    if memory is None:
        _log().warning("nvml.memory_unknown", index=index)
        return 0
    return int(memory.total)


def _mig_instances(nvml: NvmlApi, index: int, handle: object) -> list[MigInstance]:
    """MIG devices by the unprivileged path: no GI/CI calls, which need root."""
    slots = _optional(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    instances: list[MigInstance] = []
    for slot in range(slots):  # an upper bound with holes, not a count
        try:
            mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
            continue
        try:
            instance = _mig_instance(nvml, mig)
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError as exc:
            # destroyed between the two calls: it is simply not there any more
            _log().warning("nvml.mig_skipped", index=index, slot=slot, error=type(exc).__name__)
            continue
        if instance is None:
            _log().warning("nvml.mig_unnamed", index=index, slot=slot)
            continue
        instances.append(instance)
    return instances


def _mig_instance(nvml: NvmlApi, mig: object) -> MigInstance | None:
    """One MIG device; None when its name carries no profile (" MIG <profile>")."""
    _, marker, profile = text(nvml.nvmlDeviceGetName(mig)).partition(" MIG ")
    if not marker or not profile:
        return None
    memory = _optional(nvml, nvml.nvmlDeviceGetMemoryInfo, mig)
    return MigInstance(
        uuid=text(nvml.nvmlDeviceGetUUID(mig)),
        profile=profile.strip(),
        gpu_instance_id=nvml.nvmlDeviceGetGpuInstanceId(mig),
        compute_instance_id=nvml.nvmlDeviceGetComputeInstanceId(mig),
        memory_bytes=int(memory.total) if memory is not None else None,
    )


def _temperature(nvml: NvmlApi, handle: object) -> int | None:
    """GPU core °C. nvmlDeviceGetTemperature is deprecated in 13.x; use …V where it is gone."""
    legacy: Callable[[object, int], int] | None = getattr(nvml, "nvmlDeviceGetTemperature", None)
    get = legacy or getattr(nvml, "nvmlDeviceGetTemperatureV", None)
    if get is None:
        return None
    return _optional(nvml, get, handle, nvml.NVML_TEMPERATURE_GPU)


def _ecc_uncorrected(nvml: NvmlApi, handle: object) -> int | None:
    """Uncorrected ECC errors since boot; non-zero means the GPU needs attention."""
    get: Callable[[object, int, int], int] | None = getattr(
        nvml, "nvmlDeviceGetTotalEccErrors", None
    )
    if get is None:
        return None
    return _optional(
        nvml, get, handle, nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nvml.NVML_VOLATILE_ECC
    )


def _optional_text(nvml: NvmlApi, call: Callable[..., str | bytes], *args: object) -> str | None:
    """A string fact, or None when the GPU cannot give it (serial on GeForce)."""
    value = _optional(nvml, call, *args)
    return text(value) if value is not None else None


def _optional(nvml: NvmlApi, call: Callable[..., T], *args: object) -> T | None:
    """The call's answer, or None on any NVML error but a lost GPU.

    NotSupported is the usual one (no ECC, no MIG, GeForce serial); FunctionNotFound
    comes from an older driver; NoPermission from an unprivileged caller. A lost
    GPU is re-raised: every later call would fail too, so the GPU is skipped.
    """
    try:
        return call(*args)
    except nvml.NVMLError_GpuIsLost:
        raise
    except nvml.NVMLError:
        return None
