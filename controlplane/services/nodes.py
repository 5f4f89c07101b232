"""Nodes: join tokens, joining (N1, P8), reports with cheap liveness, the spec, listing.

A node authenticates with its own credential and sees only itself. A report
whose inventory is unchanged writes nothing: it stamps liveness in memory
and the reconciler persists the stamps in batches.
"""

from typing import Any

import msgspec
import sqlite_utils

from controlplane.capacity.liveness import Liveness
from controlplane.iam.decide import Principal
from controlplane.services.access import owned_pool
from controlplane.storage import nodes as node_sql
from shared.errors import NotFound
from shared.inventory import Inventory
from shared.schemas import (
    DeviceView,
    GpuSummary,
    NodeList,
    NodesGet,
    NodesList,
    NodeView,
    ResourceRowView,
)


def _views(
    db: sqlite_utils.Database, nodes: list[dict[str, Any]], liveness: Liveness
) -> list[NodeView]:
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
                    )
                    for g in gpus
                ],
                resources=resources[node["id"]],
                devices=devices[node["id"]],
                inventory=inventory,
                spec_version=node["spec_version"],
                applied=msgspec.json.decode(node["applied"]) if node["applied"] else None,
            )
        )
    return views


def list_nodes(
    db: sqlite_utils.Database, principal: Principal, liveness: Liveness, req: NodesList
) -> NodeList:
    """The pool's nodes with their rows; owner only: anyone else, offered or not, NOT_FOUND."""
    pool = owned_pool(db, principal, req.tenant_id, req.pool_id, "compute:nodes:read")
    return NodeList(items=_views(db, node_sql.nodes_of_pool(db, pool["id"]), liveness))


def get_node(
    db: sqlite_utils.Database, principal: Principal, liveness: Liveness, req: NodesGet
) -> NodeView:
    node = node_sql.get_node(db, req.node_id)
    if node is None:
        raise NotFound("node not found", field="nodeId")
    try:
        owned_pool(db, principal, req.tenant_id, node["pool_id"], "compute:nodes:read")
    except NotFound:
        raise NotFound("node not found", field="nodeId") from None
    return _views(db, [node], liveness)[0]
