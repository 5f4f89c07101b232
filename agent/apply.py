"""Applying a NodeSpec to a host: compare with the host, then change only what differs.

Files are written atomically (temp, fsync, rename) under ``root`` (``/`` on a
host, a temporary directory in tests and in ``render --out``), so an
interrupted apply leaves every file old or new. Modules, sysctls, services
and commands go through a ``Runner``, the seam between the agent and the
host's tools. Each unit ends ``applied``, ``unchanged``, ``failed`` (with the
error) or ``pending-reboot``; a second apply of the same spec changes nothing.

What is already true is read from the host (file contents, /proc/modules,
/proc/sys, /proc/cmdline); what cannot be read back (a command, an enabled
service) is remembered in ``applied.json`` in the state directory as the hash
of the unit last applied.
"""

import hashlib
import json
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import msgspec
import structlog

from shared.files import atomic_write
from shared.nodespec import NodeSpecUnits, Unit
from shared.sdnotify import Notifier

log = structlog.get_logger("agent.apply")

Status = Literal["applied", "unchanged", "failed", "pending-reboot"]
BOOT_DROP_IN = "etc/default/grub.d/90-better-compute.cfg"
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
    (``var/lib/better-compute/commands.log``) shows what a host would have run.
    """

    def __init__(self, root: Path) -> None:
        self.log = root / "var/lib/better-compute/commands.log"

    def run(self, argv: Sequence[str]) -> Outcome:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("a") as handle:
            handle.write(json.dumps(list(argv)) + "\n")
        return Outcome(0, "recorded")


def runner_for(root: Path, notifier: Notifier) -> Runner:
    """The host's tools for `/`; a recording runner for any other root."""
    return HostRunner(notifier) if root.resolve() == Path("/") else RecordingRunner(root)


class UnitResult(msgspec.Struct, rename="camel", omit_defaults=True):
    id: str
    status: Status
    error: str | None = None


class ApplyReport(msgspec.Struct, rename="camel"):
    """What the agent reports as `applied`: the spec version and each unit's outcome."""

    version: str
    units: list[UnitResult]


def boot_drop_in(kernel_args: str) -> str:
    """The GRUB drop-in that appends our kernel arguments (update-grub reads grub.d/*.cfg)."""
    return f'GRUB_CMDLINE_LINUX_DEFAULT="$GRUB_CMDLINE_LINUX_DEFAULT {kernel_args}"\n'


def _digest(unit: Unit) -> str:
    return hashlib.sha256(msgspec.json.encode(unit)).hexdigest()


class Applier:
    def __init__(self, root: Path, state_dir: Path, runner: Runner) -> None:
        self.root = root
        self.record_path = state_dir / RECORD
        self.runner = runner

    def _remembered(self, unit: Unit) -> str:
        """What the record keeps for a unit: its digest, and the boot for every-boot commands."""
        return _digest(unit) + (f"@{self._boot()}" if unit.every_boot else "")

    def _on_host(self, path: str) -> Path:
        return self.root / path.lstrip("/")

    def _record(self) -> dict[str, str]:
        if not self.record_path.exists():
            return {}
        return dict(json.loads(self.record_path.read_text()))

    def apply(self, spec: NodeSpecUnits) -> ApplyReport:
        record = self._record()
        results: list[UnitResult] = []
        changed_units: list[Unit] = []
        for unit in spec.units:
            try:
                status = self._apply(unit, record, changed_units)
            except OSError as exc:
                status, error = "failed", f"{exc.strerror or exc}: {exc.filename or ''}".strip()
                results.append(UnitResult(unit.id, status, error))
                continue
            except CommandFailed as exc:
                results.append(UnitResult(unit.id, "failed", str(exc)))
                continue
            if status == "applied":
                changed_units.append(unit)
            record[unit.id] = self._remembered(unit)
            results.append(UnitResult(unit.id, status))
        # Only the units that ended well are remembered; a failed one is tried again next time.
        failed = {r.id for r in results if r.status == "failed"}
        kept = {key: value for key, value in record.items() if key not in failed}
        atomic_write(self.record_path, json.dumps(kept, indent=1, sort_keys=True).encode(), 0o600)
        return ApplyReport(version=spec.version, units=results)

    def _apply(self, unit: Unit, record: dict[str, str], changed: list[Unit]) -> Status:
        if unit.kind == "file":
            return self._file(unit)
        if unit.kind == "kernel-args":
            return self._kernel_args(unit)
        if unit.kind == "module":
            return self._module(unit)
        if unit.kind == "sysctl":
            return self._sysctl(unit)
        if unit.kind == "service":
            return self._service(unit, record, changed)
        return self._command(unit, record)

    def _file(self, unit: Unit) -> Status:
        assert unit.path is not None
        target = self._on_host(unit.path)
        data = unit.content.encode()
        if (
            target.exists()
            and target.read_bytes() == data
            and (target.stat().st_mode & 0o7777) == unit.mode
        ):
            return "unchanged"
        atomic_write(target, data, unit.mode)
        return "pending-reboot" if unit.needs == "reboot" else "applied"

    def _kernel_args(self, unit: Unit) -> Status:
        """A boot loader drop-in; the arguments take effect at the next boot."""
        drop_in = self._on_host(BOOT_DROP_IN)
        text = boot_drop_in(unit.content)
        if not drop_in.exists() or drop_in.read_text() != text:
            atomic_write(drop_in, text.encode(), 0o644)
            self._must(["update-grub"])
        cmdline = self._on_host("proc/cmdline")
        booted = cmdline.exists() and set(unit.content.split()) <= set(cmdline.read_text().split())
        return "unchanged" if booted else "pending-reboot"

    def _module(self, unit: Unit) -> Status:
        modules = self._on_host("proc/modules")
        loaded = modules.exists() and any(
            line.split(" ", 1)[0] == unit.content.replace("-", "_")
            for line in modules.read_text().splitlines()
        )
        if loaded:
            return "unchanged"
        self._must(["modprobe", unit.content])
        return "applied"

    def _sysctl(self, unit: Unit) -> Status:
        key, _, value = unit.content.partition("=")
        key, value = key.strip(), value.strip()
        current = self._on_host("proc/sys/" + key.replace(".", "/"))
        if current.exists() and current.read_text().split() == value.split():
            return "unchanged"
        self._must(["sysctl", "-w", f"{key}={value}"])
        return "applied"

    def _service(self, unit: Unit, record: dict[str, str], changed: list[Unit]) -> Status:
        name = unit.content
        if record.get(unit.id) != _digest(unit):
            self._must(["systemctl", "daemon-reload"])
            self._must(["systemctl", "enable", "--now", name])
            return "applied"
        if any(name in other.restarts for other in changed):
            # A changed unit file is read only after a reload: restart the new definition.
            self._must(["systemctl", "daemon-reload"])
            self._must(["systemctl", "restart", name])
            return "applied"
        return "unchanged"

    def _boot(self) -> str:
        boot_id = self._on_host("proc/sys/kernel/random/boot_id")
        return boot_id.read_text().strip() if boot_id.exists() else ""

    def _command(self, unit: Unit, record: dict[str, str]) -> Status:
        if record.get(unit.id) == self._remembered(unit):
            return "unchanged"
        self._must(unit.argv)
        return "pending-reboot" if unit.needs == "reboot" else "applied"

    def _must(self, argv: Sequence[str]) -> None:
        outcome = self.runner.run(argv)
        log.info("ran", argv=list(argv), code=outcome.returncode)
        if outcome.returncode != 0:
            raise CommandFailed(f"{' '.join(argv)} exited {outcome.returncode}: {outcome.output}")


class CommandFailed(Exception):
    pass
