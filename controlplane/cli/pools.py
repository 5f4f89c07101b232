"""Commands for pools, their capacity and quotas."""

from typing import Any

import click

from controlplane.cli.calls import call, every
from controlplane.cli.group import cli
from controlplane.cli.ids import POOL, SITE, whole
from controlplane.cli.output import (
    emit,
    fields,
    id_cell,
    items,
    quota_cell,
    short,
    shown,
    table,
    used_max,
    yes,
)
from controlplane.cli.params import (
    KeyInt,
    as_dict,
    page_size_option,
    policy_option,
    quota_option,
    tenant_of,
    tenant_option,
    watch_option,
)

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
pool_table = items(POOL_HEADERS, pool_row, fit="QUOTA")


def warn(answer: dict[str, Any]) -> None:
    """The answer's warnings on stderr: policy fields nothing reads (P9), resources offered
    over their schedulable capacity (C5)."""
    for warning in answer.get("warnings", []):
        click.echo(f"warning: {warning}", err=True)


def show_pool(p: dict[str, Any]) -> None:
    warn(p)
    fields(["id", "ownerTenantId", "siteId", "class", "gpuModel", "sharing", "agent", "version"])(p)
    click.echo(f"owned: {yes(p['owned'])}  archived: {yes(p['archived'])}")
    click.echo(f"quota: {quota_cell(p['quotas'])}")
    for offer in p.get("offers", []):
        quota = ", ".join(f"{k} {v}" for k, v in offer["quota"].items())
        ends = f", until {offer['notAfter']}" if offer.get("notAfter") else ""
        click.echo(
            f"offered to {offer['toTenantId']}: {quota} (priority {offer['priority']}{ends})"
        )
    if p.get("offerEndsAt"):  # C3: the end of the offer this tenant holds
        click.echo(f"offer ends: {p['offerEndsAt']}")
    click.echo(f"policy: {short(p['policy'])}")


SHOWN_HOSTS = 5  # a group of nodes names this many of its hosts


def show_plan(answer: dict[str, Any]) -> None:
    """C1, C2: a dry-run update for people: the nodes grouped by what the change does to them
    (the units it adds, changes or removes and what they need), the bookings in the way,
    capacity before → after, the offered quotas the new capacity would not cover, and the
    version to apply it with."""
    plan = answer["plan"]
    warn(plan)
    groups: dict[str, list[dict[str, Any]]] = {}
    for node in plan["nodes"]:
        key = repr([node["units"], node["drainNeeded"], node["rebootNeeded"]])
        groups.setdefault(key, []).append(node)
    for nodes in groups.values():
        first = nodes[0]
        hosts = ", ".join(n["hostname"] for n in nodes[:SHOWN_HOSTS])
        more = f" and {len(nodes) - SHOWN_HOSTS} more" if len(nodes) > SHOWN_HOSTS else ""
        needs = [
            what
            for what, flag in (("drain", first["drainNeeded"]), ("reboot", first["rebootNeeded"]))
            if flag
        ]
        count = f"{len(nodes)} node" + ("s" if len(nodes) > 1 else "")
        click.echo(f"{count} ({hosts}{more}): " + (", ".join(needs) or "no drain, no reboot"))
        for unit in first["units"]:
            needed = "".join(f"  needs {n}" for n in unit["needs"])
            click.echo(f"  {unit['change']:<6} {unit['id']}{needed}")
        if not first["units"]:
            click.echo("  no unit changes")
        in_the_way = [r for n in nodes for r in n["bookingsInTheWay"]]
        if in_the_way:
            click.echo(f"  bookings in the way: {', '.join(in_the_way)}")
    click.echo()
    table(
        ["RESOURCE", "BEFORE", "AFTER"],
        [
            [
                c["resource"],
                c["before"],
                f"{c['after']}" + (" (less)" if c["after"] < c["before"] else ""),
            ]
            for c in plan["capacity"]
        ],
    )
    uncovered = [q for q in plan["quotas"] if not q["covered"]]
    for quota in uncovered:
        click.echo(
            f"uncovered: {quota['tenantId']} {quota['resource']} max {quota['max']} over "
            f"{quota['schedulableAfter']} schedulable after"
        )
    if not uncovered:
        click.echo("every offered quota stays covered")
    click.echo(f"apply with: --version {answer['pool']['version']}")


CAPACITY_HEADERS = [
    "RESOURCE", "TOTAL", "SCHEDULABLE", "ALLOCATED", "AVAILABLE", "RELEASING", "OFFERED",
    "COVERAGE",
]  # fmt: skip


def capacity_table(answer: Any) -> None:
    """H6, the capacity ledger: TOTAL over every node, SCHEDULABLE over ready, schedulable
    nodes and healthy GPUs, ALLOCATED booked, AVAILABLE schedulable and not booked, RELEASING
    the part of ALLOCATED that ended bookings hold until their host confirms the release (D7),
    OFFERED the quota sold to other tenants and COVERAGE schedulable ÷ offered (C5: under 1
    oversold), the owner's view only (`-` for anyone else and where nothing is offered)."""
    table(
        CAPACITY_HEADERS,
        [
            [
                r["resource"],
                r["total"],
                r["schedulable"],
                r["allocated"],
                r["available"],
                r["releasing"],
                r.get("offered"),
                None if r.get("coverage") is None else f"{r['coverage']:.2f}",
            ]
            for r in answer["items"]
        ],
    )


@cli.group()
def pools() -> None:
    """Pools: create, offer to tenants, update, archive."""


@pools.command("list")
@tenant_option
@page_size_option
@watch_option
def pools_list(tenant: str | None, page_size: int | None, watch: bool) -> None:
    """List the pools a tenant owns or is offered."""
    body = {"tenantId": tenant_of(tenant)}
    shown(lambda: every("compute/pools/list", body, page_size), pool_table, watch, body["tenantId"])


@pools.command("get")
@tenant_option
@click.argument("pool_id")
@watch_option
def pools_get(tenant: str | None, pool_id: str, watch: bool) -> None:
    """Show one pool."""
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "poolId": whole(POOL, pool_id, tenant_id)}
    shown(lambda: call("compute/pools/get", body), show_pool, watch, tenant_id)


@pools.command("create")
@tenant_option
@click.option("--site", "site_id", required=True, help="siteId (or its end)")
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
    tenant_id = tenant_of(tenant)
    body = {
        "tenantId": tenant_id,
        "siteId": whole(SITE, site_id, tenant_id),
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
@click.option(
    "--not-after",
    help="when the offer ends (RFC 3339, e.g. 2027-01-01T00:00:00Z); `none` clears it; "
    "left out, an existing offer keeps its end",
)
def pools_offer(
    tenant: str | None,
    pool_id: str,
    to_tenant: str,
    quota: tuple[tuple[str, int], ...],
    include_descendants: bool,
    priority: int | None,
    not_after: str | None,
) -> None:
    """Offer a pool to a tenant with a quota, for a term with --not-after (C3)."""
    tenant_id = tenant_of(tenant)
    body = {
        "tenantId": tenant_id,
        "poolId": whole(POOL, pool_id, tenant_id),
        "toTenantId": to_tenant,
        "quota": dict(quota),
        "includeDescendants": include_descendants,
        "priority": priority,
        "notAfter": None if not_after == "none" else not_after,
    }
    clears = ("notAfter",) if not_after == "none" else ()
    emit(call("compute/pools/offer", body, nulls=clears), show_pool)


@pools.command("unoffer")
@tenant_option
@click.argument("pool_id")
@click.option("--to", "to_tenant", required=True, help="toTenantId")
def pools_unoffer(tenant: str | None, pool_id: str, to_tenant: str) -> None:
    """Withdraw a pool's offer to a tenant."""
    tenant_id = tenant_of(tenant)
    pool = whole(POOL, pool_id, tenant_id)
    body = {"tenantId": tenant_id, "poolId": pool, "toTenantId": to_tenant}
    emit(call("compute/pools/unoffer", body), fields(["removed"]))


@pools.command("update")
@tenant_option
@click.argument("pool_id")
@policy_option
@click.option("--gpu-model")
@click.option("--version", type=click.IntRange(1), help="the version the change was planned at")
@click.option("--dry-run", is_flag=True, help="change nothing: print the plan (C1)")
def pools_update(
    tenant: str | None,
    pool_id: str,
    policy: Any,
    gpu_model: str | None,
    version: int | None,
    dry_run: bool,
) -> None:
    """Change a pool's policy or GPU model; --dry-run plans it first (nodes, units and what
    they need, capacity before → after, uncovered quotas), --version applies that plan."""
    tenant_id = tenant_of(tenant)
    body = {
        "tenantId": tenant_id,
        "poolId": whole(POOL, pool_id, tenant_id),
        "policy": policy,
        "gpuModel": gpu_model,
        "version": version,
    }
    if dry_run:
        emit(call("compute/pools/update", {**body, "dryRun": True}), show_plan)
    else:
        emit(call("compute/pools/update", body), show_pool)


@pools.command("archive")
@tenant_option
@click.argument("pool_id")
def pools_archive(tenant: str | None, pool_id: str) -> None:
    """Archive a pool."""
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "poolId": whole(POOL, pool_id, tenant_id)}
    emit(call("compute/pools/archive", body), show_pool)


@pools.command("capacity")
@tenant_option
@click.argument("pool_id")
@watch_option
def pools_capacity(tenant: str | None, pool_id: str, watch: bool) -> None:
    """A pool's capacity ledger by resource (H6)."""
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "poolId": whole(POOL, pool_id, tenant_id)}
    shown(lambda: call("compute/pools/capacity", body), capacity_table, watch, tenant_id)


@cli.command("capacity")
@tenant_option
@click.argument("pool_id")
@watch_option
def capacity(tenant: str | None, pool_id: str, watch: bool) -> None:
    """A pool's capacity ledger by resource (capacity/byPool, H6)."""
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "poolId": whole(POOL, pool_id, tenant_id)}
    shown(lambda: call("compute/capacity/byPool", body), capacity_table, watch, tenant_id)


# --- quotas and events -----------------------------------------------------------

QUOTA_HEADERS = ["TENANT", "POOL", "RESOURCE", "USED/MAX", "AVAILABLE"]


def quota_rows(answer: Any) -> None:
    warn(answer)
    table(
        QUOTA_HEADERS,
        [
            [r["tenantId"], id_cell(r["poolId"]), r["resource"], used_max(r), r["available"]]
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
    tenant_id = tenant_of(tenant)
    body = {
        "tenantId": tenant_id,
        "poolId": whole(POOL, pool_id, tenant_id),
        "forTenantId": for_tenant,
        "quota": dict(quota),
    }
    emit(call("compute/quotas/set", body), quota_rows)


@quotas.command("list")
@tenant_option
@click.option("--pool", "pool_id", help="only this poolId (or its end)")
@page_size_option
@watch_option
def quotas_list(
    tenant: str | None, pool_id: str | None, page_size: int | None, watch: bool
) -> None:
    """List the caller tenant's quota rows."""
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "poolId": whole(POOL, pool_id, tenant_id)}
    shown(lambda: every("compute/quotas/list", body, page_size), quota_rows, watch, tenant_id)
