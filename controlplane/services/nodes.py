"""Nodes as their pool's owner sees them: one node, a pool's nodes, or the fleet (H7).

Each node shows its state and why (H1), whether the placer may book on it
(H2), its cordon and drain (H3), and each GPU's health (H5).
"""

from typing import Any

import msgspec
from msgspec import UNSET

from controlplane.capacity.admission import READY
from controlplane.capacity.liveness import Liveness
from controlplane.services.access import readable_pools
from controlplane.services.call import Call
from controlplane.services.paging import page, position, scope
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.node_types import NodeRow
from controlplane.storage.sql import Database
from controlplane.storage.types import ReservationRow
from shared.errors import NotFound
from shared.inventory import Inventory
from shared.schemas import (
    CordonView,
    DeviceView,
    DrainView,
    GpuSummary,
    NodeBookingView,
    NodeList,
    NodesGet,
    NodesList,
    NodeView,
    ResourceRowView,
)


def views(db: Database, nodes: list[NodeRow], liveness: Liveness) -> list[NodeView]:
    """The nodes as their owner sees them, their rows and atoms read once for all of them."""
    ids = [node.id for node in nodes]
    resources: dict[str, list[ResourceRowView]] = {i: [] for i in ids}
    devices: dict[str, list[DeviceView]] = {i: [] for i in ids}
    if ids:
        for row in node_sql.resource_rows_of(db, ids):
            resources[row.node_id].append(
                ResourceRowView(
                    resource=row.resource,
                    capacity=row.capacity,
                    allocated=row.allocated,
                    ratio=row.ratio,
                )
            )
        for atom in node_sql.devices_of(db, ids):
            devices[atom.node_id].append(
                DeviceView(
                    device_id=atom.device_id,
                    resource=atom.resource,
                    gpu_uuid=atom.gpu_uuid,
                    profile=atom.profile,
                    allocated=atom.allocated,
                    unhealthy=atom.unhealthy,
                    held=atom.held,
                )
            )
    bookings: dict[str, list[NodeBookingView]] = {node_id: [] for node_id in ids}
    for held in res_sql.held_on_nodes(db, ids):
        assert held.node_id is not None
        bookings[held.node_id].append(booking_view(held))
    found = []
    for node in nodes:
        inventory, applied = readable(node)
        gpus = inventory.gpus if inventory else []
        found.append(
            NodeView(
                id=node.id,
                pool_id=node.pool_id,
                hostname=node.hostname,
                state=node.state,
                state_reason=node.state_reason,
                tenant_owned=node.tenant_owned,
                joined_at=node.created_at,
                last_seen_at=liveness.last_seen(node.id) or node.last_seen_at,
                gpus=[
                    GpuSummary(
                        index=g.index,
                        uuid=g.uuid,
                        name=g.name,
                        family=g.family,
                        memory_bytes=g.memory_bytes,
                        mig=g.mig_current,
                        health=g.health,
                        health_reason=", ".join(g.health_reasons) or None,
                    )
                    for g in gpus
                ],
                resources=resources[node.id],
                devices=devices[node.id],
                inventory=inventory,
                spec_version=node.spec_version,
                applied_version=node.applied_version,
                pending_reboot=node.pending_reboot,
                schedulable=schedulable(node),
                cordon=cordon_of(node),
                drain=drain_of(node),
                applied=applied,
                bookings=bookings[node.id],
            )
        )
    return found


def booking_view(row: ReservationRow) -> NodeBookingView:
    """D4: a booking on the node as the pool's owner sees it."""
    placed = row.placement
    return NodeBookingView(
        reservation_id=row.id,
        tenant_id=row.tenant_id,
        state=row.state,
        gpus=[g.uuid for g in placed.gpus] if placed else [],
        mig_instances=[m.uuid for m in placed.mig_instances] if placed else [],
        slots=[f"{s.gpu_index}/{s.slot}" for s in placed.slots] if placed else [],
        cpus=(placed.cpus or "") if placed else "",
        cpu_quota=placed.cpu_quota if placed else None,
        memory_bytes=placed.memory_bytes if placed else None,
        delivery=row.delivery_state or "pending",
    )


def cordon_of(node: NodeRow) -> CordonView | None:
    """H3: the node's cordon, if it is cordoned (its reason and time are written together)."""
    if node.cordon_reason is None or node.cordoned_at is None:
        return None
    return CordonView(reason=node.cordon_reason, at=node.cordoned_at)


def drain_of(node: NodeRow) -> DrainView | None:
    """H3: the node's drain, if it is draining or drained (written together, as asked)."""
    if node.drain_state is None or node.drain_reason is None or node.drain_started_at is None:
        return None
    return DrainView(
        reason=node.drain_reason,
        state=node.drain_state,
        started_at=node.drain_started_at,
        deadline=node.drain_deadline,
    )


def readable(node: NodeRow) -> tuple[Inventory | None, dict[str, Any] | None]:
    """The inventory and the last apply report as a view shows them: None where the stored
    value no longer decodes (a damaged row still answers; the reconciler quarantines the node
    with the reason, R5)."""
    try:
        inventory = node.inventory
    except msgspec.MsgspecError:
        inventory = None
    try:
        applied = node.applied
    except msgspec.MsgspecError:
        applied = None
    return inventory, applied


def schedulable(node: NodeRow) -> bool:
    """H2: the placer may book on it: ready, not cordoned, not being drained."""
    return node.state == READY and node.cordon_reason is None and node.drain_state is None


def list_nodes(db: Database, call: Call[NodesList]) -> NodeList:
    """A pool's nodes, or without poolId every node of every pool the tenant owns (H7), in id
    order, a page at a time; owner only: anyone else, offered or not, NOT_FOUND."""
    principal, liveness, req = call.principal, call.env.liveness, call.body
    if req.pool_id is UNSET:
        owned = {p.id for p in pool_sql.pools_owned_by(db, req.tenant_id)}
        pool_ids = sorted(readable_pools(db, principal, req.tenant_id, owned, "compute:nodes:read"))
    else:
        pool_ids = [call.pool.id]  # the owned pool the method's decision found
    found, cursor = page(
        db,
        scope("nodes", req),
        node_sql.nodes_of_pools(
            db,
            pool_ids,
            None if req.states is UNSET else req.states,
            position(db, scope("nodes", req), req.cursor),
            req.limit + 1,
        ),
        req.limit,
        lambda node: node.id,
    )
    return NodeList(items=views(db, found, liveness), next=cursor)


def live_node(call: Call[Any]) -> NodeRow:
    """The node the method's decision found on a pool the caller's tenant owns; a removed
    one is NOT_FOUND, as a node of anyone else's is."""
    node = call.node
    if node.removed_at is not None:
        raise NotFound("node not found", field="nodeId")
    return node


def get_node(db: Database, call: Call[NodesGet]) -> NodeView:
    liveness = call.env.liveness
    return views(db, [live_node(call)], liveness)[0]
