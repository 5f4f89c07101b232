"""The owner's verbs on a node (H3): cordon, uncordon, drain, remove; and a drain's progress.

All four are owner only (``compute:nodes:manage`` on the node's pool; anyone else
NOT_FOUND) and idempotent: asking again for what already holds changes nothing and
emits nothing. A drain cordons the node and waits for its placed and active
reservations to end; at the deadline the rest end with ``NodeDrained``. Removal
ends nothing unless forced (``NodeRemoved``), then deletes the node's rows and
atoms, revokes its credential and frees its machine identity, so the host may
join any pool with a new join token.
"""

import time
from typing import Any

from msgspec import UNSET

from controlplane.capacity.bookings import finish
from controlplane.capacity.liveness import Liveness
from controlplane.iam.decide import Principal
from controlplane.services.nodes import get_node, owned_node
from controlplane.storage import events
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import Store, now, timestamp
from controlplane.storage.sql import Database
from shared.errors import InvalidState
from shared.schemas import (
    NodeRemoved,
    NodesCordon,
    NodesDrain,
    NodesGet,
    NodesRemove,
    NodesUncordon,
    NodeView,
)


def _event(db: Database, kind: str, node: dict[str, Any], **data: Any) -> None:
    pool = pool_sql.get_pool(db, node["pool_id"])
    assert pool is not None
    events.append(
        db,
        f"node.{kind}",
        pool_id=node["pool_id"],
        data={"nodeId": node["id"], "hostname": node["hostname"], **data},
        audience=[pool.owner_tenant_id],
    )


def _answer(
    db: Database, principal: Principal, liveness: Liveness, tenant: str, node: str
) -> NodeView:
    return get_node(db, principal, liveness, NodesGet(tenant_id=tenant, node_id=node))


async def cordon(
    store: Store, liveness: Liveness, principal: Principal, req: NodesCordon
) -> NodeView:
    """H3: the node takes no new placements (node.cordoned); its bookings run on."""

    def txn(db: Database) -> NodeView:
        node = owned_node(db, principal, req.tenant_id, req.node_id, "compute:nodes:manage")
        if node["cordon_reason"] != req.reason:
            at = now()
            node_sql.update_node(
                db, node["id"], {"cordon_reason": req.reason, "cordoned_at": at, "updated_at": at}
            )
            _event(db, "cordoned", node, reason=req.reason)
        return _answer(db, principal, liveness, req.tenant_id, node["id"])

    return await store.write(txn)


async def uncordon(
    store: Store, liveness: Liveness, principal: Principal, req: NodesUncordon
) -> NodeView:
    """H3: undo a cordon or a drain (node.uncordoned); the node is schedulable again."""

    def txn(db: Database) -> NodeView:
        node = owned_node(db, principal, req.tenant_id, req.node_id, "compute:nodes:manage")
        if node["cordon_reason"] is not None or node["drain_state"] is not None:
            node_sql.update_node(
                db,
                node["id"],
                {
                    "cordon_reason": None,
                    "cordoned_at": None,
                    "drain_reason": None,
                    "drain_state": None,
                    "drain_started_at": None,
                    "drain_deadline": None,
                    "updated_at": now(),
                },
            )
            _event(db, "uncordoned", node)
        return _answer(db, principal, liveness, req.tenant_id, node["id"])

    return await store.write(txn)


async def drain(
    store: Store, liveness: Liveness, principal: Principal, req: NodesDrain
) -> NodeView:
    """H3: cordon and wait; drained (node.drained) once no placed or active booking is left,
    at the deadline the rest end with NodeDrained. Draining again changes nothing."""

    def txn(db: Database) -> NodeView:
        node = owned_node(db, principal, req.tenant_id, req.node_id, "compute:nodes:manage")
        if node["drain_state"] is None:
            started = time.time()
            deadline = (
                None if req.deadline_seconds is UNSET else timestamp(started + req.deadline_seconds)
            )
            fields = {
                "drain_reason": req.reason,
                "drain_state": "draining",
                "drain_started_at": timestamp(started),
                "drain_deadline": deadline,
                "updated_at": timestamp(started),
            }
            node_sql.update_node(db, node["id"], fields)
            _event(db, "draining", node, reason=req.reason, deadline=deadline)
            progress_drain(db, {**node, **fields})
        return _answer(db, principal, liveness, req.tenant_id, node["id"])

    return await store.write(txn)


def progress_drain(db: Database, node: dict[str, Any]) -> bool:
    """A draining node: drained when nothing is booked on it; past its deadline, what is
    left ends with NodeDrained first. True if it moved."""
    live = res_sql.live_on_node(db, node["id"])
    if live:
        if node["drain_deadline"] is None or node["drain_deadline"] > now():
            return False
        for row in live:
            finish(db, row, "ended", "NodeDrained", "the node's drain reached its deadline")
    node_sql.update_node(db, node["id"], {"drain_state": "drained", "updated_at": now()})
    _event(db, "drained", node, ended=[row.id for row in live])
    return True


async def remove(store: Store, principal: Principal, req: NodesRemove) -> NodeRemoved:
    """H3: INVALID_STATE while placed or active bookings remain, unless forced (they end
    with NodeRemoved); removing a removed node answers the same."""

    def txn(db: Database) -> NodeRemoved:
        node = node_sql.get_node(db, req.node_id)  # the method's decision found it
        assert node is not None
        if node["removed_at"] is not None:
            return NodeRemoved(removed=True)
        live = res_sql.live_on_node(db, node["id"])
        if live and not req.force:
            raise InvalidState(
                f"{len(live)} placed or active reservations are booked on the node; drain it, "
                "or remove it with force: true",
                field="nodeId",
                reservations=[row.id for row in live],
            )
        for row in live:
            finish(db, row, "ended", "NodeRemoved", "the node was removed")
        node_sql.remove(db, node["id"], now())
        _event(db, "removed", node, ended=[row.id for row in live])
        return NodeRemoved(removed=True)

    return await store.write(txn)
