"""A node's state machine: admission and what its agent applied decide ready, configuring or
quarantined (H1); lost and back (H1, H8); a drain that ends (H3); and the events that tell
the pool's owner (node.<state>, node.gpuHealthy/gpuUnhealthy, H5).

``readmit`` answers the node's columns that moved (the node's reconcile writes them with the
rest, capacity/nodes.py); the others write their own step.
"""

from typing import Any, Protocol

from controlplane.capacity.admission import (
    CONFIGURING,
    LOST,
    QUARANTINED,
    READY,
    admission,
    configured,
)
from controlplane.capacity.bookings import finish
from controlplane.storage import events
from controlplane.storage import nodes as node_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import now
from controlplane.storage.node_types import NodePool, NodeRow
from controlplane.storage.sql import Database
from shared.inventory import Inventory

# A quarantine reason is shown to people; an exception's text can be long.
MAX_REASON = 500
WAITING = "waiting for the agent to apply its NodeSpec"


class Named(Protocol):
    """What a node's events name it by (a NodeRow, or the lost-node check's SilentRow)."""

    @property
    def id(self) -> str: ...

    @property
    def pool_id(self) -> str: ...

    @property
    def hostname(self) -> str: ...


def node_event(db: Database, kind: str, node: Named, owner_tenant_id: str, **data: Any) -> None:
    """``node.<kind>`` for the pool's owner, naming the node."""
    events.append(
        db,
        f"node.{kind}",
        pool_id=node.pool_id,
        data={"nodeId": node.id, "hostname": node.hostname, **data},
        audience=[owner_tenant_id],
    )


def state_event(
    db: Database, node: Named, owner_tenant_id: str, state: str, reason: str | None
) -> None:
    """node.ready, node.configuring or node.quarantined, for the pool's owner."""
    node_event(db, state, node, owner_tenant_id, state=state, reason=reason)


def readmit(
    db: Database,
    node: NodeRow,
    pool: NodePool,
    inventory: Inventory,
    refusal: str | None,
    spec_version: str | None,
) -> dict[str, Any]:
    """Re-decide a live node's state under its pool's current policy and what its agent has
    applied (H1): the node's columns that moved (none: nothing to write); a new state is
    told to the owner.

    ``refusal`` is why the pool's policy cannot be rendered for this host, if it cannot.
    """
    if node.state == LOST:
        return {}
    state, reason = admission(pool.gpu_model, pool.policy, inventory)
    if state == READY and refusal is not None:
        state, reason = QUARANTINED, refusal
    fields: dict[str, Any] = {}
    if state == READY:
        done = configured(
            spec_version,
            node.applied,
            node.applied_version,
            node.state == READY,
            node.pending_reboot,
        )
        state, reason = done.state, done.reason or blocked_reason(db, node)
        if (done.applied_version, done.pending_reboot) != (
            node.applied_version,
            node.pending_reboot,
        ):
            fields.update(applied_version=done.applied_version, pending_reboot=done.pending_reboot)
    if (state, reason) != (node.state, node.state_reason):
        fields.update(state=state, state_reason=reason)
        state_event(db, node, pool.owner_tenant_id, state, reason)
    if fields:
        fields.update(updated_at=now())
    return fields


def blocked_reason(db: Database, node: NodeRow) -> str | None:
    """D7: why the node's devices are held after a release, for its ``stateReason``."""
    if not any(b.state == "release" for b in node.bookings):
        return None
    blocked = [
        r for r in res_sql.releasing_on_node(db, node.id) if r.delivery_state == "release-blocked"
    ]
    if not blocked:
        return None
    return "release blocked: " + "; ".join(f"{r.id}: {r.delivery_reason}" for r in blocked)


def quarantine_unreconcilable(db: Database, node: NodeRow, pool: NodePool, error: str) -> None:
    """R5: a node the pass cannot reconcile leaves placement with the reason; once its pool or
    inventory changes so that it can be, the next pass re-decides its state."""
    reason = f"cannot be reconciled: {error}"[:MAX_REASON]
    if node.state in (LOST, QUARANTINED) and node.state_reason == reason:
        return
    if node.state == LOST:
        return  # lost stays lost until it reports
    node_sql.update_node(
        db, node.id, {"state": QUARANTINED, "state_reason": reason, "updated_at": now()}
    )
    state_event(db, node, pool.owner_tenant_id, QUARANTINED, reason)


def back_from_lost(node: NodeRow) -> tuple[str, str | None]:
    """H1: a lost node that reports again is ready if it ever applied a spec cleanly, else
    still configuring (its reconcile then re-decides: acceptance, family, render, what it
    applied)."""
    if node.applied_version is not None:
        return READY, None
    return CONFIGURING, WAITING


def progress_drain(db: Database, node: NodeRow, owner_tenant_id: str) -> bool:
    """H3, D7: a draining node is drained when nothing is booked on it, live or releasing;
    past its deadline, what is live ends with NodeDrained first. True if it moved."""
    live = res_sql.live_on_node(db, node.id)
    if live:
        if node.drain_deadline is None or node.drain_deadline > now():
            return False
        for row in live:
            finish(db, row, "ended", "NodeDrained", "the node's drain reached its deadline")
    if res_sql.releasing_on_node(db, node.id):  # drained once the host confirms the release
        return bool(live)
    node_sql.update_node(db, node.id, {"drain_state": "drained", "updated_at": now()})
    node_event(db, "drained", node, owner_tenant_id, ended=[row.id for row in live])
    return True


def health_events(
    db: Database, node: Named, owner_tenant_id: str, before: Inventory | None, after: Inventory
) -> None:
    """H5: node.gpuUnhealthy when a GPU stops being healthy (or joins so), node.gpuHealthy
    when it is healthy again; one event per GPU whose verdict moved."""
    was = {gpu.uuid: gpu.health for gpu in before.gpus} if before else {}
    for gpu in after.gpus:
        old = was.get(gpu.uuid, "healthy")
        if (old == "healthy") == (gpu.health == "healthy"):
            continue
        node_event(
            db,
            "gpuHealthy" if gpu.health == "healthy" else "gpuUnhealthy",
            node,
            owner_tenant_id,
            gpu=gpu.uuid,
            index=gpu.index,
            health=gpu.health,
            reasons=gpu.health_reasons,
        )
