"""better-compute: the operator and tenant CLI, one command per HTTP API method.

Connection comes from flags, then the environment, then a profile in
$XDG_CONFIG_HOME/better-compute/config.toml (see `resolve`). Tables are for
people; `--json` prints the API's answer as it came, for scripts.
"""

import json
import os
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click
import msgspec

from shared.client import ControlPlane, Refused, Unreachable

EPILOG = """\b
Connection: --url/BETTER_COMPUTE_URL, and --token-file/BETTER_COMPUTE_TOKEN_FILE or
--token/BETTER_COMPUTE_TOKEN, or --profile NAME from
~/.config/better-compute/config.toml ([profiles.NAME] url, token_file, tenant).
Shell completion (bash, zsh, fish):
  eval "$(_BETTER_COMPUTE_COMPLETE=bash_source better-compute)"
"""


# --- connection settings -------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    url: str | None
    token: str | None
    tenant: str | None  # a profile's default for --tenant
    as_json: bool


def config_path(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "better-compute" / "config.toml"


def resolve(
    url: str | None,
    token: str | None,
    token_file: str | None,
    profile: str | None,
    as_json: bool,
    environ: Mapping[str, str],
) -> Settings:
    """The one place the environment is read: flags win, then variables, then the profile."""
    # An empty variable counts as unset, as `VAR= better-compute …` means to a shell user.
    url = url or environ.get("BETTER_COMPUTE_URL") or None
    token = token or environ.get("BETTER_COMPUTE_TOKEN") or None
    token_file = token_file or environ.get("BETTER_COMPUTE_TOKEN_FILE") or None
    profile = profile or environ.get("BETTER_COMPUTE_PROFILE") or None
    values: dict[str, Any] = {}
    path = config_path(environ)
    if profile is not None or path.exists():
        try:
            profiles = tomllib.loads(path.read_text()).get("profiles", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            fail(f"cannot read {path}: {exc}")
        # Without --profile, a profile named "default" applies when there is one.
        name = profile or "default"
        if name not in profiles and profile is not None:
            fail(f"no profile {name!r} in {path}")
        values = profiles.get(name, {})
        for key in ("url", "token", "token_file", "tenant"):
            if key in values and not isinstance(values[key], str):
                fail(f"profile {name!r} in {path}: {key} must be a string")
    url = url or values.get("url")
    if token is None and token_file is None and "token" not in values:
        token_file = values.get("token_file")
    token = token or values.get("token")
    if token is None and token_file is not None:
        try:
            token = Path(token_file).expanduser().read_text().strip()
        except OSError as exc:
            fail(f"cannot read the token file: {exc}")
    return Settings(url, token, values.get("tenant"), as_json)


# --- calling and printing ------------------------------------------------------


def fail(message: str) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(1)


def call(path: str, body: dict[str, Any], nulls: tuple[str, ...] = ()) -> Any:
    """One API call; an error becomes one line on stderr and exit status 1, never a traceback."""
    settings: Settings = click.get_current_context().find_object(Settings)  # type: ignore[assignment]
    if not settings.url:
        fail("no control plane URL: pass --url, set BETTER_COMPUTE_URL or use --profile")
    try:
        client = ControlPlane(settings.url, token=settings.token)
    except ValueError as exc:
        fail(str(exc))
    # Options not given are left out rather than sent as null or empty, except `nulls`
    # (fields where null means something, such as a budget with no limit).
    body = {k: v for k, v in body.items() if k in nulls or (v is not None and v not in ((), []))}
    try:
        with client:
            return client.call(path, body)
    except Refused as exc:
        fail(str(exc))
    except Unreachable as exc:
        fail(f"cannot reach the control plane: {exc}")


def emit(answer: Any, render: Callable[[Any], None]) -> None:
    settings: Settings = click.get_current_context().find_object(Settings)  # type: ignore[assignment]
    if settings.as_json:
        click.echo(msgspec.json.format(msgspec.json.encode(answer), indent=2))
    else:
        render(answer)


WIDTH = 100  # tables aim to fit a terminal this wide
FIT_MIN = 20  # ...but a cut column keeps this much, even when the line runs longer


def table(headers: list[str] | None, rows: list[list[Any]], fit: int | None = None) -> None:
    """Aligned columns; `fit` names a free-text column cut short (ending in …) so that a line
    stays within WIDTH when it can: the whole text is in `--json`."""
    body = [[("-" if v is None else str(v)) for v in row] for row in rows]
    cells = body if headers is None else [headers, *body]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))] if cells else []
    over = sum(widths) + 2 * (len(widths) - 1) - WIDTH
    if fit is not None and over > 0:
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


def items(headers: list[str], row: Callable[[Any], list[Any]]) -> Callable[[Any], None]:
    return lambda answer: table(headers, [row(item) for item in answer["items"]])


def short_id(value: str | None) -> str | None:
    """`pool_01j…x7k2m9qa` as `…x7k2m9qa`: the id's last 8 characters (random in a ULID and in a
    derived id alike) for a column whose header names the kind and has no room for it whole."""
    if value is None or len(value) <= 16:
        return value
    return f"…{value[-8:]}"


def short(value: Any) -> Any:
    return json.dumps(value, separators=(",", ":")) if isinstance(value, dict | list) else value


def human_bytes(count: int) -> str:
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"


UNLIMITED = 2147483647  # the largest quota value: an owner's own rows carry it


def used_max(row: dict[str, Any]) -> str:
    return f"{row['used']}/{'unlimited' if row['max'] == UNLIMITED else row['max']}"


def quota_cell(rows: list[dict[str, Any]]) -> str:
    return ", ".join(f"{r['resource']} {used_max(r)}" for r in rows) or "-"


def yes(flag: bool) -> str:
    return "yes" if flag else "no"


# --- parameter types -----------------------------------------------------------


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


def as_dict(pairs: tuple[tuple[str, int], ...]) -> dict[str, int] | None:
    return dict(pairs) if pairs else None


def tenant_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--tenant", "tenant", help="the tenant acting (tenantId)")(f)


def tenant_of(given: str | None) -> str:
    settings: Settings = click.get_current_context().find_object(Settings)  # type: ignore[assignment]
    tenant = given or settings.tenant
    if tenant is None:
        raise click.UsageError("--tenant is required (or set tenant in the profile)")
    return tenant


quota_option = click.option(
    "--quota", "quota", type=KeyInt(), multiple=True, help="KEY=INT, repeatable: gpu=8"
)
policy_option = click.option("--policy", type=JsonValue(dict), help="inline JSON or @file.json")


# --- the group -----------------------------------------------------------------


class AnywhereJson(click.Group):
    """`--json` where people put it: `better-compute pools list --tenant acme --json` works
    like `better-compute --json pools list --tenant acme`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--json" in args[1:] and "--" not in args:
            args = ["--json", *(a for a in args if a != "--json")]
        return super().parse_args(ctx, args)


@click.group(
    cls=AnywhereJson, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(package_name="better-compute")
@click.option("--url", help="control plane URL [BETTER_COMPUTE_URL]")
@click.option("--token", help="API token [BETTER_COMPUTE_TOKEN]")
@click.option("--token-file", help="file holding the API token [BETTER_COMPUTE_TOKEN_FILE]")
@click.option("--profile", help="profile in config.toml [BETTER_COMPUTE_PROFILE]")
@click.option("--json", "as_json", is_flag=True, help="print the API answer as JSON")
@click.pass_context
def cli(
    ctx: click.Context,
    url: str | None,
    token: str | None,
    token_file: str | None,
    profile: str | None,
    as_json: bool,
) -> None:
    """Drive a Better Compute control plane over its HTTP API."""
    ctx.obj = resolve(url, token, token_file, profile, as_json, os.environ)
