"""Output as -o asks (M4): tables for people (`table` fits 100 columns, `wide` has every id
whole and nothing cut), `json` (the API's answer as it came; `--json` is the same) or `yaml`,
for scripts; `--watch` prints again whenever an event lands (a long-poll of the event log, B2).

A table shows each row's own id whole, as kubectl's NAME column is: it is what a person copies
into the next command. The ids a row refers to (a node's pool, a reservation's node) are cut to
their tails in `-o table`, so that a line fits; a command takes such a tail too (`ids.py`).
"""

import json
import sys
from collections.abc import Callable
from typing import Any

import click
import msgspec

from controlplane.cli.calls import end_of_log, next_events
from controlplane.cli.settings import settings

WIDTH = 100  # tables aim to fit a terminal this wide
FIT_MIN = 20  # ...but a cut column keeps this much, even when the line runs longer
UNLIMITED = 2147483647  # the largest quota value: an owner's own rows carry it


def emit(answer: Any, render: Callable[[Any], None]) -> None:
    """The answer as -o asks: `render` draws the table (table and wide), or it is printed
    whole as JSON or YAML."""
    output = settings().output
    if output == "json":
        click.echo(msgspec.json.format(msgspec.json.encode(answer), indent=2))
    elif output == "yaml":
        click.echo(msgspec.yaml.encode(answer), nl=False)
    else:
        render(answer)


def shown(
    fetch: Callable[[], Any], render: Callable[[Any], None], watch: bool, tenant: str
) -> None:
    """emit(fetch(), render); with `watch`, fetched and printed again each time an event the
    tenant sees lands (M4: driven by the event log's long-poll, not a timer), until Ctrl-C. On
    a terminal each print replaces the last; into a pipe they follow one another (YAML
    documents separated by `---`)."""
    if not watch:
        emit(fetch(), render)
        return
    try:
        after = end_of_log(tenant)  # before the first fetch: a change after it is not missed
        emit(fetch(), render)
        while True:
            answer = next_events(tenant, after, 1000)
            after = answer["next"]
            if not answer["items"]:
                continue  # nothing it sees happened: wait again at once
            if sys.stdout.isatty():
                click.clear()
            else:
                click.echo("---" if settings().output == "yaml" else "")
            emit(fetch(), render)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a person stops watching: not an error


def table(headers: list[str] | None, rows: list[list[Any]], fit: int | None = None) -> None:
    """Aligned columns; `fit` names a free-text column cut short (ending in …) so that a line
    stays within WIDTH when it can: the whole text is in `-o wide` and `-o json`."""
    body = [[("-" if v is None else str(v)) for v in row] for row in rows]
    cells = body if headers is None else [headers, *body]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))] if cells else []
    over = sum(widths) + 2 * (len(widths) - 1) - WIDTH
    if fit is not None and over > 0 and settings().output != "wide":
        keep = max(widths[fit] - over, len(headers[fit]) if headers else 0, FIT_MIN)
        for row in body:
            if len(row[fit]) > keep:
                row[fit] = row[fit][: keep - 1] + "…"
        widths[fit] = min(widths[fit], keep)
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def fields(keys: list[str]) -> Callable[[Any], None]:
    """A single object as `key: value` lines."""

    def render(answer: Any) -> None:
        table(None, [[f"{key}:", short(answer.get(key))] for key in keys])

    return render


def items(
    headers: list[str], row: Callable[[Any], list[Any]], fit: str | None = None
) -> Callable[[Any], None]:
    """A list's items as a table, one `row` each; `fit` names the column cut to fit."""
    column = None if fit is None else headers.index(fit)
    return lambda answer: table(headers, [row(item) for item in answer["items"]], fit=column)


def short_id(value: str | None) -> str | None:
    """`pool_01j…x7k2m9qa` as `…x7k2m9qa`: the id's last 8 characters (random in a ULID and in a
    derived id alike) for a column whose header names the kind and has no room for it whole."""
    if value is None or len(value) <= 16:
        return value
    return f"…{value[-8:]}"


def id_cell(value: str | None) -> str | None:
    """The id of another object than the row's own (a node's pool, a reservation's node): its
    tail in `-o table`, so that a line fits WIDTH even with 57-character derived ids; whole in
    `-o wide` (and in json and yaml, and in a single object's `key: value` lines)."""
    return value if settings().output == "wide" else short_id(value)


def short(value: Any) -> Any:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else value


def human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


def cpus_cell(cpus: str | None, cpu_quota: int | None) -> str | None:
    """D3: a booking's CPUs, `0-3,112-115 pinned` (exclusive) or `4-55 share 800%` (a share of
    the CPUs near its GPUs: the vCPUs ×100 as a CFS quota)."""
    if not cpus and cpu_quota is None:
        return None
    return f"{cpus or '-'} share {cpu_quota}%" if cpu_quota is not None else f"{cpus} pinned"


def used_max(row: dict[str, Any]) -> str:
    return f"{row['used']}/{'unlimited' if row['max'] == UNLIMITED else row['max']}"


def quota_cell(rows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['resource']} {used_max(r)}" for r in rows) or "-"


def yes(flag: bool) -> str:
    return "yes" if flag else "no"
