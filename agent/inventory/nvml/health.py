"""GPU health: the verdict rule, the level signals read each cycle, and sticky XID verdicts.

Each physical GPU gets a health verdict (DESIGN H5, gpu-health.md §4): every
signal is read each cycle; ``unhealthy`` wins over ``unknown``, ``unknown``
over ``healthy``, and every reason is reported. Level signals (lost, ECC, row
remapping, retired pages) are read anew each cycle and clear by themselves; an
XID verdict is an edge, kept for the GPU's UUID until the boot id changes.
MIG instances and sharing slots inherit their GPU's verdict on the control
plane's side.
"""

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import msgspec

from agent.inventory.nvml.api import NvmlApi, log
from shared.files import atomic_write
from shared.inventory import Gpu

# Application XIDs: the k8s device plugin's and the DRA driver's default skip list
# (gpu-health.md §3). Any other XID, 999 (unknown) included, makes the GPU unhealthy.
SKIP_XIDS: Final[frozenset[int]] = frozenset({13, 31, 43, 45, 68, 109})
HEALTH_FILE: Final = "gpu-health.json"  # sticky XID verdicts in the agent's state directory

_MAX_REASONS: Final = 32  # the inventory's limit on health_reasons
_MAX_XIDS_PER_GPU: Final = 16
_STATE_MODE: Final = 0o600

Health = Literal["healthy", "unhealthy", "unknown"]


@dataclass
class Verdict:
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


@dataclass
class Cycle:
    """What the event set said about the GPUs in one collection, before they are read."""

    verdicts: dict[int, Verdict] = field(default_factory=dict)
    everyone: list[str] = field(default_factory=list)  # unknown reasons for every GPU

    def of(self, index: int) -> Verdict:
        return self.verdicts.setdefault(index, Verdict(unknown=list(self.everyone)))

    def unsure_all(self, reason: str) -> None:
        if reason not in self.everyone:
            self.everyone.append(reason)
        for verdict in self.verdicts.values():
            verdict.unsure(reason)


def _signal(
    nvml: NvmlApi, verdict: Verdict, signal: str, function: str, *args: object
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


def level_signals(nvml: NvmlApi, handle: object, ecc_on: bool, verdict: Verdict) -> int | None:
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


class StickyXids:
    """The critical XIDs seen per GPU UUID this boot: in memory, and in ``path`` when given.

    With a path and a known boot id, a restarted agent still reports the GPU
    unhealthy until the host reboots (or an operator deletes the file).
    """

    def __init__(self, path: Path | None, boot_id: str | None) -> None:
        self.path = path if boot_id is not None else None
        self.boot_id = boot_id
        self._xids = self._load()

    def of(self, uuid: str) -> list[int]:
        return self._xids.get(uuid, [])

    def add(self, uuid: str, xid: int) -> bool:
        """Keep ``xid`` for the GPU; False when it was already kept (or the GPU's are full)."""
        xids = self._xids.setdefault(uuid, [])
        if xid in xids or len(xids) >= _MAX_XIDS_PER_GPU:
            return False
        xids.append(xid)
        return True

    def _load(self) -> dict[str, list[int]]:
        """This boot's XID verdicts from ``path``; those of an earlier boot are dropped."""
        if self.path is None:
            return {}
        try:
            kept = msgspec.json.decode(self.path.read_bytes(), type=_HealthFile)
        except FileNotFoundError:
            return {}
        except (OSError, msgspec.DecodeError) as exc:
            log().warning("gpu.health_file_unreadable", path=str(self.path), error=str(exc))
            return {}
        if kept.boot_id != self.boot_id:
            with contextlib.suppress(OSError):
                self.path.unlink()  # the host rebooted: its GPUs start with a clean slate
            return {}
        return {uuid: list(xids)[:_MAX_XIDS_PER_GPU] for uuid, xids in kept.xids.items()}

    def save(self) -> None:
        if self.path is None:
            return
        body = _HealthFile(boot_id=self.boot_id or "", xids=self._xids)
        try:
            atomic_write(self.path, msgspec.json.encode(body), _STATE_MODE)
        except OSError as exc:  # kept in memory all the same
            log().warning("gpu.health_file_unwritable", path=str(self.path), error=str(exc))


class _HealthFile(msgspec.Struct, rename="camel"):
    """gpu-health.json: the critical XIDs seen per GPU UUID since the boot ``boot_id``."""

    boot_id: str
    xids: dict[str, list[int]]
