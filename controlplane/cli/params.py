"""The CLI's parameter types (KEY=INT, JSON or @file, a duration) and the options many
commands share (--tenant, --watch, --page-size, --quota, --policy)."""

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from controlplane.cli.settings import settings

MAX_DEADLINE = 30 * 86400  # the API's bound on deadlineSeconds
DURATION_PART = re.compile(r"(\d+)([smhd])")
UNIT_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class KeyInt(click.ParamType[Any, Any]):
    """KEY=INT, e.g. --quota gpu=32; repeat the option for more keys."""

    name = "KEY=INT"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, tuple):
            return value
        key, sep, number = str(value).partition("=")
        if not sep or not key or not number.strip().isdigit():
            self.fail(f"{value!r} is not KEY=INT (e.g. gpu=8)", param, ctx)
        return (key, int(number))


class JsonValue(click.ParamType[Any, Any]):
    """Inline JSON or @file.json."""

    name = "JSON|@FILE"

    def __init__(self, kind: type) -> None:
        self.kind = kind

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            text = Path(value[1:]).read_text() if value.startswith("@") else value
            parsed = json.loads(text)
        except (OSError, ValueError) as exc:
            self.fail(f"{value!r}: {exc}", param, ctx)
        if not isinstance(parsed, self.kind):
            self.fail(f"{value!r} is not a JSON {self.kind.__name__}", param, ctx)
        return parsed


class Duration(click.ParamType[Any, Any]):
    """Seconds, or a duration such as 90s, 30m, 2h, 1d, 1h30m."""

    name = "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text.isdigit():
            seconds = int(text)
        elif text and DURATION_PART.sub("", text) == "":
            seconds = sum(int(n) * UNIT_SECONDS[u] for n, u in DURATION_PART.findall(text))
        else:
            self.fail(f"{value!r} is not a duration (e.g. 90s, 30m, 2h or seconds)", param, ctx)
        if seconds > MAX_DEADLINE:
            self.fail(f"{value!r} is longer than 30 days", param, ctx)
        return seconds


def as_dict(pairs: tuple[tuple[str, int], ...]) -> dict[str, int] | None:
    return dict(pairs) if pairs else None


def tenant_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--tenant", "tenant", help="the tenant acting (tenantId) [BETTER_COMPUTE_TENANT]"
    )(f)


def tenant_of(given: str | None) -> str:
    tenant = given or settings().tenant
    if tenant is None:
        raise click.UsageError(
            "--tenant is required (or set BETTER_COMPUTE_TENANT, or tenant in the profile)"
        )
    return tenant


watch_option = click.option(
    "--watch", "-w", is_flag=True, help="print again whenever an event lands; Ctrl-C stops"
)
page_size_option = click.option(
    "--page-size",
    type=click.IntRange(1, 1000),
    help="items per request (default: the control plane's page); every page is read",
)
quota_option = click.option(
    "--quota", "quota", type=KeyInt(), multiple=True, help="KEY=INT, repeatable: gpu=8"
)
policy_option = click.option("--policy", type=JsonValue(dict), help="inline JSON or @file.json")
