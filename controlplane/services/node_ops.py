"""The owner's verbs on a node (H3): cordon, uncordon, drain, remove.

All four are owner only (``compute:nodes:manage`` on the node's pool; anyone else
NOT_FOUND) and idempotent: asking again for what already holds changes nothing and
emits nothing. A drain cordons the node and waits for its placed and active
reservations to end; at the deadline the rest end with ``NodeDrained``. Removal
ends nothing unless forced (``NodeRemoved``), then deletes the node's rows and
atoms, revokes its credential and frees its machine identity, so the host may
join any pool with a new join token. The method's decision found the node on a pool that
the body's tenant owns: its events go to that tenant.
"""

import time
from typing import Any

from msgspec import UNSET

from controlplane.capacity.bookings import finish
from controlplane.capacity.handover import free_without_host
from controlplane.capacity.liveness import Liveness
from controlplane.capacity.states import node_event, progress_drain
from controlplane.services.call import Call
from controlplane.services.nodes import live_node, views
from controlplane.storage import nodes as node_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import Store, now, timestamp
from controlplane.storage.node_types import NodeRow
from controlplane.storage.sql import Database
from shared.errors import InvalidState
from shared.schemas import (
    NodeRemoved,
    NodesCordon,
    NodesDrain,
    NodesRemove,
    NodesUncordon,
    NodeView,
)


def _written(db: Database, liveness: Liveness, node: NodeRow, fields: dict[str, Any]) -> NodeView:
    """The node's view once ``fields`` are written."""
    return views(db, [node.updated(fields)], liveness)[0]


async def cordon(store: Store, call: Call[NodesCordon]) -> NodeView:
    """H3: the node takes no new placements (node.cordoned); its bookings run on."""
    liveness, req = call.env.liveness, call.body

    def txn(db: Database) -> NodeView:
        node, fields = live_node(call), dict[str, Any]()
        if node.cordon_reason != req.reason:
            at = now()
            fields = {"cordon_reason": req.reason, "cordoned_at": at, "updated_at": at}
            node_sql.update_node(db, node.id, fields)
            node_event(db, "cordoned", node, req.tenant_id, reason=req.reason)
        return _written(db, liveness, node, fields)

    return await store.write(txn)


async def uncordon(store: Store, call: Call[NodesUncordon]) -> NodeView:
    """H3: undo a cordon or a drain (node.uncordoned); the node is schedulable again."""
    liveness, req = call.env.liveness, call.body

    def txn(db: Database) -> NodeView:
        node, fields = live_node(call), dict[str, Any]()
        if node.cordon_reason is not None or node.drain_state is not None:
            fields = {
                "cordon_reason": None,
                "cordoned_at": None,
                "drain_reason": None,
                "drain_state": None,
                "drain_started_at": None,
                "drain_deadline": None,
                "updated_at": now(),
            }
            node_sql.update_node(db, node.id, fields)
            node_event(db, "uncordoned", node, req.tenant_id)
        return _written(db, liveness, node, fields)

    return await store.write(txn)


async def drain(store: Store, call: Call[NodesDrain]) -> NodeView:
    """H3: cordon and wait; drained (node.drained) once no placed or active booking is left,
    at the deadline the rest end with NodeDrained. Draining again changes nothing."""
    liveness, req = call.env.liveness, call.body

    def txn(db: Database) -> NodeView:
        node, fields = live_node(call), dict[str, Any]()
        if node.drain_state is None:
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
            node_sql.update_node(db, node.id, fields)
            node_event(db, "draining", node, req.tenant_id, reason=req.reason, deadline=deadline)
            if progress_drain(db, node.updated(fields), req.tenant_id):
                # drained, or what was live ended at a deadline of 0 and is releasing (D7)
                stored = node_sql.get_node(db, node.id)
                assert stored is not None
                fields.update(drain_state=stored.drain_state)
        return _written(db, liveness, node, fields)

    return await store.write(txn)


async def remove(store: Store, call: Call[NodesRemove]) -> NodeRemoved:
    """H3, D7: INVALID_STATE while placed, active or releasing bookings remain, unless forced
    (the live ones end with NodeRemoved, and what every ended one holds is freed without the
    host); removing a removed node answers the same."""
    req = call.body

    def txn(db: Database) -> NodeRemoved:
        node = call.node  # the method's decision found it, removed or not
        if node.removed_at is not None:
            return NodeRemoved(removed=True)
        live = res_sql.live_on_node(db, node.id)
        releasing = res_sql.releasing_on_node(db, node.id)
        if (live or releasing) and not req.force:
            raise InvalidState(
                f"{len(live)} placed or active and {len(releasing)} releasing reservations are "
                "booked on the node; drain it, or remove it with force: true",
                field="nodeId",
                reservations=[row.id for row in [*live, *releasing]],
            )
        for row in live:
            finish(db, row, "ended", "NodeRemoved", "the node was removed")
        free_without_host(db, node.id)
        node_sql.remove(db, node.id, now())
        node_event(db, "removed", node, req.tenant_id, ended=[row.id for row in live])
        return NodeRemoved(removed=True)

    return await store.write(txn)
