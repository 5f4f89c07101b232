"""Nodes as their pool's owner sees them: one node, a pool's nodes, or the fleet (H7).

Each node shows its state and why (H1), whether the placer may book on it
(H2), its cordon and drain (H3), and each GPU's health (H5).
"""

from typing import Any

import msgspec
from msgspec import UNSET

from controlplane.capacity.admission import READY
from controlplane.capacity.liveness import Liveness
from controlplane.iam.decide import Principal
from controlplane.services.access import owned_pool, readable_pools
from controlplane.services.paging import page, position, scope
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage.sql import Database
from shared.errors import NotFound
from shared.inventory import Inventory
from shared.schemas import (
    CordonView,
    DeviceView,
    DrainView,
    GpuSummary,
    NodeList,
    NodesGet,
    NodesList,
    NodeView,
    ResourceRowView,
)


def _views(db: Database, nodes: list[dict[str, Any]], liveness: Liveness) -> list[NodeView]:
    ids = [n["id"] for n in nodes]
    resources: dict[str, list[ResourceRowView]] = {i: [] for i in ids}
    devices: dict[str, list[DeviceView]] = {i: [] for i in ids}
    if ids:
        for row in node_sql.resource_rows_of(db, ids):
            resources[row["node_id"]].append(
                ResourceRowView(
                    resource=row["resource"],
                    capacity=row["capacity"],
                    allocated=row["allocated"],
                    ratio=row["ratio"],
                )
            )
        for row in node_sql.devices_of(db, ids):
            devices[row["node_id"]].append(
                DeviceView(
                    device_id=row["device_id"],
                    resource=row["resource"],
                    gpu_uuid=row["gpu_uuid"],
                    profile=row["profile"],
                    allocated=bool(row["allocated"]),
                    unhealthy=bool(row["unhealthy"]),
                    held=bool(row["held"]),
                )
            )
    views = []
    for node in nodes:
        inventory = (
            msgspec.json.decode(node["inventory"], type=Inventory) if node["inventory"] else None
        )
        gpus = inventory.gpus if inventory else []
        views.append(
            NodeView(
                id=node["id"],
                pool_id=node["pool_id"],
                hostname=node["hostname"],
                state=node["state"],
                state_reason=node["state_reason"],
                tenant_owned=bool(node["tenant_owned"]),
                joined_at=node["created_at"],
                last_seen_at=liveness.last_seen(node["id"]) or node["last_seen_at"],
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
                resources=resources[node["id"]],
                devices=devices[node["id"]],
                inventory=inventory,
                spec_version=node["spec_version"],
                applied_version=node["applied_version"],
                pending_reboot=bool(node["pending_reboot"]),
                schedulable=schedulable(node),
                cordon=(
                    CordonView(reason=node["cordon_reason"], at=node["cordoned_at"])
                    if node["cordon_reason"] is not None
                    else None
                ),
                drain=(
                    DrainView(
                        reason=node["drain_reason"],
                        state=node["drain_state"],
                        started_at=node["drain_started_at"],
                        deadline=node["drain_deadline"],
                    )
                    if node["drain_state"] is not None
                    else None
                ),
                applied=msgspec.json.decode(node["applied"]) if node["applied"] else None,
            )
        )
    return views


def schedulable(node: dict[str, Any]) -> bool:
    """H2: the placer may book on it: ready, not cordoned, not being drained."""
    return node["state"] == READY and node["cordon_reason"] is None and node["drain_state"] is None


def list_nodes(db: Database, principal: Principal, liveness: Liveness, req: NodesList) -> NodeList:
    """A pool's nodes, or without poolId every node of every pool the tenant owns (H7), in id
    order, a page at a time; owner only: anyone else, offered or not, NOT_FOUND."""
    if req.pool_id is UNSET:
        owned = {p.id for p in pool_sql.pools_owned_by(db, req.tenant_id)}
        pool_ids = sorted(readable_pools(db, principal, req.tenant_id, owned, "compute:nodes:read"))
    else:
        pool_ids = [owned_pool(db, principal, req.tenant_id, req.pool_id, "compute:nodes:read").id]
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
        lambda node: node["id"],
    )
    return NodeList(items=_views(db, found, liveness), next=cursor)


def owned_node(
    db: Database, principal: Principal, tenant_id: str, node_id: str, action: str
) -> dict[str, Any]:
    """A live node of a pool ``tenant_id`` owns, for ``action``; NOT_FOUND for anyone else."""
    node = node_sql.get_node(db, node_id)
    if node is None or node["removed_at"] is not None:
        raise NotFound("node not found", field="nodeId")
    try:
        owned_pool(db, principal, tenant_id, node["pool_id"], action)
    except NotFound:
        raise NotFound("node not found", field="nodeId") from None
    return node


def get_node(db: Database, principal: Principal, liveness: Liveness, req: NodesGet) -> NodeView:
    node = owned_node(db, principal, req.tenant_id, req.node_id, "compute:nodes:read")
    return _views(db, [node], liveness)[0]
