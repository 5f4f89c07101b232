"""Applying a NodeSpec to a host: compare with the host, then change only what differs.

Files are written atomically (temp, fsync, rename) under ``root`` (``/`` on a
host, a temporary directory in tests and in ``render --out``), so an
interrupted apply leaves every file old or new. Modules, sysctls, services
and commands go through a ``Runner``, the seam between the agent and the
host's tools. Each unit ends ``applied``, ``unchanged``, ``failed`` (with the
error), ``pending-reboot`` or ``waiting-drain``; a second apply of the same spec
changes nothing.

Drain-gated units (H4): a unit that needs a drain and names, in ``gpus``, a GPU
of the spec's ``booked_gpus`` is held back while it would change the host: it
ends ``waiting-drain`` (with ``waitingFor``, the booked GPUs), nothing of it is
done and it is not recorded, so a later spec whose GPUs are idle applies it. One
that is already in effect (its file as written, its command run) changes nothing
and ends ``unchanged`` as usual, so bookings never hold back what is already
done. The rest of the spec is applied as usual. Undoing a drain unit that left
the spec waits the same way.

What is already true is read from the host (file contents, /proc/modules,
/proc/sys, /proc/cmdline); what cannot be read back (a command, an enabled
service) is remembered in ``applied.json`` in the state directory as the hash
of the unit last applied.

``unit_commands`` and ``undo_commands`` (with ``undone_file``, ``undo_order``) say what
each unit runs, so that the dry-run plan (agent/plan.py) lists exactly what an apply would.
"""

import hashlib
import json
import subprocess
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import msgspec
import structlog

from agent.state import set_aside
from shared.files import atomic_write
from shared.nodespec import NodeSpecUnits, Unit
from shared.sdnotify import Notifier

log = structlog.get_logger("agent.apply")

Status = Literal["applied", "unchanged", "failed", "pending-reboot", "waiting-drain"]
BOOT_DROP_IN = "etc/default/grub.d/90-better-compute.cfg"
BOOT_DROP_IN_MODE = 0o644
RECORD = "applied.json"


@dataclass(frozen=True)
class Outcome:
    returncode: int
    output: str


class Runner(Protocol):
    def run(self, argv: Sequence[str]) -> Outcome: ...


class HostRunner:
    """The host's own tools, with a time limit so a stuck command cannot stall the agent.

    A MIG change or a kubeadm join can outlast the watchdog, so systemd is told to wait.
    """

    def __init__(self, notifier: Notifier, timeout: float = 600) -> None:
        self.notifier = notifier
        self.timeout = timeout

    def run(self, argv: Sequence[str]) -> Outcome:
        self.notifier.extend_timeout(self.timeout + 30)
        try:
            done = subprocess.run(
                list(argv), capture_output=True, text=True, timeout=self.timeout, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            return Outcome(127, f"{argv[0]}: {exc}")
        finally:
            self.notifier.watchdog()
        return Outcome(done.returncode, (done.stdout + done.stderr).strip()[-2000:])


class RecordingRunner:
    """For a root that is a directory, not this host: commands are written down, not run.

    ``modprobe`` or ``systemctl`` cannot act on a directory; recording them under the root
    (``var/lib/better-compute/commands.log``) shows what a host would have run. What a host
    would then show in /proc (a loaded module, a sysctl's value) is written there too, so a
    second apply into the directory finds it done, as on a host.
    """

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = root / "var/lib/better-compute/commands.log"

    def run(self, argv: Sequence[str]) -> Outcome:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as handle:
            handle.write(json.dumps(list(argv)) + "\n")
        if argv[:1] == ["modprobe"] and len(argv) == 2:
            modules = self.root / "proc/modules"
            modules.parent.mkdir(parents=True, exist_ok=True)
            with modules.open("a") as handle:
                handle.write(f"{argv[1].replace('-', '_')} 0 0 - Live 0x0\n")
        if argv[:2] == ["sysctl", "-w"] and len(argv) == 3:
            key, _, value = argv[2].partition("=")
            target = self.root / "proc/sys" / key.replace(".", "/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(value + "\n")
        return Outcome(0, "recorded")


def runner_for(root: Path, notifier: Notifier) -> Runner:
    """The host's tools for `/`; a recording runner for any other root."""
    return HostRunner(notifier) if root.resolve() == Path("/") else RecordingRunner(root)


class UnitResult(msgspec.Struct, rename="camel", omit_defaults=True):
    id: str
    status: Status
    error: str | None = None
    waiting_for: list[str] = []  # waiting-drain: the booked GPUs the unit touches (H4)


class ApplyReport(msgspec.Struct, rename="camel"):
    """What the agent reports as `applied`: the spec version and each unit's outcome."""

    version: str
    units: list[UnitResult]


def boot_drop_in(kernel_args: str) -> str:
    """The GRUB drop-in that appends our kernel arguments (update-grub reads grub.d/*.cfg)."""
    return f'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {kernel_args}"\n'


def _digest(unit: Unit) -> str:
    """What the host was made to do; a drain unit's GPUs are not part of it.

    ``gpus`` says which GPUs wait for the unit (H4), not what applying it does: a GPU
    that reaches its layout leaves a MIG apply's gpus, which is no reason to run it again.
    Units without GPUs hash as they always did (an empty list is left out).
    """
    return hashlib.sha256(msgspec.json.encode(msgspec.structs.replace(unit, gpus=[]))).hexdigest()


def _waiting_for(needs: str, gpus: Sequence[str], booked: frozenset[str]) -> list[str]:
    """The booked GPUs a drain-gated unit touches (H4); empty when it may go ahead."""
    return sorted(booked.intersection(gpus)) if needs == "drain" else []


Entry = dict[str, Any]  # what the record keeps of one applied unit


def unit_commands(unit: Unit, *, enabled: bool = False) -> list[list[str]]:
    """The commands applying ``unit`` runs, in order, when the host is not yet as it says.

    A file unit runs none (it is written); a kernel-args unit writes the boot loader drop-in
    and then runs update-grub. A service the agent enabled before (``enabled``) is restarted
    on its new definition when it or a unit naming it in ``restarts`` changed.
    """
    if unit.kind == "kernel-args":
        return [["update-grub"]]  # folds grub.d/*.cfg into the boot configuration
    if unit.kind == "module":
        return [["modprobe", unit.content]]
    if unit.kind == "sysctl":
        key, _, value = unit.content.partition("=")
        return [["sysctl", "-w", f"{key.strip()}={value.strip()}"]]
    if unit.kind == "service":
        start = ["restart", unit.content] if enabled else ["enable", "--now", unit.content]
        # A changed unit file is read only after a reload.
        return [["systemctl", "daemon-reload"], ["systemctl", *start]]
    if unit.kind == "command":
        return [list(unit.argv)]
    return []


def undone_file(entry: Entry) -> str | None:
    """The file (a host path) undoing a unit that left the spec deletes: its file or drop-in."""
    if entry["kind"] == "file":
        return str(entry["path"])
    return "/" + BOOT_DROP_IN if entry["kind"] == "kernel-args" else None


def undo_commands(entry: Entry) -> list[list[str]]:
    """The commands undoing a unit that left the spec runs, after its file is deleted.

    A module stays loaded, a sysctl keeps its value and a command's effect stays until the
    next boot; their files (if any) are file units, deleted on their own.
    """
    if entry["kind"] == "kernel-args":
        return [["update-grub"]]  # folds grub.d/*.cfg into the boot configuration
    if entry["kind"] == "service":
        return [["systemctl", "disable", "--now", entry["service"]]]
    return []


def undo_order(record: Mapping[str, Entry], wanted: Collection[str]) -> list[str]:
    """The recorded units a spec no longer has, services first (stopped before their files go)."""
    return sorted(
        (i for i in record if i not in wanted), key=lambda i: record[i]["kind"] != "service"
    )


class RecordDamaged(ValueError):
    """applied.json cannot be read back as a record of applied units."""


def read_record(path: Path) -> dict[str, Entry]:
    """What earlier applies did (empty when nothing was applied); RecordDamaged if unreadable."""
    try:
        found = json.loads(path.read_bytes())
    except FileNotFoundError:
        return {}
    except ValueError as exc:  # not UTF-8, not JSON
        raise RecordDamaged(str(exc)) from None
    if not isinstance(found, dict) or not all(
        isinstance(entry, dict) and "kind" in entry for entry in found.values()
    ):
        raise RecordDamaged("not a record of applied units")
    return dict(found)


class Applier:
    def __init__(self, root: Path, state_dir: Path, runner: Runner) -> None:
        self.root = root
        self.record_path = state_dir / RECORD
        self.runner = runner

    def _on_host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def _record(self) -> dict[str, Entry]:
        """What earlier applies did; a damaged record is set aside (R9) and applying starts afresh."""
        try:
            return read_record(self.record_path)
        except RecordDamaged as exc:
            set_aside(self.record_path, str(exc))
            return {}

    def apply(self, spec: NodeSpecUnits) -> ApplyReport:
        """Apply every unit, then undo the units an earlier spec had and this one has not.

        A drain-gated unit touching a booked GPU that is not in effect yet waits (H4).
        """
        record = self._record()
        booked = frozenset(spec.booked_gpus)
        results: list[UnitResult] = []
        for unit in spec.units:
            had = record.get(unit.id)
            try:
                waiting = _waiting_for(unit.needs, unit.gpus, booked)
                if waiting and not self._in_effect(unit, spec, had):
                    # Not recorded (what an earlier spec did stays recorded): a later spec
                    # whose GPUs are idle applies it.
                    log.info("waiting for a drain", unit=unit.id, booked=waiting)
                    results.append(UnitResult(unit.id, "waiting-drain", waiting_for=waiting))
                    continue
                status, entry = self._apply(unit, spec, had)
            except (OSError, CommandFailed) as exc:
                # Not recorded: a failed unit is tried again next time.
                results.append(UnitResult(unit.id, "failed", error_text(exc)))
                continue
            if unit.needs == "drain" and unit.gpus:
                entry = {**entry, "gpus": list(unit.gpus)}  # undoing it waits for them too
            record[unit.id] = entry
            results.append(UnitResult(unit.id, status))
        for unit_id in undo_order(record, {unit.id for unit in spec.units}):
            held = record[unit_id].get("gpus")
            waiting = _waiting_for("drain", held if isinstance(held, list) else [], booked)
            if waiting:
                log.info("waiting for a drain", unit=unit_id, booked=waiting, removing=True)
                results.append(UnitResult(unit_id, "waiting-drain", waiting_for=waiting))
                continue
            try:
                status = self._remove(record[unit_id])
            except (OSError, CommandFailed) as exc:
                results.append(UnitResult(unit_id, "failed", error_text(exc)))
                continue
            del record[unit_id]
            results.append(UnitResult(unit_id, status))
        atomic_write(self.record_path, json.dumps(record, indent=1, sort_keys=True).encode(), 0o600)
        return ApplyReport(version=spec.version, units=results)

    def _apply(self, unit: Unit, spec: NodeSpecUnits, had: Entry | None) -> tuple[Status, Entry]:
        entry: Entry = {"kind": unit.kind, "key": _digest(unit)}
        if unit.kind == "file":
            assert unit.path is not None
            return self._file(unit), {**entry, "path": unit.path}
        if unit.kind == "kernel-args":
            return self._kernel_args(unit, had, entry)
        if unit.kind == "module":
            return self._module(unit), entry
        if unit.kind == "sysctl":
            return self._sysctl(unit), entry
        if unit.kind == "service":
            return self._service(unit, spec, had, entry)
        if unit.kind == "command":
            return self._command(unit, had, entry)
        raise CommandFailed(f"unit kind {unit.kind} is not known to this agent")

    def _in_effect(self, unit: Unit, spec: NodeSpecUnits, had: Entry | None) -> bool:
        """Whether applying the unit would change nothing on the host; reads, never writes."""
        entry: Entry = {"kind": unit.kind, "key": _digest(unit)}
        if unit.kind == "file":
            return self._file_in_place(unit)
        if unit.kind == "module":
            return self._module_loaded(unit)
        if unit.kind == "sysctl":
            return self._sysctl_set(unit)
        if unit.kind == "service":
            return had is not None and had.get("key") == self._service_key(unit, spec, entry)
        if unit.kind == "command":
            return had is not None and had.get("key") == self._command_key(unit, entry)
        return False  # kernel arguments (never drain-gated) and unknown kinds: not known done

    def _file_in_place(self, unit: Unit) -> bool:
        assert unit.path is not None
        target = self._on_host(unit.path)
        return (
            target.exists()
            and target.read_bytes() == unit.content.encode()
            and (target.stat().st_mode & 0o7777) == unit.mode
        )

    def _file(self, unit: Unit) -> Status:
        assert unit.path is not None
        if self._file_in_place(unit):
            return "unchanged"
        atomic_write(self._on_host(unit.path), unit.content.encode(), unit.mode)
        return "pending-reboot" if unit.needs == "reboot" else "applied"

    def _kernel_args(self, unit: Unit, had: Entry | None, entry: Entry) -> tuple[Status, Entry]:
        """A boot loader drop-in; the arguments take effect at the next boot.

        Arguments an earlier spec set and this one dropped stay "retired" until the host
        boots without them, so removing `isolcpus` is pending until a reboot too.
        """
        drop_in = self._on_host(BOOT_DROP_IN)
        text = boot_drop_in(unit.content)
        wanted = unit.content.split()
        retired = set((had or {}).get("retired", [])) | (
            set((had or {}).get("args", [])) - set(wanted)
        )
        if (
            not drop_in.exists()
            or drop_in.read_text() != text
            or (had or {}).get("key") != entry["key"]
        ):
            atomic_write(drop_in, text.encode(), BOOT_DROP_IN_MODE)
            self._run(unit_commands(unit))  # a failure leaves the record behind: tried again
        cmdline = self._on_host("proc/cmdline")
        running = set(cmdline.read_text().split()) if cmdline.exists() else set()
        booted = set(wanted) <= running and not (retired & running)
        entry = {**entry, "args": wanted, "retired": [] if booted else sorted(retired)}
        return ("unchanged" if booted else "pending-reboot"), entry

    def _module_loaded(self, unit: Unit) -> bool:
        name = unit.content.replace("-", "_")
        modules = self._on_host("proc/modules")
        loaded = modules.exists() and any(
            line.split(" ", 1)[0] == name for line in modules.read_text().splitlines()
        )
        return loaded or self._on_host(f"sys/module/{name}").exists()  # built-ins show in /sys

    def _module(self, unit: Unit) -> Status:
        if self._module_loaded(unit):
            return "unchanged"
        self._run(unit_commands(unit))
        return "applied"

    def _sysctl_set(self, unit: Unit) -> bool:
        key, _, value = unit.content.partition("=")
        current = self._on_host("proc/sys/" + key.strip().replace(".", "/"))
        return current.exists() and current.read_text().split() == value.strip().split()

    def _sysctl(self, unit: Unit) -> Status:
        if self._sysctl_set(unit):
            return "unchanged"
        self._run(unit_commands(unit))
        return "applied"

    def _service(
        self, unit: Unit, spec: NodeSpecUnits, had: Entry | None, entry: Entry
    ) -> tuple[Status, Entry]:
        """Enabled and started once; restarted whenever a unit that names it in `restarts` moved.

        The key covers those units, so a restart that failed is tried again next time.
        """
        entry = {**entry, "key": self._service_key(unit, spec, entry), "service": unit.content}
        if had is not None and had.get("key") == entry["key"]:
            return "unchanged", entry
        self._run(unit_commands(unit, enabled=had is not None))
        return "applied", entry

    @staticmethod
    def _service_key(unit: Unit, spec: NodeSpecUnits, entry: Entry) -> str:
        """The service's own key and those of the units that restart it."""
        feeding = sorted(_digest(u) for u in spec.units if unit.content in u.restarts)
        return hashlib.sha256((entry["key"] + "".join(feeding)).encode()).hexdigest()

    def _boot(self) -> str:
        boot_id = self._on_host("proc/sys/kernel/random/boot_id")
        return boot_id.read_text().strip() if boot_id.exists() else ""

    def _command(self, unit: Unit, had: Entry | None, entry: Entry) -> tuple[Status, Entry]:
        """Run once per change of the unit, and once per boot for every-boot commands."""
        entry = {**entry, "key": self._command_key(unit, entry)}
        if had is not None and had.get("key") == entry["key"]:
            return "unchanged", entry
        self._run(unit_commands(unit))
        return ("pending-reboot" if unit.needs == "reboot" else "applied"), entry

    def _command_key(self, unit: Unit, entry: Entry) -> str:
        """An every-boot command's key carries the boot id: it runs again after each boot."""
        return f"{entry['key']}@{self._boot()}" if unit.every_boot else str(entry["key"])

    def _remove(self, entry: Entry) -> Status:
        """Undo what a unit that left the spec installed: its file, drop-in or service."""
        path = undone_file(entry)
        if path is not None:
            self._on_host(path).unlink(missing_ok=True)
        self._run(undo_commands(entry))
        return "pending-reboot" if entry["kind"] == "kernel-args" else "applied"

    def _run(self, commands: Sequence[Sequence[str]]) -> None:
        for argv in commands:
            self._must(argv)

    def _must(self, argv: Sequence[str]) -> None:
        outcome = self.runner.run(argv)
        log.info("ran", argv=list(argv), code=outcome.returncode)
        if outcome.returncode != 0:
            raise CommandFailed(f"{' '.join(argv)} exited {outcome.returncode}: {outcome.output}")


def error_text(exc: BaseException) -> str:
    """An OSError or a failed command, as a unit's (or a booking's) outcome says it."""
    if isinstance(exc, OSError):
        return f"{exc.strerror or exc}: {exc.filename or ''}".strip()
    return str(exc)


class CommandFailed(Exception):
    pass
