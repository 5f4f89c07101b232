"""The local dry-run: a NodeSpec written under a directory as if it were `/`, and a plan for people."""

from pathlib import Path
from typing import Any

from agent.apply import BOOT_DROP_IN, boot_drop_in
from shared.files import atomic_write
from shared.nodespec import NodeSpecUnits


def write_tree(spec: NodeSpecUnits, out: Path) -> list[str]:
    """Write every file the spec installs under ``out``; returns the paths as on the host."""
    written = []
    for unit in spec.units:
        if unit.kind == "file" and unit.path is not None:
            atomic_write(out / unit.path.lstrip("/"), unit.content.encode(), unit.mode)
            written.append(unit.path)
        elif unit.kind == "kernel-args":
            atomic_write(out / BOOT_DROP_IN, boot_drop_in(unit.content).encode(), 0o644)
            written.append("/" + BOOT_DROP_IN)
    return written


def describe(spec: NodeSpecUnits) -> dict[str, Any]:
    """What applying the spec would do, grouped the way an operator reads it."""
    plan: dict[str, Any] = {
        "version": spec.version,
        "reboot": spec.reboot,
        "files": [],
        "kernelArgs": [],
        "modules": [],
        "sysctls": [],
        "services": [],
        "commands": [],
        # H4: units that wait for their GPUs to be idle, with those GPUs; "booked" are the
        # ones with a live booking now, for which the agent would hold the unit back.
        "drain": [],
        "bookedGpus": list(spec.booked_gpus),
    }
    booked = set(spec.booked_gpus)
    for unit in spec.units:
        if unit.needs == "drain":
            plan["drain"].append(
                {
                    "id": unit.id,
                    "gpus": list(unit.gpus),
                    "booked": sorted(booked.intersection(unit.gpus)),
                }
            )
        if unit.kind == "file":
            plan["files"].append({"path": unit.path, "mode": oct(unit.mode), "needs": unit.needs})
        elif unit.kind == "kernel-args":
            plan["kernelArgs"] += unit.content.split()
        elif unit.kind == "module":
            plan["modules"].append(unit.content)
        elif unit.kind == "sysctl":
            plan["sysctls"].append(unit.content)
        elif unit.kind == "service":
            plan["services"].append(unit.content)
        else:
            plan["commands"].append({"argv": unit.argv, "needs": unit.needs})
    return plan


def for_people(plan: dict[str, Any]) -> str:
    lines = [f"NodeSpec {plan['version'][:16]}"]
    for title, key in (
        ("files", "files"),
        ("kernel arguments", "kernelArgs"),
        ("modules", "modules"),
        ("sysctls", "sysctls"),
        ("services", "services"),
        ("commands", "commands"),
        ("drain-gated units (applied once their GPUs are idle)", "drain"),
    ):
        items = plan[key]
        if not items:
            continue
        lines.append(f"{title}:")
        for item in items:
            if key == "files":
                lines.append(
                    f"  {item['path']}  ({item['mode']}{', ' + item['needs'] if item['needs'] != 'nothing' else ''})"
                )
            elif key == "commands":
                needs = f"  ({item['needs']})" if item["needs"] != "nothing" else ""
                lines.append(f"  {' '.join(item['argv'])}{needs}")
            elif key == "drain":
                lines.append(f"  {item['id']}: {len(item['gpus'])} GPUs")
                lines += [
                    f"    {uuid}{'  (booked: waits)' if uuid in item['booked'] else ''}"
                    for uuid in item["gpus"]
                ]
            else:
                lines.append(f"  {item}")
    lines.append("reboot needed: " + ("yes" if plan["reboot"] else "no"))
    return "\n".join(lines)
