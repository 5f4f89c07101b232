"""What NVML tells of the system and of one GPU: versions, names, memory, PCI, MIG, power, ECC.

Required calls raise; optional ones give None (``api.optional``). A GPU's level
health signals are read with its facts, into the verdict its caller holds.
"""

from collections.abc import Callable, Iterator

from agent.inventory.nvml.api import NvmlApi, log, optional, optional_text, text
from agent.inventory.nvml.health import Verdict, level_signals
from shared.gpu import family_of
from shared.inventory import Gpu, MigInstance, Nvml


def system(nvml: NvmlApi) -> Nvml:
    """Driver, NVML and CUDA versions; each is None when the driver cannot say."""
    driver = optional(nvml, nvml.nvmlSystemGetDriverVersion)
    version = optional(nvml, nvml.nvmlSystemGetNVMLVersion)
    cuda = optional(nvml, nvml.nvmlSystemGetCudaDriverVersion)
    return Nvml(
        available=True,
        driver_version=text(driver) if driver is not None else None,
        nvml_version=text(version) if version is not None else None,
        # 12040 → "12.4"; 13000 → "13.0"
        cuda_driver_version=f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda is not None else None,
    )


def gpu(nvml: NvmlApi, index: int, handle: object, verdict: Verdict) -> Gpu:
    """Every fact of one GPU, its level health signals into ``verdict``.

    Required calls raise; optional ones give None.
    """
    name = text(nvml.nvmlDeviceGetName(handle))
    pci = optional(nvml, nvml.nvmlDeviceGetPciInfo, handle)
    pci_device_id: int | None = int(pci.pciDeviceId) if pci is not None else None
    mig_mode = optional(nvml, nvml.nvmlDeviceGetMigMode, handle)
    mig_current = mig_mode is not None and mig_mode[0] == nvml.NVML_DEVICE_MIG_ENABLE
    ecc = optional(nvml, nvml.nvmlDeviceGetEccMode, handle)
    capability = optional(nvml, nvml.nvmlDeviceGetCudaComputeCapability, handle)
    persistence = optional(nvml, nvml.nvmlDeviceGetPersistenceMode, handle)
    power_mw = optional(nvml, nvml.nvmlDeviceGetPowerManagementLimit, handle)
    # The range the board allows, so a policy may raise a limit someone lowered.
    constraints = optional(nvml, nvml.nvmlDeviceGetPowerManagementLimitConstraints, handle)
    uuid = text(nvml.nvmlDeviceGetUUID(handle))
    memory_bytes = _memory_total(nvml, index, handle)
    serial = optional_text(nvml, nvml.nvmlDeviceGetSerial, handle)
    instances = _mig_instances(nvml, index, handle) if mig_current else []
    temperature = _temperature(nvml, handle)
    ecc_uncorrected = level_signals(nvml, handle, bool(ecc and ecc[0]), verdict)
    return Gpu(
        index=index,
        uuid=uuid,
        name=name,
        family=family_of(name, pci_device_id),
        memory_bytes=memory_bytes,
        serial=serial,
        pci_bus_id=text(pci.busId) if pci is not None else None,
        pci_device_id=pci_device_id,
        compute_capability=f"{capability[0]}.{capability[1]}" if capability else None,
        mig_supported=mig_mode is not None,
        mig_current=mig_current,
        mig_pending=mig_mode is not None and mig_mode[1] == nvml.NVML_DEVICE_MIG_ENABLE,
        mig_instances=instances,
        persistence_mode=None if persistence is None else persistence == nvml.NVML_FEATURE_ENABLED,
        power_limit_w=power_mw / 1000 if power_mw is not None else None,
        power_limit_min_w=constraints[0] / 1000 if constraints else None,
        power_limit_max_w=constraints[1] / 1000 if constraints else None,
        ecc_current=bool(ecc[0]) if ecc is not None else None,
        ecc_pending=bool(ecc[1]) if ecc is not None else None,
        ecc_uncorrected_volatile=ecc_uncorrected,
        temperature_c=temperature,
    )


def _memory_total(nvml: NvmlApi, index: int, handle: object) -> int:
    """Framebuffer bytes. An unprivileged caller may be refused on a MIG parent: then 0."""
    memory = optional(nvml, nvml.nvmlDeviceGetMemoryInfo, handle)
    if memory is None:
        log().warning("nvml.memory_unknown", index=index)
        return 0
    return int(memory.total)


def mig_devices(nvml: NvmlApi, handle: object) -> Iterator[tuple[int, object]]:
    """The MIG device handles of a GPU with MIG on, by slot: no GI/CI calls, which need root."""
    slots = optional(nvml, nvml.nvmlDeviceGetMaxMigDeviceCount, handle) or 0
    for slot in range(slots):  # an upper bound with holes, not a count
        try:
            yield slot, nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except (nvml.NVMLError_NotFound, nvml.NVMLError_InvalidArgument):
            continue


def _mig_instances(nvml: NvmlApi, index: int, handle: object) -> list[MigInstance]:
    """MIG devices by the unprivileged path."""
    instances: list[MigInstance] = []
    for slot, mig in mig_devices(nvml, handle):
        try:
            instance = _mig_instance(nvml, mig)
        except nvml.NVMLError_GpuIsLost:
            raise
        except nvml.NVMLError as exc:
            # destroyed between the two calls: it is simply not there any more
            log().warning("nvml.mig_skipped", index=index, slot=slot, error=type(exc).__name__)
            continue
        if instance is None:
            log().warning("nvml.mig_unnamed", index=index, slot=slot)
            continue
        instances.append(instance)
    return instances


def _mig_instance(nvml: NvmlApi, mig: object) -> MigInstance | None:
    """One MIG device; None when its name carries no profile (" MIG <profile>")."""
    _, marker, profile = text(nvml.nvmlDeviceGetName(mig)).partition(" MIG ")
    if not marker or not profile:
        return None
    memory = optional(nvml, nvml.nvmlDeviceGetMemoryInfo, mig)
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
    return optional(nvml, get, handle, nvml.NVML_TEMPERATURE_GPU)
