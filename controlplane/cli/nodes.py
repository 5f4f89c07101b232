"""Commands for nodes: list (a pool's or the fleet's, H7), get, and the owner's verbs (H3).

A node's STATE is the API's `state` (configuring, ready, quarantined, lost, H1); its REASON
says why it takes no new bookings or is not ready: a drain or a cordon with the reason given
(H3), else `stateReason`. GPUs are counted by family with the unhealthy and unknown ones
named (H5), e.g. `8x H100 (1 unhealthy)`.
"""

from typing import Any

import click

from controlplane.cli.calls import call, every
from controlplane.cli.group import cli
from controlplane.cli.ids import NODE, POOL, whole
from controlplane.cli.output import (
    cpus_cell,
    emit,
    fields,
    human_bytes,
    id_cell,
    shown,
    table,
    yes,
)
from controlplane.cli.params import (
    Duration,
    page_size_option,
    tenant_of,
    tenant_option,
    watch_option,
)

NODE_STATES = ["configuring", "ready", "quarantined", "lost"]


# --- cells -----------------------------------------------------------------------


def reason_cell(n: dict[str, Any]) -> str | None:
    """H3 first (a drain, else a cordon, with its reason), then the state's own reason (H1)."""
    parts = []
    if n.get("drain"):
        parts.append(f"{n['drain']['state']}: {n['drain']['reason']}")
    elif n.get("cordon"):
        parts.append(f"cordoned: {n['cordon']['reason']}")
    if n.get("stateReason"):
        parts.append(n["stateReason"])
    return "; ".join(parts) or None


def gpu_cell(gpus: list[dict[str, Any]]) -> str | None:
    """`8x H100 (1 unhealthy)`: GPUs by family (the NVML name when there is none), H5."""
    if not gpus:
        return None
    counts: dict[str, int] = {}
    for g in gpus:
        model = g.get("family") or g["name"]
        counts[model] = counts.get(model, 0) + 1
    cell = ", ".join(f"{count}x {model}" for model, count in counts.items())
    health = [
        f"{count} {kind}"
        for kind in ("unhealthy", "unknown")
        if (count := sum(1 for g in gpus if g.get("health") == kind))
    ]
    return f"{cell} ({', '.join(health)})" if health else cell


def node_row(n: dict[str, Any], fleet: bool = False) -> list[Any]:
    pool = [id_cell(n["poolId"])] if fleet else []
    return [n["id"], *pool, n["hostname"], n["state"], gpu_cell(n["gpus"]), reason_cell(n)]


def node_headers(fleet: bool = False) -> list[str]:
    return ["ID", *(["POOL"] if fleet else []), "HOSTNAME", "STATE", "GPUS", "REASON"]


def node_table(nodes: list[dict[str, Any]], fleet: bool = False) -> None:
    headers = node_headers(fleet)
    table(headers, [node_row(n, fleet) for n in nodes], fit=headers.index("REASON"))


def version_cell(n: dict[str, Any]) -> str:
    """H1: the spec version the node applied cleanly beside the one it should run (content
    hashes, cut to 12 characters as git does; --json has them whole)."""
    spec, applied = n.get("specVersion"), n.get("appliedVersion")
    if spec is not None and applied == spec:
        return f"{spec[:12]} (applied)"
    return f"{spec[:12] if spec else '-'} (applied: {applied[:12] if applied else 'none yet'})"


def node_summary(n: dict[str, Any]) -> None:
    """The node's lifecycle as `key: value` lines: what the verbs answer (H1, H2, H3)."""
    cordon, drain = n.get("cordon"), n.get("drain")
    drain_text = None
    if drain:
        deadline = drain.get("deadline") or "none"
        drain_text = (
            f"{drain['state']}: {drain['reason']} (since {drain['startedAt']}, deadline {deadline})"
        )
    rows = [
        ["id:", n["id"]],
        ["pool:", n["poolId"]],
        ["hostname:", n["hostname"]],
        ["state:", n["state"]],
        ["reason:", n.get("stateReason")],
        ["schedulable:", yes(n["schedulable"])],
        ["cordon:", f"{cordon['reason']} (since {cordon['at']})" if cordon else None],
        ["drain:", drain_text],
        ["pending reboot:", yes(n.get("pendingReboot", False))],
        ["spec version:", version_cell(n)],
        ["last seen:", n.get("lastSeenAt")],
    ]
    table(None, rows)


def booked_devices(b: dict[str, Any], n: dict[str, Any]) -> str | None:
    """What a booking holds, by the node's GPU indices: `gpu 0,1`, `2x 1g.10gb on gpu 0`,
    `slots 0,1 on gpu 3`. The node's inventory names each UUID; one it does not name is
    shown as it is."""
    index = {g["uuid"]: g["index"] for g in n["gpus"]}
    mig = {
        m["uuid"]: f"{m['profile']} on gpu {g['index']}"
        for g in (n.get("inventory") or {}).get("gpus", [])
        for m in g.get("migInstances", [])
    }
    parts = []
    if b["gpus"]:
        parts.append("gpu " + ",".join(str(index.get(uuid, uuid)) for uuid in b["gpus"]))
    instances: dict[str, int] = {}
    for uuid in b["migInstances"]:
        instances[mig.get(uuid, uuid)] = instances.get(mig.get(uuid, uuid), 0) + 1
    parts += [f"{count}x {label}" for label, count in instances.items()]
    slots: dict[str, list[str]] = {}
    for slot in b["slots"]:  # "gpuIndex/slot"
        gpu, _, number = slot.partition("/")
        slots.setdefault(gpu, []).append(number)
    parts += [f"slots {','.join(numbers)} on gpu {gpu}" for gpu, numbers in slots.items()]
    return ", ".join(parts) or None


BOOKING_HEADERS = ["RESERVATION", "TENANT", "DEVICES", "CPUS", "MEMORY", "DELIVERY"]


def bookings_table(n: dict[str, Any]) -> None:
    """D4, the owner's view: each live or releasing booking on the node, its reservation id
    whole, whose it is, what it holds and how far the host has got with it (D6, D7)."""
    table(
        BOOKING_HEADERS,
        [
            [
                b["reservationId"],
                b["tenantId"],
                booked_devices(b, n),
                cpus_cell(b.get("cpus"), b.get("cpuQuota")),
                None if b.get("memoryBytes") is None else human_bytes(b["memoryBytes"]),
                b["delivery"],
            ]
            for b in n.get("bookings", [])
        ],
        fit=BOOKING_HEADERS.index("DEVICES"),
    )


def show_node(n: dict[str, Any]) -> None:
    """`nodes get`: the lifecycle, each GPU's health (H5), rows and atoms, then the bookings
    on it (D4)."""
    node_summary(n)
    if n["gpus"]:
        click.echo()
        table(
            ["GPU", "NAME", "MEMORY", "HEALTH", "REASON"],
            [
                [
                    g["index"],
                    g["name"],
                    human_bytes(g["memoryBytes"]),
                    g.get("health", "-"),
                    g.get("healthReason"),
                ]
                for g in n["gpus"]
            ],
            fit=4,
        )
    rows: list[list[Any]] = [
        [r["resource"], r["capacity"], r["allocated"], f"{r['ratio']:g}", "-", "-"]
        for r in n["resources"]
    ]
    # GPU atoms (gpu, gpu.mig by profile, gpu.slot) as rows beside node_resources: how many
    # are booked, on an unhealthy GPU (H5) or held for a drain-gated unit (H4).
    atoms: dict[str, list[int]] = {}
    for device in n.get("devices", []):
        key = device["resource"] + (f" {device['profile']}" if device.get("profile") else "")
        counts = atoms.setdefault(key, [0, 0, 0, 0])
        counts[0] += 1
        counts[1] += int(device["allocated"])
        counts[2] += int(device.get("unhealthy", False))
        counts[3] += int(device.get("held", False))
    rows += [[key, *counts[:2], "-", *counts[2:]] for key, counts in sorted(atoms.items())]
    click.echo()
    table(["RESOURCE", "CAPACITY", "ALLOCATED", "RATIO", "UNHEALTHY", "HELD"], rows)
    if n.get("bookings"):  # an empty list is left out of the answer
        click.echo()
        bookings_table(n)


# --- commands --------------------------------------------------------------------


@cli.group()
def nodes() -> None:
    """Nodes: machines joined to pools; cordon, drain and remove them (H3)."""


@nodes.command("list", short_help="A pool's nodes, or the fleet's (H7).")
@tenant_option
@click.argument("pool_id", required=False)
@click.option("--state", "states", multiple=True, type=click.Choice(NODE_STATES), help="repeatable")
@page_size_option
@watch_option
def nodes_list(
    tenant: str | None,
    pool_id: str | None,
    states: tuple[str, ...],
    page_size: int | None,
    watch: bool,
) -> None:
    """List a pool's nodes, or without POOL_ID every node of every pool the tenant owns (the
    fleet view, H7). Follows `next` to the end: the table (and -o json's items) hold every
    node."""
    tenant_id = tenant_of(tenant)
    pool = whole(POOL, pool_id, tenant_id)
    body = {"tenantId": tenant_id, "poolId": pool, "states": list(states)}
    shown(
        lambda: every("compute/nodes/list", body, page_size),
        lambda answer: node_table(answer["items"], fleet=pool_id is None),
        watch,
        tenant_id,
    )


@nodes.command("get", short_help="One node: state, health, rows, atoms and bookings.")
@tenant_option
@click.argument("node_id")
@watch_option
def nodes_get(tenant: str | None, node_id: str, watch: bool) -> None:
    """Show one node: state and reason, schedulable, cordon, drain, pending reboot, applied
    and spec versions (H1, H3), each GPU's health (H5), its resource rows and GPU atoms, and
    the live and releasing bookings on it (D4: reservation, tenant, devices, CPUs, delivery)."""
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "nodeId": whole(NODE, node_id, tenant_id)}
    shown(lambda: call("compute/nodes/get", body), show_node, watch, tenant_id)


@nodes.command("cordon", short_help="Take no new bookings on a node (H3).")
@tenant_option
@click.argument("node_id")
@click.option("--reason", required=True, help="why: shown with the node (1-500 characters)")
def nodes_cordon(tenant: str | None, node_id: str, reason: str) -> None:
    """Take no new bookings on a node; its bookings run on (H3, owner only; idempotent)."""
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "nodeId": whole(NODE, node_id, tenant_id), "reason": reason}
    emit(call("compute/nodes/cordon", body), node_summary)


@nodes.command("uncordon", short_help="Undo a cordon or a drain (H3).")
@tenant_option
@click.argument("node_id")
def nodes_uncordon(tenant: str | None, node_id: str) -> None:
    """Undo a cordon or a drain: the node takes bookings again (H3, owner only; idempotent)."""
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "nodeId": whole(NODE, node_id, tenant_id)}
    emit(call("compute/nodes/uncordon", body), node_summary)


@nodes.command("drain", short_help="Cordon and wait for bookings to end (H3).")
@tenant_option
@click.argument("node_id")
@click.option("--reason", required=True, help="why: shown with the node (1-500 characters)")
@click.option(
    "--deadline", type=Duration(), help="end what is still booked after this: 90s, 30m, 2h, 1d"
)
def nodes_drain(tenant: str | None, node_id: str, reason: str, deadline: int | None) -> None:
    """Cordon a node and wait for its bookings to end: `drained` once none is left; at the
    deadline the rest end with NodeDrained (H3, owner only; draining again changes nothing)."""
    tenant_id = tenant_of(tenant)
    body = {
        "tenantId": tenant_id,
        "nodeId": whole(NODE, node_id, tenant_id),
        "reason": reason,
        "deadlineSeconds": deadline,
    }
    emit(call("compute/nodes/drain", body), node_summary)


@nodes.command("remove", short_help="Remove a node from its pool (H3).")
@tenant_option
@click.argument("node_id")
@click.option("--force", is_flag=True, help="end its bookings (NodeRemoved) rather than refuse")
def nodes_remove(tenant: str | None, node_id: str, force: bool) -> None:
    """Remove a node: its rows, atoms and credential go and the host may join any pool. Refused
    (INVALID_STATE) while bookings are placed or active on it, unless --force (H3, owner
    only; idempotent)."""
    tenant_id = tenant_of(tenant)
    node = whole(NODE, node_id, tenant_id)
    body = {"tenantId": tenant_id, "nodeId": node, "force": force or None}
    emit(call("compute/nodes/remove", body), fields(["removed"]))
