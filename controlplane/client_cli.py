"""better-compute: the operator and tenant CLI, one command per HTTP API method.

Connection comes from flags, then the environment, then a profile in
$XDG_CONFIG_HOME/better-compute/config.toml (see `resolve`). Tables are for
people; `--json` prints the API's answer as it came, for scripts.
"""

import json
import os
import time
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


def table(headers: list[str] | None, rows: list[list[Any]]) -> None:
    body = [[("-" if v is None else str(v)) for v in row] for row in rows]
    cells = body if headers is None else [headers, *body]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))] if cells else []
    for row in cells:
        click.echo("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())


def fields(keys: list[str]) -> Callable[[Any], None]:
    """A single object as `key: value` lines."""

    def render(answer: Any) -> None:
        table(None, [[f"{key}:", _short(answer.get(key))] for key in keys])

    return render


def items(headers: list[str], row: Callable[[Any], list[Any]]) -> Callable[[Any], None]:
    return lambda answer: table(headers, [row(item) for item in answer["items"]])


def _short(value: Any) -> Any:
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


# --- IAM -------------------------------------------------------------------------


@cli.group()
def tenants() -> None:
    """Create and delete tenants (root only)."""


@tenants.command("create")
@tenant_option
@click.option("--parent", help="parentTenantId")
@click.option("--name", help="display name")
def tenants_create(tenant: str | None, parent: str | None, name: str | None) -> None:
    """Create a tenant."""
    body = {"tenantId": tenant_of(tenant), "parentTenantId": parent, "name": name}
    emit(call("iam/tenants/create", body), fields(["tenantId", "parentTenantId", "name"]))


@tenants.command("delete")
@tenant_option
def tenants_delete(tenant: str | None) -> None:
    """Delete a tenant: archive its pools, withdraw its offers, revoke its credentials."""
    answer = call("iam/tenants/delete", {"tenantId": tenant_of(tenant)})
    keys = ["tenantId", "archivedPools", "withdrawnOffers", "revokedCredentials"]
    emit(answer, fields(keys))


@cli.group()
def credentials() -> None:
    """Create and revoke API credentials."""


@credentials.command("create")
@tenant_option
@click.option("--name", help="display name")
@click.option("--statements", type=JsonValue(list), help="IAM statements: JSON or @file.json")
def credentials_create(tenant: str | None, name: str | None, statements: Any) -> None:
    """Create a credential; its token is shown once."""
    body = {"tenantId": tenant_of(tenant), "name": name, "statements": statements}
    emit(call("iam/credentials/create", body), fields(["credentialId", "tenantId", "token"]))


@credentials.command("revoke")
@tenant_option
@click.argument("credential_id")
def credentials_revoke(tenant: str | None, credential_id: str) -> None:
    """Revoke a credential."""
    body = {"tenantId": tenant_of(tenant), "credentialId": credential_id}
    emit(call("iam/credentials/revoke", body), fields(["credentialId", "revoked"]))


# --- sites -----------------------------------------------------------------------

SITE_ROW = (
    ["ID", "NAME", "REGION", "KIND", "OWNER"],
    ["id", "name", "region", "kind", "ownerTenantId"],
)


@cli.group()
def sites() -> None:
    """Sites: where pools' machines are."""


@sites.command("create")
@tenant_option
@click.option("--name", required=True)
@click.option("--region", required=True)
@click.option("--kind", type=click.Choice(["shared", "dedicated", "custom"]), default="custom")
def sites_create(tenant: str | None, name: str, region: str, kind: str) -> None:
    """Create a site."""
    body = {"tenantId": tenant_of(tenant), "name": name, "region": region, "kind": kind}
    emit(call("compute/sites/create", body), fields(SITE_ROW[1]))


@sites.command("list")
@tenant_option
def sites_list(tenant: str | None) -> None:
    """List the sites a tenant sees."""
    answer = call("compute/sites/list", {"tenantId": tenant_of(tenant)})
    emit(answer, items(SITE_ROW[0], lambda s: [s[k] for k in SITE_ROW[1]]))


# --- pools -----------------------------------------------------------------------


def pool_row(p: dict[str, Any]) -> list[Any]:
    return [
        p["id"],
        p.get("gpuModel") or "-",
        p["class"],
        p["sharing"],
        yes(p["owned"]),
        yes(p["archived"]),
        quota_cell(p["quotas"]),
    ]


POOL_HEADERS = ["ID", "MODEL", "CLASS", "SHARING", "OWNED", "ARCHIVED", "QUOTA"]


def show_pool(p: dict[str, Any]) -> None:
    fields(["id", "ownerTenantId", "siteId", "class", "gpuModel", "sharing", "agent", "version"])(p)
    click.echo(f"owned: {yes(p['owned'])}  archived: {yes(p['archived'])}")
    click.echo(f"quota: {quota_cell(p['quotas'])}")
    for offer in p.get("offers", []):
        quota = ", ".join(f"{k} {v}" for k, v in offer["quota"].items())
        click.echo(f"offered to {offer['toTenantId']}: {quota} (priority {offer['priority']})")
    click.echo(f"policy: {_short(p['policy'])}")


def capacity_table(answer: Any) -> None:
    table(
        ["RESOURCE", "TOTAL", "ALLOCATED", "AVAILABLE"],
        [[r["resource"], r["total"], r["allocated"], r["available"]] for r in answer["items"]],
    )


@cli.group()
def pools() -> None:
    """Pools: create, offer to tenants, update, archive."""


@pools.command("list")
@tenant_option
def pools_list(tenant: str | None) -> None:
    """List the pools a tenant owns or is offered."""
    emit(call("compute/pools/list", {"tenantId": tenant_of(tenant)}), items(POOL_HEADERS, pool_row))


@pools.command("get")
@tenant_option
@click.argument("pool_id")
def pools_get(tenant: str | None, pool_id: str) -> None:
    """Show one pool."""
    emit(call("compute/pools/get", {"tenantId": tenant_of(tenant), "poolId": pool_id}), show_pool)


@pools.command("create")
@tenant_option
@click.option("--site", "site_id", required=True, help="siteId")
@click.option(
    "--class",
    "pool_class",
    required=True,
    type=click.Choice(["metal-host", "metal-dedicated", "vps-host", "provider"]),
)
@click.option("--gpu-model", help="e.g. H100; leave out for a CPU pool")
@click.option("--sharing", type=click.Choice(["exclusive", "mig", "timeslice", "mps"]))
@click.option("--agent", type=click.Choice(["bcd", "none"]))
@policy_option
@click.option("--owner-quota", type=KeyInt(), multiple=True, help="KEY=INT, repeatable")
@click.option("--provider-account", help="providerAccountId")
@click.option("--idempotency-key")
def pools_create(
    tenant: str | None,
    site_id: str,
    pool_class: str,
    gpu_model: str | None,
    sharing: str | None,
    agent: str | None,
    policy: Any,
    owner_quota: tuple[tuple[str, int], ...],
    provider_account: str | None,
    idempotency_key: str | None,
) -> None:
    """Create a pool."""
    body = {
        "tenantId": tenant_of(tenant),
        "siteId": site_id,
        "class": pool_class,
        "gpuModel": gpu_model,
        "sharing": sharing,
        "agent": agent,
        "policy": policy,
        "ownerQuota": as_dict(owner_quota),
        "providerAccountId": provider_account,
        "idempotencyKey": idempotency_key,
    }
    emit(call("compute/pools/create", body), show_pool)


@pools.command("offer")
@tenant_option
@click.argument("pool_id")
@click.option("--to", "to_tenant", required=True, help="toTenantId")
@quota_option
@click.option("--include-descendants", is_flag=True)
@click.option("--priority", type=click.IntRange(-1000, 1000))
def pools_offer(
    tenant: str | None,
    pool_id: str,
    to_tenant: str,
    quota: tuple[tuple[str, int], ...],
    include_descendants: bool,
    priority: int | None,
) -> None:
    """Offer a pool to a tenant with a quota."""
    body = {
        "tenantId": tenant_of(tenant),
        "poolId": pool_id,
        "toTenantId": to_tenant,
        "quota": dict(quota),
        "includeDescendants": include_descendants,
        "priority": priority,
    }
    emit(call("compute/pools/offer", body), show_pool)


@pools.command("unoffer")
@tenant_option
@click.argument("pool_id")
@click.option("--to", "to_tenant", required=True, help="toTenantId")
def pools_unoffer(tenant: str | None, pool_id: str, to_tenant: str) -> None:
    """Withdraw a pool's offer to a tenant."""
    body = {"tenantId": tenant_of(tenant), "poolId": pool_id, "toTenantId": to_tenant}
    emit(call("compute/pools/unoffer", body), fields(["removed"]))


@pools.command("update")
@tenant_option
@click.argument("pool_id")
@policy_option
@click.option("--gpu-model")
def pools_update(tenant: str | None, pool_id: str, policy: Any, gpu_model: str | None) -> None:
    """Change a pool's policy or GPU model."""
    body = {"tenantId": tenant_of(tenant), "poolId": pool_id, "policy": policy}
    emit(call("compute/pools/update", {**body, "gpuModel": gpu_model}), show_pool)


@pools.command("archive")
@tenant_option
@click.argument("pool_id")
def pools_archive(tenant: str | None, pool_id: str) -> None:
    """Archive a pool."""
    body = {"tenantId": tenant_of(tenant), "poolId": pool_id}
    emit(call("compute/pools/archive", body), show_pool)


@pools.command("capacity")
@tenant_option
@click.argument("pool_id")
def pools_capacity(tenant: str | None, pool_id: str) -> None:
    """A pool's capacity by resource."""
    body = {"tenantId": tenant_of(tenant), "poolId": pool_id}
    emit(call("compute/pools/capacity", body), capacity_table)


@cli.command("capacity")
@tenant_option
@click.argument("pool_id")
def capacity(tenant: str | None, pool_id: str) -> None:
    """A pool's capacity by resource (capacity/byPool)."""
    body = {"tenantId": tenant_of(tenant), "poolId": pool_id}
    emit(call("compute/capacity/byPool", body), capacity_table)


# --- quotas and events -----------------------------------------------------------

QUOTA_HEADERS = ["TENANT", "POOL", "RESOURCE", "USED/MAX", "AVAILABLE"]


def quota_rows(answer: Any) -> None:
    table(
        QUOTA_HEADERS,
        [
            [r["tenantId"], r["poolId"], r["resource"], used_max(r), r["available"]]
            for r in (answer["items"] if "items" in answer else answer.get("quotas", []))
        ],
    )


@cli.group()
def quotas() -> None:
    """Quotas: a tenant's share of a pool."""


@quotas.command("set")
@tenant_option
@click.argument("pool_id")
@click.option("--for", "for_tenant", required=True, help="forTenantId")
@quota_option
def quotas_set(
    tenant: str | None, pool_id: str, for_tenant: str, quota: tuple[tuple[str, int], ...]
) -> None:
    """Set a tenant's quota on a pool the caller owns."""
    body = {
        "tenantId": tenant_of(tenant),
        "poolId": pool_id,
        "forTenantId": for_tenant,
        "quota": dict(quota),
    }
    emit(call("compute/quotas/set", body), quota_rows)


@quotas.command("list")
@tenant_option
@click.option("--pool", "pool_id", help="only this poolId")
def quotas_list(tenant: str | None, pool_id: str | None) -> None:
    """List the caller tenant's quota rows."""
    body = {"tenantId": tenant_of(tenant), "poolId": pool_id}
    emit(call("compute/quotas/list", body), quota_rows)


EVENT_HEADERS = ["SEQ", "AT", "TYPE", "POOL", "DATA"]


def event_row(e: dict[str, Any]) -> list[Any]:
    return [e["seq"], e["at"], e["type"], e.get("poolId"), _short(e["data"])]


@cli.group()
def events() -> None:
    """The event log."""


@events.command("list")
@tenant_option
@click.option("--after", type=click.IntRange(min=0), help="only events after this seq")
@click.option("--limit", type=click.IntRange(1, 1000))
@click.option("--type", "types", multiple=True, help="event type, repeatable: pool.created")
def events_list(
    tenant: str | None, after: int | None, limit: int | None, types: tuple[str, ...]
) -> None:
    """List events; `next` is the cursor for --after."""
    body = {"tenantId": tenant_of(tenant), "after": after, "limit": limit, "types": list(types)}
    emit(call("compute/events/list", body), items(EVENT_HEADERS, event_row))


@events.command("tail")
@tenant_option
@click.option("--after", type=click.IntRange(min=0), default=0, help="start after this seq")
@click.option("--follow", "-f", is_flag=True, help="keep polling for new events")
@click.option("--max", "most", type=click.IntRange(min=1), help="stop after this many events")
@click.option("--interval", type=click.FloatRange(min=0.1), default=2.0, help="poll seconds")
@click.option("--type", "types", multiple=True, help="event type, repeatable")
def events_tail(
    tenant: str | None,
    after: int,
    follow: bool,
    most: int | None,
    interval: float,
    types: tuple[str, ...],
) -> None:
    """Print events as they come (one JSON object a line with --json); Ctrl-C stops."""
    settings: Settings = click.get_current_context().find_object(Settings)  # type: ignore[assignment]
    tenant_id, printed = tenant_of(tenant), 0
    try:
        while most is None or printed < most:
            limit = min(1000, most - printed) if most is not None else 1000
            body = {"tenantId": tenant_id, "after": after, "limit": limit, "types": list(types)}
            answer = call("compute/events/list", body)
            for event in answer["items"]:
                if settings.as_json:
                    click.echo(msgspec.json.encode(event).decode())
                else:
                    click.echo("  ".join(str(c or "-") for c in event_row(event)))
                printed += 1
            after = answer["next"]
            if not answer["items"]:
                if not follow:
                    break
                time.sleep(interval)
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a person stops following: not an error


# --- nodes -----------------------------------------------------------------------


@cli.group("join-tokens")
def join_tokens() -> None:
    """Join tokens: how an agent joins a pool."""


@join_tokens.command("create")
@tenant_option
@click.argument("pool_id")
@click.option("--ttl", type=click.IntRange(60, 30 * 86400), help="ttlSeconds")
@click.option("--max-uses", type=click.IntRange(1, 100_000))
def join_tokens_create(
    tenant: str | None, pool_id: str, ttl: int | None, max_uses: int | None
) -> None:
    """Create a join token for a pool the caller owns."""
    body = {
        "tenantId": tenant_of(tenant),
        "poolId": pool_id,
        "ttlSeconds": ttl,
        "maxUses": max_uses,
    }
    emit(
        call("compute/joinTokens/create", body), fields(["token", "poolId", "expiresAt", "maxUses"])
    )


def node_row(n: dict[str, Any]) -> list[Any]:
    gpus = n["gpus"]
    memory = sum(g["memoryBytes"] for g in gpus)
    gpu_cell = f"{len(gpus)}x {gpus[0]['name']} ({human_bytes(memory)})" if gpus else "-"
    return [n["id"], n["hostname"], n["state"], gpu_cell, n.get("lastSeenAt")]


NODE_HEADERS = ["ID", "HOSTNAME", "STATE", "GPUS", "LAST SEEN"]


def show_node(n: dict[str, Any]) -> None:
    table(NODE_HEADERS, [node_row(n)])
    click.echo(f"reason: {n.get('stateReason') or '-'}  spec: {n.get('specVersion') or '-'}")
    rows = [
        [r["resource"], r["capacity"], r["allocated"], f"{r['ratio']:g}"] for r in n["resources"]
    ]
    table(["RESOURCE", "CAPACITY", "ALLOCATED", "RATIO"], rows)


@cli.group()
def nodes() -> None:
    """Nodes: machines joined to pools."""


@nodes.command("list")
@tenant_option
@click.argument("pool_id")
def nodes_list(tenant: str | None, pool_id: str) -> None:
    """List a pool's nodes."""
    body = {"tenantId": tenant_of(tenant), "poolId": pool_id}
    emit(call("compute/nodes/list", body), items(NODE_HEADERS, node_row))


@nodes.command("get")
@tenant_option
@click.argument("node_id")
def nodes_get(tenant: str | None, node_id: str) -> None:
    """Show one node with its resource rows."""
    emit(call("compute/nodes/get", {"tenantId": tenant_of(tenant), "nodeId": node_id}), show_node)


# --- reservations and budgets ----------------------------------------------------

RES_HEADERS = ["ID", "POOL", "STATE", "RESOURCES", "NODE", "REASON"]


def res_row(r: dict[str, Any]) -> list[Any]:
    asked = ", ".join(f"{k} {v}" for k, v in r["resources"].items())
    return [r["id"], r["poolId"], r["state"], asked, r.get("nodeId"), r.get("reason")]


def show_res(r: dict[str, Any]) -> None:
    table(RES_HEADERS, [res_row(r)])


@cli.group()
def reservations() -> None:
    """Reservations: capacity held for a tenant."""


@reservations.command("create")
@tenant_option
@click.argument("pool_id")
@click.option("--resource", type=KeyInt(), multiple=True, required=True, help="gpu=2, repeatable")
@click.option("--mig-profile", help="e.g. 1g.10gb, with gpu.mig")
@click.option("--idempotency-key")
def reservations_create(
    tenant: str | None,
    pool_id: str,
    resource: tuple[tuple[str, int], ...],
    mig_profile: str | None,
    idempotency_key: str | None,
) -> None:
    """Reserve resources in a pool."""
    body = {
        "tenantId": tenant_of(tenant),
        "poolId": pool_id,
        "resources": dict(resource),
        "migProfile": mig_profile,
        "idempotencyKey": idempotency_key,
    }
    emit(call("compute/reservations/create", body), show_res)


@reservations.command("get")
@tenant_option
@click.argument("reservation_id")
def reservations_get(tenant: str | None, reservation_id: str) -> None:
    """Show one reservation."""
    body = {"tenantId": tenant_of(tenant), "reservationId": reservation_id}
    emit(call("compute/reservations/get", body), show_res)


@reservations.command("list")
@tenant_option
@click.option("--pool", "pool_id", help="only this poolId")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(["pending", "placed", "active", "ended", "failed"]),
)
def reservations_list(tenant: str | None, pool_id: str | None, states: tuple[str, ...]) -> None:
    """List a tenant's reservations."""
    body = {"tenantId": tenant_of(tenant), "poolId": pool_id, "states": list(states)}
    emit(call("compute/reservations/list", body), items(RES_HEADERS, res_row))


@reservations.command("end")
@tenant_option
@click.argument("reservation_id")
def reservations_end(tenant: str | None, reservation_id: str) -> None:
    """End a reservation and free what it holds."""
    body = {"tenantId": tenant_of(tenant), "reservationId": reservation_id}
    emit(call("compute/reservations/end", body), show_res)


BUDGET_KEYS = ["tenantId", "meter", "limit", "spent"]


@cli.group()
def budgets() -> None:
    """Budgets: a limit on a tenant's metered use."""


@budgets.command("set")
@tenant_option
@click.argument("meter")
@click.option("--limit", type=click.FloatRange(0, 1e12), help="leave out for no limit")
def budgets_set(tenant: str | None, meter: str, limit: float | None) -> None:
    """Set a tenant's budget on a meter such as gpu.h100.hours (root only)."""
    body = {"tenantId": tenant_of(tenant), "meter": meter, "limit": limit}
    answer = call("compute/budgets/set", body, nulls=("limit",))
    emit(answer, fields(BUDGET_KEYS))


@budgets.command("get")
@tenant_option
@click.argument("meter")
def budgets_get(tenant: str | None, meter: str) -> None:
    """Show a tenant's budget and spend on a meter."""
    answer = call("compute/budgets/get", {"tenantId": tenant_of(tenant), "meter": meter})
    emit(answer, fields(BUDGET_KEYS))


if __name__ == "__main__":
    cli(prog_name="better-compute")
