"""Nodes: join tokens, joining (N1, P8), reports with cheap liveness, the spec, listing.

A node authenticates with its own credential and sees only itself. A report
whose inventory is unchanged writes nothing: it stamps liveness in memory
and the reconciler persists the stamps in batches.
"""

import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import sqlite_utils
from msgspec import UNSET

from controlplane.capacity.liveness import Liveness
from controlplane.capacity.reconciler import reconcile_one, state_event
from controlplane.capacity.resources import HostFacts
from controlplane.iam.decide import Principal
from controlplane.iam.tokens import JOIN_PREFIX, NODE_PREFIX, new_token, token_hash
from controlplane.services.access import owned_pool
from controlplane.services.admission import (
    LOST,
    READY,
    admission,
    check_family,
    identity_of,
    same_host,
    stable_digest,
)
from controlplane.storage import events
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage import sites as site_sql
from controlplane.storage.db import Store, now, timestamp
from shared.errors import Conflict, InvalidInput, InvalidState, NotFound, Unauthenticated
from shared.gpu import with_families
from shared.ids import new_id
from shared.inventory import Inventory
from shared.nodespec import NodeSpecUnits
from shared.schemas import (
    DeviceView,
    GpuSummary,
    JoinTokenCreated,
    JoinTokensCreate,
    NodeJoined,
    NodeList,
    NodesGet,
    NodesJoin,
    NodesList,
    NodeSpec,
    NodesReport,
    NodesSpec,
    NodeView,
    Reported,
    ResourceRowView,
)

# P8: the attestors JoinService runs. Each checks a join request and answers the join
# token it presented; "join-token" checks a pool-scoped, expiring, limited-use token.
Attestor = Callable[[sqlite_utils.Database, NodesJoin], dict[str, Any]]


def attest_join_token(db: sqlite_utils.Database, req: NodesJoin) -> dict[str, Any]:
    """The token's row if it exists, has not expired and has a use left (R8); the join
    spends the use."""
    token = node_sql.join_token(db, token_hash(req.join_token))
    if token is None or token["expires_at"] <= now():
        raise Unauthenticated("the join token is unknown or expired")
    if token["uses"] >= token["max_uses"]:
        raise Unauthenticated("the join token is used up")
    return token


ATTESTORS: Mapping[str, Attestor] = {"join-token": attest_join_token}


async def create_join_token(
    store: Store, principal: Principal, req: JoinTokensCreate
) -> JoinTokenCreated:
    """Owner only; pool-scoped, expiring, with a use limit; shown once and stored hashed."""
    token = new_token(JOIN_PREFIX)

    def txn(db: sqlite_utils.Database) -> JoinTokenCreated:
        pool = owned_pool(db, principal, req.tenant_id, req.pool_id, "compute:nodes:join")
        if pool["archived_at"] is not None:
            raise InvalidState("the pool is archived")
        if pool["agent"] == "none":
            raise InvalidState("agents do not join a pool with agent: none")
        expires_at = timestamp(time.time() + req.ttl_seconds)
        node_sql.insert_join_token(
            db,
            {
                "id": new_id("jtok"),
                "pool_id": pool["id"],
                "token_hash": token_hash(token),
                "expires_at": expires_at,
                "max_uses": req.max_uses,
                "created_at": now(),
            },
        )
        return JoinTokenCreated(
            token=token, pool_id=pool["id"], expires_at=expires_at, max_uses=req.max_uses
        )

    return await store.write(txn)


def _inventory_fields(inventory: Inventory) -> dict[str, Any]:
    facts = HostFacts.of(inventory)
    return {
        "inventory": msgspec.json.encode(inventory).decode(),
        "inventory_hash": stable_digest(inventory),
        "machine_id": inventory.machine_id,
        **{name: getattr(facts, name) for name in node_sql.FACTS},
    }


async def join_node(store: Store, req: NodesJoin) -> NodeJoined:
    attestor = ATTESTORS.get(req.attestor)
    if attestor is None:
        raise InvalidInput(f"attestor {req.attestor} is not registered", field="attestor")
    # A bad token is refused on the reader, without taking the single writer's time.
    with store.snapshot() as db:
        attestor(db, req)
    inventory = with_families(req.inventory)
    token = new_token(NODE_PREFIX)

    def txn(db: sqlite_utils.Database) -> NodeJoined:
        join_token = attestor(db, req)
        pool = pool_sql.get_pool(db, join_token["pool_id"])
        assert pool is not None
        if pool["archived_at"] is not None:
            raise InvalidState("the pool is archived")
        policy = msgspec.json.decode(pool["policy"])
        allowed = policy.get("joinAttestors") or ["join-token"]
        if req.attestor not in allowed:
            raise InvalidInput(f"the pool accepts attestors {allowed}", field="attestor")
        existing = node_sql.node_by_identity(db, identity_of(inventory))
        if existing is not None:
            if existing["pool_id"] != pool["id"]:
                raise Conflict(
                    "this host is already a node of another pool", field="inventory.machineId"
                )
            stored = msgspec.json.decode(existing["inventory"], type=Inventory)
            if not same_host(stored, inventory):
                raise Conflict(
                    "another host already joined with this machine id (a cloned disk image? "
                    "give each host its own /etc/machine-id)",
                    field="inventory.machineId",
                )
        check_family(pool, inventory)
        at = now()
        state, reason = admission(pool, policy, inventory)
        fields = {
            **_inventory_fields(inventory),
            "hostname": req.hostname,
            "token_hash": token_hash(token),
            "state": state,
            "state_reason": reason,
            "last_seen_at": at,
            "updated_at": at,
        }
        # R8: a re-join mints a new node credential, so it spends a use like a first join:
        # a used-up token plus a host's public identifiers cannot take over its node.
        node_sql.use_join_token(db, join_token["id"])
        if existing is None:
            node_id = new_id("node")
            site = site_sql.get_site(db, pool["site_id"])
            assert site is not None
            node_sql.insert_node(
                db,
                {
                    **fields,
                    "id": node_id,
                    "pool_id": pool["id"],
                    "identity": identity_of(inventory),
                    "tenant_owned": int(site["kind"] == "custom"),
                    "inventory_rev": 1,
                    "created_at": at,
                },
            )
        else:
            node_id = existing["id"]
            if existing["inventory_hash"] != fields["inventory_hash"]:
                fields["inventory_rev"] = existing["inventory_rev"] + 1
            node_sql.update_node(db, node_id, fields)
        reconcile_one(db, node_id)
        events.append(
            db,
            "node.joined",
            pool_id=pool["id"],
            data={
                "nodeId": node_id,
                "hostname": req.hostname,
                "state": state,
                "reason": reason,
                "rejoined": existing is not None,
            },
            audience=[pool["owner_tenant_id"]],
        )
        return NodeJoined(
            node_id=node_id, token=token, pool_id=pool["id"], rejoined=existing is not None
        )

    return await store.write(txn)


def authenticate_node(db: sqlite_utils.Database, token: str) -> dict[str, Any] | None:
    return node_sql.node_for_token(db, token_hash(token))


async def report_node(
    store: Store, liveness: Liveness, node: dict[str, Any], req: NodesReport
) -> Reported:
    inventory = with_families(req.inventory)
    digest = stable_digest(inventory)
    applied = None if req.applied is UNSET else msgspec.json.encode(req.applied).decode()
    unchanged = digest == node["inventory_hash"] and (applied is None or applied == node["applied"])
    if unchanged and node["state"] != LOST:
        liveness.seen(node["id"])  # nothing new: no write (liveness is batched)
        return Reported(spec_version=node["spec_version"] or "")

    def txn(db: sqlite_utils.Database) -> Reported:
        current = node_sql.get_node(db, node["id"])
        pool = pool_sql.get_pool(db, node["pool_id"])
        assert current is not None and pool is not None
        at = now()
        fields: dict[str, Any] = {"last_seen_at": at, "updated_at": at}
        if applied is not None:
            fields["applied"] = applied
        if digest != current["inventory_hash"]:
            # R4: the hostname is join's (validated there); a report never rewrites it.
            fields.update(_inventory_fields(inventory))
            fields["inventory_rev"] = current["inventory_rev"] + 1
        if current["state"] == LOST:
            # Back: ready for now; the reconcile below re-decides (acceptance, family, render).
            fields.update(state=READY, state_reason=None)
            state_event(db, current, pool["owner_tenant_id"], READY, None)
            res_sql.clear_node_lost(db, current["id"])  # its bookings carry on
        node_sql.update_node(db, current["id"], fields)
        liveness.seen(current["id"])
        # One place decides a node's state: the same render and admission as every pass.
        reconcile_one(db, current["id"])
        after = node_sql.get_node(db, current["id"])
        assert after is not None
        return Reported(spec_version=after["spec_version"] or "")

    return await store.write(txn)


def node_spec(db: sqlite_utils.Database, node: dict[str, Any], req: NodesSpec) -> NodeSpec:
    """The node's NodeSpec as the reconciler last rendered it for this host (N6)."""
    pool = pool_sql.get_pool(db, node["pool_id"])
    stored = node_sql.get_node(db, node["id"])
    assert pool is not None and stored is not None
    units = (
        msgspec.json.decode(stored["spec"], type=NodeSpecUnits)
        if stored["spec"]
        else NodeSpecUnits(version="", units=[], reboot=False)
    )
    return NodeSpec(
        node_id=node["id"],
        pool_id=pool["id"],
        version=stored["spec_version"] or "",
        pool_version=pool["version"],
        pool_class=pool["class"],
        sharing=pool["sharing"],
        gpu_model=pool["gpu_model"],
        policy=msgspec.json.decode(pool["policy"]),
        units=units.units,
        reboot=units.reboot,
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
