"""GPUs, MIG instances and GPU health from NVML, behind one seam: a module-like ``nvml`` object.

``NvmlSession(nvml)`` takes anything with the pynvml function surface: the real
``pynvml`` module (nvidia-ml-py, loaded by ``load_pynvml()``) or the fixture's
fake. The same code runs on both, so the fixture tests exercise this module as
it runs on hardware.

A session holds one ``nvmlInit`` and one XID event set from its first
``collect()`` to ``close()``, so the agent's loop keeps both open across
cycles (gpu-health.md §5): events are queued in a registered set between
cycles, and a set created anew never replays earlier ones. ``collect_gpus`` is
the one-shot form: a session of one collection, NVML shut down again after it.

Each physical GPU gets a health verdict (DESIGN H5, gpu-health.md §4): every
signal is read each cycle; ``unhealthy`` wins over ``unknown``, ``unknown``
over ``healthy``, and every reason is reported. Level signals (lost, ECC, row
remapping, retired pages) are read anew each cycle and clear by themselves; an
XID verdict is an edge, kept for the GPU's UUID until the boot id changes.
MIG instances and sharing slots inherit their GPU's verdict on the control
plane's side.

A host without a driver is a CPU-only host, not a crash. A lost GPU stays in
the report, unhealthy, with what an earlier cycle saw of it; a GPU hidden
from this process (NoPermission) is left out and logged.
"""

import contextlib
import ctypes
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TypeVar

import msgspec
import structlog

from shared.files import atomic_write
from shared.gpu import family_of
from shared.inventory import Gpu, MigInstance, Nvml


def _log() -> Any:
    """A logger bound at the time of logging: a module-level one would be cached by
    ``cache_logger_on_first_use`` and escape ``structlog.testing.capture_logs``."""
    return structlog.get_logger(__name__)


T = TypeVar("T")

# Application XIDs: the k8s device plugin's and the DRA driver's default skip list
# (gpu-health.md §3). Any other XID, 999 (unknown) included, makes the GPU unhealthy.
SKIP_XIDS: Final[frozenset[int]] = frozenset({13, 31, 43, 45, 68, 109})
EVENT_DRAIN_CAP: Final = 256  # events taken off the set per cycle; the rest wait for the next
HEALTH_FILE: Final = "gpu-health.json"  # sticky XID verdicts in the agent's state directory

_MAX_REASONS: Final = 32  # the inventory's limit on health_reasons
_MAX_XIDS_PER_GPU: Final = 16
_STATE_MODE: Final = 0o600

Health = Literal["healthy", "unhealthy", "unknown"]


class NvmlApi(Protocol):
    """The part of pynvml the inventory calls (nvidia-ml-py 11.495 … 13.615 names).

    Strings may come back as ``bytes`` (bindings ≤ 11.510) or ``str``. Handles are
    opaque: never compared, hashed or stored beyond one collection. The health
    calls (events, remapped rows, retired pages, ECC counters) are looked up with
    ``getattr``: a binding without one does not watch that signal.
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
    """Initialise NVML, read every GPU and its MIG instances, and shut NVML down.

    One shot: XID events are those queued between this collection's registration
    and its drain (a fake's recorded ones; on hardware, practically none).
    """
    with NvmlSession(nvml) as session:
        return session.collect()


# --- the verdict -------------------------------------------------------------------


@dataclass
class _Verdict:
    """One GPU's reasons this cycle: unhealthy wins over unknown, unknown over healthy."""

    unhealthy: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)

    def bad(self, reason: str) -> None:
        if reason not in self.unhealthy:
            self.unhealthy.append(reason)

    def unsure(self, reason: str) -> None:
        if reason not in self.unknown:
            self.unknown.append(reason)

    def apply(self, gpu: Gpu, xids: Sequence[int]) -> Gpu:
        """The GPU with this verdict and its sticky XIDs (reported first)."""
        unhealthy = [f"xid:{xid}" for xid in xids] + self.unhealthy
        reasons = (unhealthy + self.unknown)[:_MAX_REASONS]
        health: Health = "unhealthy" if unhealthy else "unknown" if self.unknown else "healthy"
        return msgspec.structs.replace(gpu, health=health, health_reasons=reasons)


def _signal(
    nvml: NvmlApi, verdict: _Verdict, signal: str, function: str, *args: object
) -> Any | None:
    """One health signal's reading; None where it does not apply or could not be read.

    NotSupported or FunctionNotFound (or a binding without the call): the signal is
    not applicable to this GPU, neither unhealthy nor unknown. ResetRequired makes the
    GPU unhealthy; any other NVML error makes it unknown with ``<signal>:<error>``.
    A lost GPU is re-raised: the caller reports it lost.
    """
    call: Callable[..., Any] | None = getattr(nvml, function, None)
    if call is None:
        return None
    try:
        return call(*args)
    except nvml.NVMLError_GpuIsLost:
        raise
    except nvml.NVMLError_ResetRequired:
        verdict.bad("reset_required")
    except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
        pass
    except nvml.NVMLError as exc:
        verdict.unsure(f"{signal}:{type(exc).__name__}")
    return None


def _level_signals(nvml: NvmlApi, handle: object, ecc_on: bool, verdict: _Verdict) -> int | None:
    """ECC, row remapping and retired pages into ``verdict``; the volatile uncorrected count.

    gpu-health.md §4: volatile uncorrected ECC > 0, a remap failure, a pending remap
    and pages pending retirement each make the GPU unhealthy.
    """
    ecc: int | None = None
    if ecc_on:  # with ECC off there are no counters (NotSupported): not applicable
        ecc = _signal(
            nvml,
            verdict,
            "ecc_uncorrected_volatile",
            "nvmlDeviceGetTotalEccErrors",
            handle,
            nvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
            nvml.NVML_VOLATILE_ECC,
        )
        if ecc:
            verdict.bad(f"ecc_uncorrected_volatile:{ecc}")
    rows = _signal(nvml, verdict, "remapped_rows", "nvmlDeviceGetRemappedRows", handle)
    if rows is not None:
        _, _, pending, failure = rows  # plain ints: (correctable, uncorrectable, 0/1, 0/1)
        if failure:
            verdict.bad("row_remap_failure")
        if pending:
            verdict.bad("row_remap_pending")
    pages = _signal(
        nvml, verdict, "retired_pages_pending", "nvmlDeviceGetRetiredPagesPendingStatus", handle
    )
    if pages is not None and pages == nvml.NVML_FEATURE_ENABLED:
        verdict.bad("retired_pages_pending")
    return int(ecc) if ecc is not None else None


# --- the session -------------------------------------------------------------------


@dataclass
class _Cycle:
    """What the event set said about the GPUs in one collection, before they are read."""

    verdicts: dict[int, _Verdict] = field(default_factory=dict)
    everyone: list[str] = field(default_factory=list)  # unknown reasons for every GPU

    def of(self, index: int) -> _Verdict:
        return self.verdicts.setdefault(index, _Verdict(unknown=list(self.everyone)))

    def unsure_all(self, reason: str) -> None:
        if reason not in self.everyone:
            self.everyone.append(reason)
        for verdict in self.verdicts.values():
            verdict.unsure(reason)


@dataclass(frozen=True)
class _Watched:
    """A GPU registered on the event set: what attributes an event to it when its handle fails."""

    uuid: str | None
    address: int | None


class _Broken(Exception):
    """The event set is in an undefined state (RegisterEvents said Unknown): free it."""


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
        self.boot_id = boot_id
        self.state_file = state_file if boot_id is not None else None
        self.skip_xids = frozenset(skip_xids)
        self.drain_cap = drain_cap
        self._initialised = False
        self._set: Any | None = None
        self._events_unavailable = False  # the driver or binding has no event sets
        self._wait = "nvmlEventSetWait_v2"
        self._watched: dict[int, _Watched] = {}  # GPU index → registered on the set
        self._unmonitored: set[int] = set()  # GPUs whose XIDs NVML cannot report
        self._xids: dict[str, list[int]] = self._load()  # GPU UUID → critical XIDs this boot
        self._seen: dict[int, Gpu] = {}  # GPU index → what the last cycle that could read it saw
        self._shown: dict[int, tuple[str, list[str]]] = {}  # the verdict last logged per GPU

    def __enter__(self) -> "NvmlSession":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # --- the cycle ---

    def collect(self) -> tuple[Nvml, list[Gpu]]:
        """The NVML facts and every GPU with its health verdict."""
        nvml = self.nvml
        if not self._initialised:
            try:
                nvml.nvmlInit()
            except nvml.NVMLError as exc:
                # LibraryNotFound (no driver), DriverNotLoaded, LibRmVersionMismatch, …: the
                # report carries the error; a CPU-only host is normal, not worth a line per cycle.
                _log().debug("nvml.unavailable", error=type(exc).__name__)
                return Nvml(available=False, error=type(exc).__name__), []
            self._initialised = True
        info = _system(nvml)
        try:
            count = nvml.nvmlDeviceGetCount()
        except nvml.NVMLError as exc:
            _log().warning("nvml.device_count_failed", error=type(exc).__name__)
            info.error = type(exc).__name__
            self.close()  # start afresh next cycle: NVML itself is in trouble
            return info, []
        cycle = _Cycle()
        xids_before = {uuid: list(xids) for uuid, xids in self._xids.items()}
        self._watch(count, cycle)
        gpus = [gpu for index in range(count) if (gpu := self._gpu(index, cycle)) is not None]
        gpus += self._vanished(count, gpus)
        if self._xids != xids_before:
            self._save()
        self._show(gpus)
        return info, gpus

    def _gpu(self, index: int, cycle: _Cycle) -> Gpu | None:
        """One GPU with its verdict; a lost one from what was seen of it; None if hidden."""
        nvml = self.nvml
        verdict = cycle.of(index)
        try:
            gpu = _gpu(nvml, index, nvml.nvmlDeviceGetHandleByIndex(index), verdict)
        except nvml.NVMLError_GpuIsLost:
            return self._unreachable(index, verdict, "gpu_lost")
        except nvml.NVMLError_ResetRequired:
            return self._unreachable(index, verdict, "reset_required")
        except nvml.NVMLError as exc:
            # NoPermission: not in this process's cgroup. The rest of the host is still
            # worth reporting.
            _log().warning("nvml.gpu_skipped", index=index, error=type(exc).__name__)
            return None
        self._seen[index] = gpu
        return verdict.apply(gpu, self._xids.get(gpu.uuid, []))

    def _unreachable(self, index: int, verdict: _Verdict, reason: str) -> Gpu:
        """A GPU no call reaches: as an earlier cycle saw it (live readings dropped), unhealthy.

        Never seen: only its index, with a placeholder UUID and no name or family.
        """
        seen = self._seen.get(index)
        if seen is None:
            gpu = Gpu(index=index, uuid=f"GPU-lost-{index}", name="", family=None, memory_bytes=0)
        else:
            gpu = msgspec.structs.replace(seen, temperature_c=None, ecc_uncorrected_volatile=None)
        verdict.bad(reason)
        return verdict.apply(gpu, self._xids.get(gpu.uuid, []))

    def _vanished(self, count: int, gpus: list[Gpu]) -> list[Gpu]:
        """GPUs seen before that NVML no longer enumerates at all: lost (gpu-health.md §4)."""
        present = {gpu.uuid for gpu in gpus}
        return [
            self._unreachable(index, _Verdict(), "gpu_lost")
            for index, seen in sorted(self._seen.items())
            if index >= count and seen.uuid not in present
        ]

    def _show(self, gpus: list[Gpu]) -> None:
        """One log line each time a GPU's verdict changes, not one per cycle."""
        for gpu in gpus:
            now = (gpu.health, gpu.health_reasons)
            if self._shown.get(gpu.index, ("healthy", [])) != now:
                level = "info" if gpu.health == "healthy" else "warning"
                getattr(_log(), level)(
                    "gpu.health",
                    index=gpu.index,
                    uuid=gpu.uuid,
                    health=gpu.health,
                    reasons=gpu.health_reasons,
                )
            self._shown[gpu.index] = now

    # --- XID events ---

    def _watch(self, count: int, cycle: _Cycle) -> None:
        """Make sure the set exists and every GPU is registered, then drain it."""
        if self._set is None and not self._events_unavailable:
            self._create(cycle)
        if self._set is None:
            return
        try:
            for index in range(count):
                if index not in self._watched and index not in self._unmonitored:
                    self._register(index, cycle)
        except _Broken:
            self._drain(cycle)  # what the set still holds is read before it goes
            self._free()
            return
        self._drain(cycle)

    def _create(self, cycle: _Cycle) -> None:
        nvml = self.nvml
        create: Callable[[], Any] | None = getattr(nvml, "nvmlEventSetCreate", None)
        if create is None:
            self._events_unavailable = True
            return
        try:
            self._set = create()
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound) as exc:
            _log().info("nvml.xid_events_unavailable", error=type(exc).__name__)
            self._events_unavailable = True
        except nvml.NVMLError as exc:
            _log().warning("nvml.event_set_failed", error=type(exc).__name__)
            cycle.unsure_all(f"xid_events:{type(exc).__name__}")

    def _register(self, index: int, cycle: _Cycle) -> None:
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
            uuid = _optional(nvml, nvml.nvmlDeviceGetUUID, handle)
            mask = int(supported(handle)) & nvml.nvmlEventTypeXidCriticalError
            if mask:
                register(handle, mask, self._set)
        except (nvml.NVMLError_GpuIsLost, nvml.NVMLError_ResetRequired):
            return  # the GPU's own reads say so; tried again next cycle
        except (nvml.NVMLError_NotSupported, nvml.NVMLError_FunctionNotFound):
            mask = 0
        except nvml.NVMLError as exc:
            cycle.of(index).unsure(f"xid_events:{type(exc).__name__}")
            _log().warning("nvml.xid_register_failed", index=index, error=type(exc).__name__)
            if isinstance(exc, nvml.NVMLError_Unknown):
                raise _Broken from exc  # the set may be in an undefined state (nvml.h): rebuild
            return
        if not mask:
            # Too old a board or driver: its XIDs are not watched, which is not unhealthy.
            _log().info("nvml.xid_events_unmonitored", index=index)
            self._unmonitored.add(index)
            return
        self._watched[index] = _Watched(text(uuid) if uuid is not None else None, _address(handle))

    def _drain(self, cycle: _Cycle) -> None:
        """Take the queued events off the set, never waiting: timeout 0, until Timeout."""
        nvml = self.nvml
        for _ in range(self.drain_cap):
            wait: Callable[[Any, int], Any] | None = getattr(nvml, self._wait, None)
            try:
                if wait is None:
                    raise nvml.NVMLError_FunctionNotFound()
                event = wait(self._set, 0)
            except nvml.NVMLError_Timeout:
                return  # nothing (more) queued
            except (nvml.NVMLError_FunctionNotFound, nvml.NVMLError_NotSupported) as exc:
                if self._wait == "nvmlEventSetWait_v2":
                    self._wait = "nvmlEventSetWait"  # a driver before _v2: the first version
                    continue
                _log().info("nvml.xid_events_unavailable", error=type(exc).__name__)
                self._events_unavailable = True
                self._free()
                return
            except nvml.NVMLError_GpuIsLost:
                # Not every GPU: each GPU's own reads tell which fell off the bus (§5.3).
                _log().warning("nvml.event_wait_gpu_lost")
                return
            except nvml.NVMLError as exc:
                _log().warning("nvml.event_wait_failed", error=type(exc).__name__)
                for index in self._watched:
                    cycle.of(index).unsure(f"xid_events:{type(exc).__name__}")
                self._free()  # built anew next cycle
                return
            self._event(event)
        _log().info("nvml.xid_events_left_for_next_cycle", cap=self.drain_cap)

    def _event(self, event: Any) -> None:
        nvml = self.nvml
        if int(event.eventType) != nvml.nvmlEventTypeXidCriticalError:
            return
        xid = int(event.eventData)
        uuid = self._uuid_of(event.device)
        if uuid is None:
            _log().warning("gpu.xid_unattributed", xid=xid)
            return
        if xid in self.skip_xids:
            _log().info("gpu.xid_application", uuid=uuid, xid=xid)  # the job's fault, not the GPU's
            return
        _log().warning("gpu.xid", uuid=uuid, xid=xid)
        xids = self._xids.setdefault(uuid, [])
        if xid not in xids and len(xids) < _MAX_XIDS_PER_GPU:
            xids.append(xid)

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

    def _free(self) -> None:
        nvml = self.nvml
        if self._set is not None:
            free: Callable[[Any], None] | None = getattr(nvml, "nvmlEventSetFree", None)
            try:
                if free is not None:
                    free(self._set)
            except nvml.NVMLError as exc:
                _log().warning("nvml.event_set_free_failed", error=type(exc).__name__)
        self._set = None
        self._watched.clear()
        self._unmonitored.clear()

    def close(self) -> None:
        """Free the event set, then shut NVML down; the next ``collect()`` starts afresh."""
        self._free()
        if self._initialised:
            self._initialised = False
            try:
                self.nvml.nvmlShutdown()
            except self.nvml.NVMLError as exc:
                _log().warning("nvml.shutdown_failed", error=type(exc).__name__)

    # --- sticky XID verdicts across restarts ---

    def _load(self) -> dict[str, list[int]]:
        """This boot's XID verdicts from ``state_file``; those of an earlier boot are dropped."""
        if self.state_file is None:
            return {}
        try:
            kept = msgspec.json.decode(self.state_file.read_bytes(), type=_HealthFile)
        except FileNotFoundError:
            return {}
        except (OSError, msgspec.DecodeError) as exc:
            _log().warning("gpu.health_file_unreadable", path=str(self.state_file), error=str(exc))
            return {}
        if kept.boot_id != self.boot_id:
            with contextlib.suppress(OSError):
                self.state_file.unlink()  # the host rebooted: its GPUs start with a clean slate
            return {}
        return {uuid: list(xids)[:_MAX_XIDS_PER_GPU] for uuid, xids in kept.xids.items()}

    def _save(self) -> None:
        if self.state_file is None:
            return
        body = _HealthFile(boot_id=self.boot_id or "", xids=self._xids)
        try:
            atomic_write(self.state_file, msgspec.json.encode(body), _STATE_MODE)
        except OSError as exc:  # kept in memory all the same
            _log().warning("gpu.health_file_unwritable", path=str(self.state_file), error=str(exc))


class _HealthFile(msgspec.Struct, rename="camel"):
    """gpu-health.json: the critical XIDs seen per GPU UUID since the boot ``boot_id``."""

    boot_id: str
    xids: dict[str, list[int]]


def _address(handle: object) -> int | None:
    """Where a ctypes handle points (stable per device, unlike the handle objects)."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value  # type: ignore[arg-type]
    except (TypeError, ctypes.ArgumentError):
        return None


# --- one GPU's facts -----------------------------------------------------------------


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


def _gpu(nvml: NvmlApi, index: int, handle: object, verdict: _Verdict) -> Gpu:
    """Every fact of one GPU, its level health signals into ``verdict``.

    Required calls raise; optional ones give None.
    """
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
    uuid = text(nvml.nvmlDeviceGetUUID(handle))
    memory_bytes = _memory_total(nvml, index, handle)
    serial = _optional_text(nvml, nvml.nvmlDeviceGetSerial, handle)
    instances = _mig_instances(nvml, index, handle) if mig_current else []
    temperature = _temperature(nvml, handle)
    ecc_uncorrected = _level_signals(nvml, handle, bool(ecc and ecc[0]), verdict)
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


def _optional_text(nvml: NvmlApi, call: Callable[..., str | bytes], *args: object) -> str | None:
    """A string fact, or None when the GPU cannot give it (serial on GeForce)."""
    value = _optional(nvml, call, *args)
    return text(value) if value is not None else None


def _optional(nvml: NvmlApi, call: Callable[..., T], *args: object) -> T | None:
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
