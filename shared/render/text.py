"""The text of rendered files: a small YAML writer, the managed-file header, unit builders.

The YAML writer covers what our files hold (mappings, lists, strings, ints,
bools) and nothing more. Strings are always written double-quoted in JSON
form, which is valid YAML, so a value such as ``on``, ``no`` or ``0600`` can
never be read back as a bool or a number. Keys are quoted only when they are
not plain words. Output depends only on the input's order: byte-identical
renders are what make the spec version stable.
"""

import json
import re
from collections.abc import Mapping, Sequence

from shared.nodespec import Needs, Unit

Yaml = str | int | bool | Sequence["Yaml"] | Mapping[str, "Yaml"]

HEADER = "Managed by better-compute-agent from the pool policy; local edits are overwritten."

_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]*$")


def yaml_document(value: Mapping[str, Yaml], comment: str = HEADER) -> str:
    """A YAML document for ``value`` with a comment line on top."""
    return f"# {comment}\n" + "".join(_mapping(value, 0))


def _scalar(value: Yaml) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | str):
        return json.dumps(value)
    if isinstance(value, Mapping) and not value:
        return "{}"
    if isinstance(value, Sequence) and not value:
        return "[]"
    raise TypeError(f"not a YAML scalar: {value!r}")


def _is_scalar(value: Yaml) -> bool:
    return isinstance(value, bool | int | str) or not value


def _key(key: str) -> str:
    return key if _PLAIN_KEY.match(key) else json.dumps(key)


def _mapping(value: Mapping[str, Yaml], indent: int) -> list[str]:
    pad = " " * indent
    lines = []
    for key, item in value.items():
        if _is_scalar(item):
            lines.append(f"{pad}{_key(key)}: {_scalar(item)}\n")
        elif isinstance(item, Mapping):
            lines.append(f"{pad}{_key(key)}:\n")
            lines.extend(_mapping(item, indent + 2))
        else:
            assert isinstance(item, Sequence)
            lines.append(f"{pad}{_key(key)}:" + _sequence(item, indent + 2))
    return lines


def _sequence(items: Sequence[Yaml], indent: int) -> str:
    """A list of scalars in flow style (``[0, 1]``); a list of mappings as a block."""
    if all(_is_scalar(item) for item in items):
        return " [" + ", ".join(_scalar(item) for item in items) + "]\n"
    pad = " " * indent
    out = "\n"
    for item in items:
        if not isinstance(item, Mapping):
            raise TypeError("a block list holds mappings only")
        body = _mapping(item, indent + 2)
        out += f"{pad}- {body[0].lstrip()}" + "".join(body[1:])
    return out


def file_unit(
    id: str,
    path: str,
    content: str,
    *,
    mode: int = 0o644,
    needs: Needs = "nothing",
    restarts: Sequence[str] = (),
    gpus: Sequence[str] = (),
) -> Unit:
    return Unit(
        id=id,
        kind="file",
        path=path,
        content=content,
        mode=mode,
        needs=needs,
        restarts=list(restarts),
        gpus=_gpus(needs, gpus),
    )


def command_unit(
    id: str,
    argv: Sequence[str],
    *,
    note: str = "",
    needs: Needs = "nothing",
    every_boot: bool = False,
    gpus: Sequence[str] = (),
    gpus_from_inventory: bool = False,
) -> Unit:
    """A command run once per change of the unit.

    ``note`` goes into the unit's content: it is what should make the command run
    again (the digest of the file it applies, say) when the argv alone does not move.
    """
    return Unit(
        id=id,
        kind="command",
        argv=list(argv),
        content=note,
        needs=needs,
        every_boot=every_boot,
        gpus=_gpus(needs, gpus),
        gpus_from_inventory=gpus_from_inventory,
    )


def service_unit(id: str, name: str, *, needs: Needs = "nothing", gpus: Sequence[str] = ()) -> Unit:
    return Unit(id=id, kind="service", content=name, needs=needs, gpus=_gpus(needs, gpus))


def _gpus(needs: Needs, gpus: Sequence[str]) -> list[str]:
    """A drain-gated unit's GPUs (H4), sorted so the render stays deterministic."""
    if gpus and needs != "drain":
        raise ValueError("only a unit that needs a drain names the GPUs it touches")
    return sorted(set(gpus))


def systemd_unit(sections: Mapping[str, Sequence[tuple[str, str]]]) -> str:
    """A systemd unit file; each section is a list of (key, value), keys may repeat."""
    blocks = []
    for section, entries in sections.items():
        body = "".join(f"{key}={value}\n" for key, value in entries)
        blocks.append(f"[{section}]\n{body}")
    return f"# {HEADER}\n" + "\n".join(blocks)
