"""Commands for events, join tokens, reservations and budgets (nodes: `nodes.py`)."""

from typing import Any

import click
import msgspec

from controlplane.cli.calls import call, end_of_log, every, next_events
from controlplane.cli.group import cli
from controlplane.cli.ids import POOL, RESERVATION, whole
from controlplane.cli.output import (
    cpus_cell,
    emit,
    fields,
    human_bytes,
    id_cell,
    items,
    short,
    shown,
    table,
    yes,
)
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

RES_HEADERS = ["ID", "POOL", "STATE", "DELIVERY", "RESOURCES", "NODE", "REASON"]


def asked(r: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in r["resources"].items())


def delivery_state(r: dict[str, Any]) -> str | None:
    """D6, D7: how far the host has got with the booking; null until placed."""
    return r["delivery"]["state"] if r.get("delivery") else None


def res_row(r: dict[str, Any]) -> list[Any]:
    node, reason = id_cell(r.get("nodeId")), r.get("reason")
    return [r["id"], id_cell(r["poolId"]), r["state"], delivery_state(r), asked(r), node, reason]


res_table = items(RES_HEADERS, res_row, fit="REASON")


def delivery_text(delivery: dict[str, Any] | None) -> str | None:
    """`delivered (since …)`, or with the agent's reason: `failed: gpu busy: pid 4242 (since …)`."""
    if delivery is None:
        return None
    reason = f": {delivery['reason']}" if delivery.get("reason") else ""
    return f"{delivery['state']}{reason} (since {delivery['at']})"


def memory_text(placement: dict[str, Any]) -> str | None:
    """The booking's memory limit, and the NUMA nodes it comes from when its CPUs are pinned."""
    if placement.get("memoryBytes") is None:
        return None
    nodes = placement.get("memoryNodes")
    return human_bytes(placement["memoryBytes"]) + (f" on NUMA nodes {nodes}" if nodes else "")


def topology_text(topology: dict[str, Any]) -> str | None:
    """D2: `NVLink yes, worst level node, NUMA nodes 0`; NVLink and the worst level are null for
    fewer than two GPUs, so they are left out then."""
    parts = []
    if topology.get("nvlink") is not None:
        parts.append(f"NVLink {yes(topology['nvlink'])}")
    if topology.get("worstLevel"):
        parts.append(f"worst level {topology['worstLevel']}")
    if topology.get("numaNodes"):
        parts.append("NUMA nodes " + ",".join(str(n) for n in topology["numaNodes"]))
    return ", ".join(parts) or None


def device_file(minor: int | None) -> str | None:
    return None if minor is None else f"/dev/nvidia{minor}"


def show_devices(placement: dict[str, Any]) -> None:
    """D4: each GPU, MIG instance and slot the booking holds, one table per kind it has; a GPU
    with its device file, the one the host lets the booking's slice open (D5)."""
    gpus, migs, slots = placement["gpus"], placement["migInstances"], placement["slots"]
    if gpus:
        click.echo()
        table(
            ["GPU", "UUID", "DEVICE", "NUMA"],
            [
                [g["index"], g["uuid"], device_file(g.get("minorNumber")), g.get("numaNode")]
                for g in gpus
            ],
        )
    if migs:
        click.echo()
        table(["GPU", "MIG", "PROFILE"], [[m["gpuIndex"], m["uuid"], m["profile"]] for m in migs])
    if slots:
        click.echo()
        table(["GPU", "SLOT"], [[s["gpuIndex"], s["slot"]] for s in slots])


def show_res(r: dict[str, Any]) -> None:
    """One reservation as `key: value` lines, its ids whole (what `end` and `get` take); once
    placed, where (D4): the node, CPUs, memory, topology, the host's delivery (D6, D7) and a
    table of the devices it holds."""
    mig = f" ({r['migProfile']})" if r.get("migProfile") else ""
    placement = r.get("placement")
    node = f"{placement['hostname']} ({placement['nodeId']})" if placement else r.get("nodeId")
    rows = [
        ["id:", r["id"]],
        ["pool:", r["poolId"]],
        ["state:", r["state"]],
        ["resources:", asked(r) + mig],
        ["node:", node],
        ["reason:", r.get("reason")],
        ["expires:", r.get("expiresAt")],
        ["ends:", r.get("endsAt")],
        ["delivery:", delivery_text(r.get("delivery"))],
    ]
    if placement:
        rows += [
            ["cpus:", cpus_cell(placement.get("cpus"), placement.get("cpuQuota"))],
            ["memory:", memory_text(placement)],
            ["topology:", topology_text(placement["topology"])],
        ]
    table(None, rows)
    if placement:
        show_devices(placement)


@cli.group()
def reservations() -> None:
    """Reservations: capacity held for a tenant."""


@reservations.command("create")
@tenant_option
@click.argument("pool_id")
@click.option("--resource", type=KeyInt(), multiple=True, required=True, help="gpu=2, repeatable")
@click.option("--mig-profile", help="e.g. 1g.10gb, with gpu.mig")
@click.option("--idempotency-key")
@click.option("--duration", type=int, help="durationSeconds: it ends TimeUp then (C4)")
def reservations_create(
    tenant: str | None,
    pool_id: str,
    resource: tuple[tuple[str, int], ...],
    mig_profile: str | None,
    idempotency_key: str | None,
    duration: int | None,
) -> None:
    """Reserve resources in a pool, for a term with --duration."""
    tenant_id = tenant_of(tenant)
    body = {
        "tenantId": tenant_id,
        "poolId": whole(POOL, pool_id, tenant_id),
        "resources": dict(resource),
        "migProfile": mig_profile,
        "idempotencyKey": idempotency_key,
        "durationSeconds": duration,
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
    """Show one reservation: once placed, the node, devices, CPUs and memory it holds and how
    far the host has got delivering it (D4); -o json and -o yaml carry the whole answer."""
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
    """List a tenant's reservations, each with its delivery state (D6, D7)."""
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
