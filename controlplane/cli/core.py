"""better-compute: the operator and tenant CLI, one command per HTTP API method.

Connection comes from flags, then the environment, then a profile in
$XDG_CONFIG_HOME/better-compute/config.toml (see `resolve`). Output is `-o` (M4): tables for
people (`table` fits 100 columns, `wide` has every id whole and nothing cut), `json` (the
API's answer as it came; `--json` is the same) or `yaml`, for scripts. Lists read every page
(B1); `--watch` prints again whenever an event lands (a long-poll of the event log, B2).
"""

import json
import os
import ssl
import sys
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn, get_args

import click
import msgspec

from shared.client import ControlPlane, Refused, Unreachable

EPILOG = """\b
Connection: --url/BETTER_COMPUTE_URL, and --token-file/BETTER_COMPUTE_TOKEN_FILE or
--token/BETTER_COMPUTE_TOKEN, and --ca-file/BETTER_COMPUTE_CA_FILE for a control plane
whose certificate a private CA signed; or --profile NAME from
~/.config/better-compute/config.toml ([profiles.NAME] url, token_file, ca_file, tenant).
--tenant defaults to BETTER_COMPUTE_TENANT, then to the profile's tenant.

\b
Exit status: 0 done; 1 refused by the control plane (its error code on stderr);
2 a usage error; 3 the control plane could not be reached (connection refused,
a TLS failure, a timeout, a 5xx answer).

\b
Shell completion (bash, zsh, fish):
  eval "$(_BETTER_COMPUTE_COMPLETE=bash_source better-compute)"
"""

REFUSED, USAGE, UNREACHABLE = 1, 2, 3  # exit statuses, as the epilog gives them
TIMEOUT = 10.0  # seconds an answer may take (plus the wait of a long-poll)
WAIT_SECONDS = 30  # how long one long-poll of the event log waits for an event (B2: 0…60)
Output = Literal["table", "wide", "json", "yaml"]


# --- connection settings -------------------------------------------------------


@dataclass(frozen=True)
class Settings:
    url: str | None
    token: str | None
    ca_file: str | None  # the CA certificates an https control plane is verified against (M3)
    tenant: str | None  # the default for --tenant: BETTER_COMPUTE_TENANT, else the profile's
    output: Output


def config_path(environ: Mapping[str, str]) -> Path:
    base = environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "better-compute" / "config.toml"


def resolve(
    url: str | None,
    token: str | None,
    token_file: str | None,
    ca_file: str | None,
    profile: str | None,
    output: Output,
    environ: Mapping[str, str],
) -> Settings:
    """The one place the environment is read: flags win, then variables, then the profile."""
    # An empty variable counts as unset, as `VAR= better-compute …` means to a shell user.
    url = url or environ.get("BETTER_COMPUTE_URL") or None
    token = token or environ.get("BETTER_COMPUTE_TOKEN") or None
    token_file = token_file or environ.get("BETTER_COMPUTE_TOKEN_FILE") or None
    ca_file = ca_file or environ.get("BETTER_COMPUTE_CA_FILE") or None
    profile = profile or environ.get("BETTER_COMPUTE_PROFILE") or None
    values: dict[str, Any] = {}
    path = config_path(environ)
    if profile is not None or path.exists():
        try:
            profiles = tomllib.loads(path.read_text()).get("profiles", {})
        except (OSError, tomllib.TOMLDecodeError) as exc:
            fail(f"cannot read {path}: {exc}", USAGE)
        # Without --profile, a profile named "default" applies when there is one.
        name = profile or "default"
        if name not in profiles and profile is not None:
            fail(f"no profile {name!r} in {path}", USAGE)
        values = profiles.get(name, {})
        for key in ("url", "token", "token_file", "ca_file", "tenant"):
            if key in values and not isinstance(values[key], str):
                fail(f"profile {name!r} in {path}: {key} must be a string", USAGE)
    url = url or values.get("url")
    ca_file = ca_file or values.get("ca_file")
    if token is None and token_file is None and "token" not in values:
        token_file = values.get("token_file")
    token = token or values.get("token")
    if token is None and token_file is not None:
        try:
            token = Path(token_file).expanduser().read_text().strip()
        except OSError as exc:
            fail(f"cannot read the token file: {exc}", USAGE)
    if ca_file is not None:
        ca_file = str(Path(ca_file).expanduser())
    tenant = environ.get("BETTER_COMPUTE_TENANT") or values.get("tenant")
    return Settings(url, token, ca_file, tenant, output)


def settings() -> Settings:
    """The connection and output settings of this invocation (the root group's `resolve`)."""
    found: Settings = click.get_current_context().find_object(Settings)  # type: ignore[assignment]
    return found


# --- calling and printing ------------------------------------------------------


def fail(message: str, code: int) -> NoReturn:
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(code)


def call(path: str, body: dict[str, Any], nulls: tuple[str, ...] = (), wait: float = 0) -> Any:
    """One API call; an error becomes one line on stderr and its exit status (1 refused, 3 not
    reached), never a traceback. `wait`: the seconds a long-poll may wait for its answer."""
    given = settings()
    if not given.url:
        fail("no control plane URL: pass --url, set BETTER_COMPUTE_URL or use --profile", USAGE)
    try:
        client = ControlPlane(
            given.url, timeout=TIMEOUT + wait, token=given.token, ca_file=given.ca_file
        )
    except ValueError as exc:
        fail(str(exc), USAGE)
    except OSError as exc:  # the CA file: missing, unreadable or not PEM certificates
        fail(f"cannot load the CA file {given.ca_file}: {exc}", USAGE)
    # Options not given are left out rather than sent as null or empty, except `nulls`
    # (fields where null means something, such as a budget with no limit).
    body = {k: v for k, v in body.items() if k in nulls or (v is not None and v not in ((), []))}
    try:
        with client:
            return client.call(path, body)
    except Refused as exc:
        fail(str(exc), REFUSED)
    except Unreachable as exc:
        hint = (
            " (give the CA that signed its certificate with --ca-file)"
            if isinstance(exc.__cause__, ssl.SSLCertVerificationError)
            else ""
        )
        fail(f"cannot reach the control plane: {exc}{hint}", UNREACHABLE)


def every(path: str, body: dict[str, Any], page_size: int | None) -> dict[str, Any]:
    """A list method's items from every page (B1): `limit` is `page_size` (None: the control
    plane's own page) and `cursor` the `next` of the page before, until `next` is null or
    absent. The answer has the list's shape: every item, and `next` null."""
    found: list[Any] = []
    cursor = None
    while True:
        answer = call(path, {**body, "limit": page_size, "cursor": cursor})
        found += answer["items"]
        cursor = answer.get("next")
        if cursor is None:
            return {"items": found, "next": None}


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


def end_of_log(tenant_id: str, types: tuple[str, ...] = (), limit: int = 1000) -> int:
    """The position of the event log's end as it is now: following starts there, as `tail -f`
    does. The end is where a read gets past nothing (`next` == `after`), not where a page is
    merely empty: the cursor also moves past events the credential may not see (B1)."""
    after = 0
    while True:
        body = {"tenantId": tenant_id, "after": after, "limit": limit, "types": list(types)}
        found = int(call("compute/events/list", body)["next"])
        if found == after:
            return after
        after = found


def next_events(tenant_id: str, after: int, limit: int, types: tuple[str, ...] = ()) -> Any:
    """events/list after `after`, waiting up to WAIT_SECONDS for one to land (B2's long-poll):
    the answer comes as soon as there is an event, or empty, its `next` moved past events the
    credential may not see or (the wait over) not moved: either way, ask again from `next`."""
    body = {
        "tenantId": tenant_id,
        "after": after,
        "limit": limit,
        "types": list(types),
        "waitSeconds": WAIT_SECONDS,
    }
    return call("compute/events/list", body, wait=WAIT_SECONDS)


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


WIDTH = 100  # tables aim to fit a terminal this wide
FIT_MIN = 20  # ...but a cut column keeps this much, even when the line runs longer


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
    """An id in a table's column (a row's own or one it refers to): its tail in `-o table`, so
    that a line fits WIDTH even with 57-character derived ids; whole in `-o wide` (and in
    json and yaml, and in a single object's `key: value` lines, which have the room)."""
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


# --- the group -----------------------------------------------------------------


class AnywhereOutput(click.Group):
    """The output options where people put them: `better-compute pools list --tenant acme -o
    wide` (or `--json`) works like `better-compute -o wide pools list --tenant acme`."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        if "--" in args:
            return super().parse_args(ctx, args)
        front: list[str] = []
        rest: list[str] = []
        index = 0
        while index < len(args):
            arg = args[index]
            if arg in ("-o", "--output") and index + 1 < len(args):
                front += args[index : index + 2]
                index += 2
                continue
            glued = arg.startswith("--output=") or (arg.startswith("-o") and len(arg) > 2)
            (front if arg == "--json" or glued else rest).append(arg)
            index += 1
        return super().parse_args(ctx, [*front, *rest])


@click.group(
    cls=AnywhereOutput, epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]}
)
@click.version_option(package_name="better-compute")
@click.option("--url", help="control plane URL [BETTER_COMPUTE_URL]")
@click.option("--token", help="API token [BETTER_COMPUTE_TOKEN]")
@click.option("--token-file", help="file holding the API token [BETTER_COMPUTE_TOKEN_FILE]")
@click.option(
    "--ca-file",
    help="CA certificates (PEM) to verify an https control plane by [BETTER_COMPUTE_CA_FILE]",
)
@click.option("--profile", help="profile in config.toml [BETTER_COMPUTE_PROFILE]")
@click.option(
    "-o",
    "--output",
    type=click.Choice(get_args(Output)),
    help="table (the default: fits 100 columns), wide (ids whole, nothing cut), json or yaml",
)
@click.option("--json", "as_json", is_flag=True, help="the same as -o json")
@click.pass_context
def cli(
    ctx: click.Context,
    url: str | None,
    token: str | None,
    token_file: str | None,
    ca_file: str | None,
    profile: str | None,
    output: Output | None,
    as_json: bool,
) -> None:
    """Drive a Better Compute control plane over its HTTP API."""
    if as_json and output not in (None, "json"):
        raise click.UsageError(f"--json is -o json: it cannot go with -o {output}")
    chosen: Output = "json" if as_json else (output or "table")
    ctx.obj = resolve(url, token, token_file, ca_file, profile, chosen, os.environ)
