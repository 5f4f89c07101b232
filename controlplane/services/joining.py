"""Joining: join tokens (owner only, pool-scoped, expiring, limited uses) and nodes/join through
the pool's attestors."""

import time
from collections.abc import Callable, Mapping
from typing import Any

import msgspec

from controlplane.capacity.admission import (
    CONFIGURING,
    LOST,
    READY,
    admission,
    check_family,
    identity_of,
    same_host,
    stable_digest,
)
from controlplane.capacity.nodes import health_events, reconcile_one
from controlplane.capacity.resources import HostFacts
from controlplane.iam.decide import Principal
from controlplane.iam.tokens import JOIN_PREFIX, NODE_PREFIX, new_token, token_hash
from controlplane.services.access import owned_pool
from controlplane.storage import events
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage import sites as site_sql
from controlplane.storage.db import Store, now, timestamp
from controlplane.storage.sql import Database
from shared.errors import Conflict, InvalidInput, InvalidState, Unauthenticated
from shared.gpu import with_families
from shared.ids import new_id
from shared.inventory import Inventory
from shared.schemas import (
    JoinTokenCreated,
    JoinTokensCreate,
    NodeJoined,
    NodesJoin,
)

# P8: the attestors JoinService runs. Each checks a join request and answers the join
# token it presented; "join-token" checks a pool-scoped, expiring, limited-use token.
Attestor = Callable[[Database, NodesJoin], dict[str, Any]]


def attest_join_token(db: Database, req: NodesJoin) -> dict[str, Any]:
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

    def txn(db: Database) -> JoinTokenCreated:
        pool = owned_pool(db, principal, req.tenant_id, req.pool_id, "compute:nodes:join")
        if pool.archived_at is not None:
            raise InvalidState("the pool is archived")
        if pool.agent == "none":
            raise InvalidState("agents do not join a pool with agent: none")
        expires_at = timestamp(time.time() + req.ttl_seconds)
        node_sql.insert_join_token(
            db,
            {
                "id": new_id("jtok"),
                "pool_id": pool.id,
                "token_hash": token_hash(token),
                "expires_at": expires_at,
                "max_uses": req.max_uses,
                "created_at": now(),
            },
        )
        return JoinTokenCreated(
            token=token, pool_id=pool.id, expires_at=expires_at, max_uses=req.max_uses
        )

    return await store.write(txn)


def inventory_fields(inventory: Inventory) -> dict[str, Any]:
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

    def txn(db: Database) -> NodeJoined:
        join_token = attestor(db, req)
        pool = pool_sql.get_pool(db, join_token["pool_id"])
        assert pool is not None
        if pool.archived_at is not None:
            raise InvalidState("the pool is archived")
        allowed = pool.join_attestors
        if req.attestor not in allowed:
            raise InvalidInput(f"the pool accepts attestors {allowed}", field="attestor")
        existing = node_sql.node_by_identity(db, identity_of(inventory))
        if existing is not None:
            if existing["pool_id"] != pool.id:
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
        family = {"gpu_model": pool.gpu_model}
        check_family(family, inventory)
        at = now()
        state, reason = admission(family, pool.policy, inventory)
        if state == READY and (existing is None or existing["state"] != READY):
            # H1: ready once its agent reports the NodeSpec applied (reconcile_one decides).
            state, reason = CONFIGURING, "waiting for the agent to apply its NodeSpec"
        fields = {
            **inventory_fields(inventory),
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
            site = site_sql.get_site(db, pool.site_id)
            assert site is not None
            node_sql.insert_node(
                db,
                {
                    **fields,
                    "id": node_id,
                    "pool_id": pool.id,
                    "identity": identity_of(inventory),
                    "tenant_owned": int(site["kind"] == "custom"),
                    "inventory_rev": 1,
                    "created_at": at,
                },
            )
        else:
            node_id = existing["id"]
            if existing["state"] == LOST:
                res_sql.clear_node_lost(db, node_id)  # its bookings carry on
            if existing["inventory_hash"] != fields["inventory_hash"]:
                fields["inventory_rev"] = existing["inventory_rev"] + 1
            node_sql.update_node(db, node_id, fields)
        reconcile_one(db, node_id)
        joined = node_sql.get_node(db, node_id)
        assert joined is not None
        before = msgspec.json.decode(existing["inventory"], type=Inventory) if existing else None
        health_events(db, joined, pool.owner_tenant_id, before, inventory)
        events.append(
            db,
            "node.joined",
            pool_id=pool.id,
            data={
                "nodeId": node_id,
                "hostname": req.hostname,
                "state": state,
                "reason": reason,
                "rejoined": existing is not None,
            },
            audience=[pool.owner_tenant_id],
        )
        return NodeJoined(
            node_id=node_id, token=token, pool_id=pool.id, rejoined=existing is not None
        )

    return await store.write(txn)
