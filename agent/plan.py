"""The plan: what applying a NodeSpec would do to a host, in the order the agent does it.

``describe`` is pure: the spec and the host as ``read_host`` found it give the plan.
Its ``units`` are the spec's units in apply order, each with the files it writes
(the kernel arguments' boot loader drop-in included) and the commands it runs
(agent/apply.py's own list: update-grub, modprobe, sysctl -w, systemctl
daemon-reload and enable or restart, the unit's command), then the units an
earlier apply left that this spec undoes. ``bookings`` are the delivery steps that
follow the units (agent/delivery.py ``Deliverer.plan``: D5, D7): per booking, the
files written (with their content), deleted, and the commands run (systemctl
daemon-reload, start or stop of its slice). An apply skips a unit the host already
is as it says (the file in place, the module loaded, the command run for this
content); the ``diff`` shows where the host is not yet. It compares with the host:
files that differ (a unified diff) or are new, kernel arguments to add or to
remove against /proc/cmdline, MIG layouts that change per GPU against the
inventory. ``read_host`` is the one place the host is read; ``write_tree``
writes the spec's files under a directory (``render --out``).
"""

import difflib
import json
import shlex
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.apply import (
    BOOT_DROP_IN,
    BOOT_DROP_IN_MODE,
    Entry,
    RecordDamaged,
    boot_drop_in,
    read_record,
    undo_commands,
    undo_order,
    undone_file,
    unit_commands,
)
from shared.files import atomic_write
from shared.inventory import Inventory
from shared.nodespec import NodeSpecUnits, Unit
from shared.render.miglayout import MIG_PARTED_CONF

DROP_IN_PATH = "/" + BOOT_DROP_IN


@dataclass(frozen=True)
class HostFile:
    """A file as the host has it, or why it could not be read."""

    content: bytes = b""
    mode: int = 0
    error: str | None = None


@dataclass(frozen=True)
class Host:
    """What the plan compares with: the host as ``read_host`` found it under ``root``."""

    root: str
    files: Mapping[str, HostFile] = field(default_factory=dict)  # host path → file; absent: none
    cmdline: tuple[str, ...] | None = None  # /proc/cmdline; None where there is none to read
    inventory: Inventory | None = None  # its GPUs' MIG mode and instances
    record: Mapping[str, Entry] = field(default_factory=dict)  # what earlier applies did


def _written(unit: Unit) -> tuple[str, str, int] | None:
    """The file a unit writes: (host path, content, mode)."""
    if unit.kind == "file" and unit.path is not None:
        return unit.path, unit.content, unit.mode
    if unit.kind == "kernel-args":
        return DROP_IN_PATH, boot_drop_in(unit.content), BOOT_DROP_IN_MODE
    return None


def write_tree(spec: NodeSpecUnits, out: Path) -> list[str]:
    """Write every file the spec installs under ``out``; returns the paths as on the host."""
    written = []
    for unit in spec.units:
        target = _written(unit)
        if target is not None:
            path, content, mode = target
            atomic_write(out / path.lstrip("/"), content.encode(), mode)
            written.append(path)
    return written


def read_host(
    spec: NodeSpecUnits,
    root: Path,
    inventory: Inventory | None,
    record: Path | None = None,
    bookings: Sequence[dict[str, Any]] = (),
) -> Host:
    """The host under ``root`` as far as the plan compares: the files the spec writes or an
    earlier apply left (``record``: the agent's applied.json), those the ``bookings`` steps
    write or delete, /proc/cmdline, and the inventory."""
    found = {} if record is None else _record(record)
    paths = {DROP_IN_PATH} | {t[0] for t in map(_written, spec.units) if t is not None}
    paths |= {p for p in map(undone_file, found.values()) if p is not None}
    for step in bookings:
        paths |= {f["path"] for f in step["files"]} | set(step["delete"])
    files = {}
    for path in sorted(paths):
        target = root / path.lstrip("/")
        try:
            files[path] = HostFile(target.read_bytes(), target.stat().st_mode & 0o7777)
        except FileNotFoundError:
            continue
        except OSError as exc:
            files[path] = HostFile(error=exc.strerror or str(exc))
    try:
        cmdline: tuple[str, ...] | None = tuple((root / "proc/cmdline").read_text().split())
    except OSError:
        cmdline = None
    return Host(str(root), files, cmdline, inventory, found)


def _record(path: Path) -> dict[str, Entry]:
    """The agent's record, read only: a damaged one is the apply's to set aside (R9)."""
    try:
        return read_record(path)
    except (RecordDamaged, OSError):
        return {}


def _mode(mode: int) -> str:
    return f"{mode:04o}"


def describe(
    spec: NodeSpecUnits, host: Host | None = None, bookings: Sequence[dict[str, Any]] = ()
) -> dict[str, Any]:
    """What applying the spec would do: ``units`` in apply order, then the ``bookings``'
    delivery steps, the same grouped the way an operator reads them, and (given the host) the
    ``diff`` against it."""
    record = {} if host is None else host.record
    booked = set(spec.booked_gpus)
    steps: list[dict[str, Any]] = []
    plan: dict[str, Any] = {
        "version": spec.version,
        "reboot": spec.reboot,
        "units": steps,
        "files": [],
        "kernelArgs": [],
        "modules": [],
        "sysctls": [],
        "services": [],
        "commands": [],  # every command, in the order they run
        # H4: units that wait for their GPUs to be idle, with those GPUs; "booked" are the
        # ones with a live booking now, for which the agent would hold the unit back.
        "drain": [],
        "bookedGpus": list(spec.booked_gpus),
        "bookings": list(bookings),  # D5, D7: delivered and released after the units
        "diff": None if host is None else _diff(spec, host, bookings),
    }
    for unit in spec.units:
        written = _written(unit)
        files = [] if written is None else [{"path": written[0], "mode": _mode(written[2])}]
        step = {
            "id": unit.id,
            "kind": unit.kind,
            "needs": unit.needs,
            "restarts": list(unit.restarts),
            "files": files,
            "commands": unit_commands(unit, enabled=unit.id in record),
        }
        if unit.needs == "drain":
            waits = sorted(booked.intersection(unit.gpus))
            step |= {"gpus": list(unit.gpus), "waitsFor": waits}
            plan["drain"].append({"id": unit.id, "gpus": list(unit.gpus), "booked": waits})
        steps.append(step)
        plan["files"] += [{**f, "needs": unit.needs} for f in files]
        if unit.kind == "kernel-args":
            plan["kernelArgs"] += unit.content.split()
        elif unit.kind in ("module", "sysctl", "service"):
            plan[f"{unit.kind}s"].append(unit.content)
    for unit_id in undo_order(record, {unit.id for unit in spec.units}):
        entry = record[unit_id]
        path = undone_file(entry)
        held = entry.get("gpus")  # a drain unit's undoing waits for its GPUs too (H4)
        steps.append(
            {
                "id": unit_id,
                "kind": entry["kind"],
                "undo": True,
                "files": [] if path is None else [{"path": path}],
                "commands": undo_commands(entry),
                "waitsFor": sorted(booked.intersection(held if isinstance(held, list) else [])),
            }
        )
    plan["commands"] = [
        {"unit": step["id"], "argv": argv, "needs": step.get("needs", "nothing")}
        for step in [*steps, *bookings]
        for argv in step["commands"]
    ]
    plan["files"] += [
        {"path": f["path"], "mode": f["mode"], "needs": "nothing"}
        for step in bookings
        for f in step["files"]
    ]
    return plan


def _diff(spec: NodeSpecUnits, host: Host, bookings: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The host as it is against the spec: files, kernel arguments, MIG layouts."""
    files = []
    for unit in spec.units:
        written = _written(unit)
        if written is not None:
            change = _file_change(*written, host)
            if change is not None:
                files.append(change)
    wanted = {unit.id for unit in spec.units}
    for unit_id in undo_order(host.record, wanted):
        path = undone_file(host.record[unit_id])
        if path is not None and path in host.files:
            files.append({"path": path, "change": "deleted"})
    for step in bookings:
        for f in step["files"]:
            change = _file_change(f["path"], f["content"], int(f["mode"], 8), host)
            if change is not None:
                files.append(change)
        files += [{"path": path, "change": "deleted"} for path in step["delete"]]
    return {
        "root": host.root,
        "files": files,
        "cmdline": None if host.cmdline is None else list(host.cmdline),
        "kernelArgs": _kernel_args(spec, host),
        "mig": _mig_changes(spec, host.inventory),
    }


def _file_change(path: str, content: str, mode: int, host: Host) -> dict[str, Any] | None:
    """How the host's file differs from the rendered one; None when it does not."""
    now = host.files.get(path)
    if now is None:
        return {"path": path, "change": "new", "mode": _mode(mode)}
    if now.error is not None:
        return {"path": path, "change": "unreadable", "error": now.error}
    change: dict[str, Any] = {"path": path, "change": "changed"}
    if now.mode != mode:
        change |= {"mode": _mode(mode), "was": _mode(now.mode)}
    if now.content != content.encode():
        lines = difflib.unified_diff(
            now.content.decode(errors="replace").splitlines(keepends=True),
            content.splitlines(keepends=True),
            f"{host.root.rstrip('/')}{path} (on the host)",
            f"{path} (rendered)",
        )
        change["diff"] = "".join(line if line.endswith("\n") else line + "\n" for line in lines)
    elif now.mode == mode:
        return None
    return change


def _kernel_args(spec: NodeSpecUnits, host: Host) -> dict[str, list[str]]:
    """Arguments the spec wants that the running kernel lacks, and arguments an earlier spec
    set (in the drop-in or the agent's record) that it runs with and this spec drops.

    Only a spec with kernel arguments rewrites the drop-in, and only a recorded kernel-args
    unit that left the spec deletes it: without either, the drop-in stays as it is.
    """
    units = [u for u in spec.units if u.kind == "kernel-args"]
    recorded = [e for e in host.record.values() if e.get("kind") == "kernel-args"]
    if not units and not recorded:
        return {"add": [], "remove": []}
    wanted = [arg for unit in units for arg in unit.content.split()]
    running = set(host.cmdline or ())
    ours = set(_drop_in_args(host.files.get(DROP_IN_PATH)))
    for entry in recorded:
        ours |= set(entry.get("args", [])) | set(entry.get("retired", []))
    return {
        "add": [arg for arg in wanted if arg not in running],
        "remove": sorted((ours - set(wanted)) & running),
    }


def _drop_in_args(found: HostFile | None) -> list[str]:
    """The arguments a boot loader drop-in of ours adds (boot_drop_in read back)."""
    if found is None or found.error is not None:
        return []
    head, tail = boot_drop_in("\0").split("\0")
    text = found.content.decode(errors="replace")
    if not (text.startswith(head) and text.endswith(tail)):
        return []
    return text.removeprefix(head).removesuffix(tail).split()


def _mig_changes(spec: NodeSpecUnits, inventory: Inventory | None) -> list[dict[str, Any]]:
    """The GPUs whose MIG mode or instances the spec's mig-parted layout changes."""
    layout = next((u.content for u in spec.units if u.path == MIG_PARTED_CONF), None)
    if layout is None or inventory is None:
        return []
    wanted = _mig_layout(layout)
    changes = []
    for gpu in inventory.gpus:
        if gpu.index not in wanted:
            continue  # mig-parted leaves a GPU the layout does not list as it is
        enabled, instances = wanted[gpu.index]
        now = dict(sorted(Counter(i.profile for i in gpu.mig_instances).items()))
        if (gpu.mig_current, gpu.mig_pending, now) != (enabled, enabled, instances):
            changes.append(
                {
                    "gpu": gpu.index,
                    "uuid": gpu.uuid,
                    "from": {"enabled": gpu.mig_current, "instances": now},
                    "to": {"enabled": enabled, "instances": instances},
                }
            )
    return changes


def _mig_layout(text: str) -> dict[int, tuple[bool, dict[str, int]]]:
    """GPU index → (MIG on, profile → count), read back from the mig-parted config as
    shared.render.miglayout writes it: ``- devices: [0, 1]``, ``mig-enabled: true``, then
    one ``"3g.40gb": 2`` line per profile (strings and lists are JSON there)."""
    layout: dict[int, tuple[bool, dict[str, int]]] = {}
    devices: list[int] = []
    for line in text.splitlines():
        key, _, value = line.strip().removeprefix("- ").partition(": ")
        if key == "devices":
            devices = json.loads(value)
        elif key == "mig-enabled":
            layout |= {index: (value == "true", {}) for index in devices}
        elif key.startswith('"'):
            for index in devices:
                layout[index][1][json.loads(key)] = int(value)
    return layout


# --- the plan for people ------------------------------------------------------------------


def _step_lines(number: str, step: dict[str, Any]) -> list[str]:
    if step.get("undo"):
        lines = [f"  {number} undo {step['id']} ({step['kind']}: it left the spec)"]
        lines += [f"       delete {f['path']}" for f in step["files"]]
    else:
        needs = "" if step["needs"] == "nothing" else f"; needs {step['needs']}"
        if step.get("gpus"):
            needs += f" of {len(step['gpus'])} GPUs"
        restarts = "".join(f"; restarts {name}" for name in step["restarts"])
        lines = [f"  {number} {step['id']} ({step['kind']}{needs}{restarts})"]
        lines += [f"       write {f['path']} ({f['mode']})" for f in step["files"]]
    lines += [f"       run {shlex.join(argv)}" for argv in step["commands"]]
    if step.get("waitsFor"):
        lines.append(f"       waits: {len(step['waitsFor'])} of its GPUs are booked")
    return lines


def _booking_lines(step: dict[str, Any]) -> list[str]:
    outcome = step["outcome"]
    if outcome == "releasing":
        outcome = "not released yet, tried again next cycle"
    reason = f" ({step['reason']})" if step["reason"] else ""
    lines = [f"  {step['id']} ({step['state']}): {outcome}{reason}"]
    lines += [f"       write {f['path']} ({f['mode']})" for f in step["files"]]
    lines += [f"       delete {path}" for path in step["delete"]]
    lines += [f"       run {shlex.join(argv)}" for argv in step["commands"]]
    return lines


def _diff_lines(diff: dict[str, Any]) -> list[str]:
    lines = [f"against the host at {diff['root']}:"]
    for change in diff["files"]:
        kind = change["change"]
        if kind == "new":
            lines.append(f"  {change['path']}: new file ({change['mode']})")
        elif kind == "unreadable":
            lines.append(f"  {change['path']}: cannot be read ({change['error']})")
        elif kind == "deleted":
            lines.append(f"  {change['path']}: deleted")
        else:
            mode = f"mode {change['was']} → {change['mode']}" if "was" in change else ""
            what = f"changed ({mode})" if mode and "diff" in change else mode or "changed"
            lines.append(f"  {change['path']}: {what}")
            lines += [f"    {line}" for line in change.get("diff", "").splitlines()]
    args = diff["kernelArgs"]
    if diff["cmdline"] is None:
        why = {"add": "no /proc/cmdline under the root", "remove": ""}
    else:
        why = {"add": "not in /proc/cmdline", "remove": "in /proc/cmdline, dropped by the spec"}
    for verb in ("add", "remove"):
        if args[verb]:
            lines.append(f"  kernel arguments to {verb} ({why[verb]}): {' '.join(args[verb])}")
    for change in diff["mig"]:
        lines.append(
            f"  MIG on GPU {change['gpu']} ({change['uuid']}): "
            f"{_mig_text(change['from'])} → {_mig_text(change['to'])}"
        )
    if len(lines) == 1:
        lines.append("  nothing differs")
    return lines


def _mig_text(layout: dict[str, Any]) -> str:
    if not layout["enabled"]:
        return "MIG off"
    instances = [f"{p} ×{n}" if n > 1 else p for p, n in layout["instances"].items()]
    return "MIG on, " + (", ".join(instances) or "no instances")


def for_people(plan: dict[str, Any]) -> str:
    steps = plan["units"]
    units = f"{len(steps)} unit{'' if len(steps) == 1 else 's'}"
    lines = [f"NodeSpec {plan['version'][:16]}: {units}, in the order they are applied"]
    width = len(str(len(steps)))
    for number, step in enumerate(steps, 1):
        lines += _step_lines(f"{number:>{width}}.", step)
    if plan["bookings"]:
        lines.append("bookings (delivered and released after the units):")
        lines += [line for step in plan["bookings"] for line in _booking_lines(step)]
    if plan["drain"]:
        lines.append("drain-gated units (applied once their GPUs are idle):")
        for item in plan["drain"]:
            lines.append(f"  {item['id']}: {len(item['gpus'])} GPUs")
            lines += [
                f"    {uuid}{'  (booked: waits)' if uuid in item['booked'] else ''}"
                for uuid in item["gpus"]
            ]
    if plan["diff"] is not None:
        lines += _diff_lines(plan["diff"])
    lines.append("reboot needed: " + ("yes" if plan["reboot"] else "no"))
    return "\n".join(lines)
