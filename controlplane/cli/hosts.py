"""Commands for events, join tokens, reservations and budgets (nodes: `nodes.py`)."""

from typing import Any

import click
import msgspec

from controlplane.cli.calls import call, end_of_log, every, next_events
from controlplane.cli.group import cli
from controlplane.cli.ids import POOL, RESERVATION, whole
from controlplane.cli.output import emit, fields, id_cell, items, short, shown, table
from controlplane.cli.params import (
    KeyInt,
    page_size_option,
    tenant_of,
    tenant_option,
    watch_option,
)
from controlplane.cli.settings import settings

EVENT_HEADERS = ["SEQ", "AT", "TYPE", "POOL", "DATA"]


def event_row(e: dict[str, Any]) -> list[Any]:
    return [e["seq"], e["at"], e["type"], id_cell(e.get("poolId")), short(e["data"])]


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
    """List one page of events (the log has no end: `events tail` reads on); `next` is the
    cursor for --after."""
    body = {"tenantId": tenant_of(tenant), "after": after, "limit": limit, "types": list(types)}
    emit(call("compute/events/list", body), items(EVENT_HEADERS, event_row, fit="DATA"))


@events.command("tail")
@tenant_option
@click.option(
    "--after",
    type=click.IntRange(min=0),
    help="start after this seq (default: the whole log; with --follow, only what comes next)",
)
@click.option(
    "--follow", "-f", is_flag=True, help="wait for new events (a long-poll of the event log)"
)
@click.option("--max", "most", type=click.IntRange(min=1), help="stop after this many events")
@click.option("--type", "types", multiple=True, help="event type, repeatable")
@click.option("--page-size", type=click.IntRange(1, 1000), default=1000, help="events per request")
def events_tail(
    tenant: str | None,
    after: int | None,
    follow: bool,
    most: int | None,
    types: tuple[str, ...],
    page_size: int,
) -> None:
    """Print events as they come (one JSON object a line with -o json, a YAML document each
    with -o yaml); Ctrl-C stops. Without --follow it stops at the end of the log as it is now;
    --follow waits on the control plane for the next event (B2), it does not poll."""
    output, tenant_id, printed = settings().output, tenant_of(tenant), 0
    if after is None:
        after = end_of_log(tenant_id, types, page_size) if follow else 0
    try:
        while most is None or printed < most:
            limit = min(page_size, most - printed) if most is not None else page_size
            if follow:
                answer = next_events(tenant_id, after, limit, types)
            else:
                body = {"tenantId": tenant_id, "after": after, "limit": limit, "types": list(types)}
                answer = call("compute/events/list", body)
            for event in answer["items"]:
                if output == "json":
                    click.echo(msgspec.json.encode(event).decode())
                elif output == "yaml":
                    click.echo(b"---\n" + msgspec.yaml.encode(event), nl=False)
                else:
                    click.echo("  ".join(str(c or "-") for c in event_row(event)))
                printed += 1
            # A page may be empty yet move `next` past events this credential may not see
            # (B1): read on from it. The end of the log is a read that got past nothing.
            moved, after = answer["next"] != after, answer["next"]
            if not (moved or follow):
                break
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a person stops following: not an error


# --- join tokens -----------------------------------------------------------------


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
    tenant_id = tenant_of(tenant)
    body = {
        "tenantId": tenant_id,
        "poolId": whole(POOL, pool_id, tenant_id),
        "ttlSeconds": ttl,
        "maxUses": max_uses,
    }
    emit(
        call("compute/joinTokens/create", body), fields(["token", "poolId", "expiresAt", "maxUses"])
    )


# --- reservations and budgets ----------------------------------------------------

RES_HEADERS = ["ID", "POOL", "STATE", "RESOURCES", "NODE", "REASON"]


def asked(r: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in r["resources"].items())


def res_row(r: dict[str, Any]) -> list[Any]:
    node, reason = id_cell(r.get("nodeId")), r.get("reason")
    return [r["id"], id_cell(r["poolId"]), r["state"], asked(r), node, reason]


res_table = items(RES_HEADERS, res_row, fit="REASON")


def show_res(r: dict[str, Any]) -> None:
    """One reservation as `key: value` lines, its ids whole (what `end` and `get` take)."""
    mig = f" ({r['migProfile']})" if r.get("migProfile") else ""
    rows = [
        ["id:", r["id"]],
        ["pool:", r["poolId"]],
        ["state:", r["state"]],
        ["resources:", asked(r) + mig],
        ["node:", r.get("nodeId")],
        ["reason:", r.get("reason")],
        ["expires:", r.get("expiresAt")],
    ]
    table(None, rows)


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
    tenant_id = tenant_of(tenant)
    body = {
        "tenantId": tenant_id,
        "poolId": whole(POOL, pool_id, tenant_id),
        "resources": dict(resource),
        "migProfile": mig_profile,
        "idempotencyKey": idempotency_key,
    }
    answer = call("compute/reservations/create", body)
    emit(answer, show_res)
    if answer["state"] == "failed":
        # A refused admission is an answer, not an API error; scripts still need to tell.
        click.echo(f"error: reservation failed: {answer['reason']}", err=True)
        raise SystemExit(1)


@reservations.command("get")
@tenant_option
@click.argument("reservation_id")
@watch_option
def reservations_get(tenant: str | None, reservation_id: str, watch: bool) -> None:
    """Show one reservation."""
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "reservationId": whole(RESERVATION, reservation_id, tenant_id)}
    shown(lambda: call("compute/reservations/get", body), show_res, watch, tenant_id)


@reservations.command("list")
@tenant_option
@click.option("--pool", "pool_id", help="only this poolId (or its end)")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice(["pending", "placed", "active", "ended", "failed"]),
)
@page_size_option
@watch_option
def reservations_list(
    tenant: str | None,
    pool_id: str | None,
    states: tuple[str, ...],
    page_size: int | None,
    watch: bool,
) -> None:
    """List a tenant's reservations."""
    tenant_id = tenant_of(tenant)
    pool = whole(POOL, pool_id, tenant_id)
    body = {"tenantId": tenant_id, "poolId": pool, "states": list(states)}
    shown(lambda: every("compute/reservations/list", body, page_size), res_table, watch, tenant_id)


@reservations.command("end")
@tenant_option
@click.argument("reservation_id")
def reservations_end(tenant: str | None, reservation_id: str) -> None:
    """End a reservation and free what it holds."""
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "reservationId": whole(RESERVATION, reservation_id, tenant_id)}
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
@watch_option
def budgets_get(tenant: str | None, meter: str, watch: bool) -> None:
    """Show a tenant's budget and spend on a meter."""
    body = {"tenantId": tenant_of(tenant), "meter": meter}
    shown(lambda: call("compute/budgets/get", body), fields(BUDGET_KEYS), watch, body["tenantId"])


if __name__ == "__main__":
    cli(prog_name="better-compute")
