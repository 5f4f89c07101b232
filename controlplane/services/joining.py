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
)
from controlplane.capacity.nodes import reconcile_isolated
from controlplane.capacity.resources import HostFacts
from controlplane.capacity.states import WAITING, health_events
from controlplane.capacity.topology import topology_text
from controlplane.iam.tokens import JOIN_PREFIX, NODE_PREFIX, new_token, token_hash
from controlplane.services.call import Call
from controlplane.storage import events
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage import sites as site_sql
from controlplane.storage.db import RunAlone, Store, now, timestamp
from controlplane.storage.node_types import JoinTokenRow
from controlplane.storage.sql import Database
from shared.errors import Conflict, InvalidInput, InvalidState, Unauthenticated
from shared.gpu import with_families
from shared.ids import new_id
from shared.inventory import Inventory, stable_digest
from shared.schemas import (
    JoinTokenCreated,
    JoinTokensCreate,
    NodeJoined,
    NodesJoin,
)

# P8: the attestors JoinService runs. Each checks a join request and answers the join
# token it presented; "join-token" checks a pool-scoped, expiring, limited-use token.
Attestor = Callable[[Database, NodesJoin], JoinTokenRow]


def attest_join_token(db: Database, req: NodesJoin) -> JoinTokenRow:
    """The token's row if it exists, has not expired and has a use left (R8); the join
    spends the use."""
    token = node_sql.join_token(db, token_hash(req.join_token))
    if token is None or token.expires_at <= now():
        raise Unauthenticated("the join token is unknown or expired")
    if token.uses >= token.max_uses:
        raise Unauthenticated("the join token is used up")
    return token


ATTESTORS: Mapping[str, Attestor] = {"join-token": attest_join_token}


async def create_join_token(store: Store, call: Call[JoinTokensCreate]) -> JoinTokenCreated:
    """Owner only; pool-scoped, expiring, with a use limit; shown once and stored hashed."""
    req = call.body
    token = new_token(JOIN_PREFIX)

    def txn(db: Database) -> JoinTokenCreated:
        pool = call.pool  # owned, decided in this transaction
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


def held_digest(inventory_hash: str | None) -> str | None:
    """F9: the digest of the inventory held for a node, as answers give it: its stored
    ``stable_digest`` column (never recomputed), or None when none is held."""
    return None if inventory_hash is None else f"sha256:{inventory_hash}"


def inventory_fields(inventory: Inventory, digest: str) -> dict[str, Any]:
    """A node's columns that hold its inventory (``digest``: its ``stable_digest``)."""
    facts = HostFacts.of(inventory)
    return {
        "inventory": msgspec.json.encode(inventory).decode(),
        "inventory_hash": digest,
        "machine_id": inventory.machine_id,
        "topology": topology_text(inventory),
        **{name: getattr(facts, name) for name in node_sql.FACTS},
    }


async def join_node(store: Store, call: Call[NodesJoin]) -> NodeJoined:
    req = call.body
    attestor = ATTESTORS.get(req.attestor)
    if attestor is None:
        raise InvalidInput(f"attestor {req.attestor} is not registered", field="attestor")
    # A bad token is refused on a reader, without taking the single writer's time (nor the
    # event loop's: F1).
    await store.read_latest(lambda db: attestor(db, req))
    inventory = with_families(req.inventory)
    digest = stable_digest(inventory)
    token = new_token(NODE_PREFIX)

    def txn(db: Database) -> NodeJoined:
        join_token = attestor(db, req)
        pool = pool_sql.get_pool(db, join_token.pool_id)
        assert pool is not None
        if pool.archived_at is not None:
            raise InvalidState("the pool is archived")
        allowed = pool.join_attestors
        if req.attestor not in allowed:
            raise InvalidInput(f"the pool accepts attestors {allowed}", field="attestor")
        existing = node_sql.node_by_identity(db, identity_of(inventory))
        if existing is not None:
            if existing.pool_id != pool.id:
                raise Conflict(
                    "this host is already a node of another pool", field="inventory.machineId"
                )
            stored = existing.inventory
            if stored is not None and not same_host(stored, inventory):
                raise Conflict(
                    "another host already joined with this machine id (a cloned disk image? "
                    "give each host its own /etc/machine-id)",
                    field="inventory.machineId",
                )
        check_family(pool.gpu_model, inventory)
        at = now()
        state, reason = admission(pool.gpu_model, pool.policy, inventory)
        if state == READY and (existing is None or existing.state != READY):
            # H1: ready once its agent reports the NodeSpec applied (its reconcile decides).
            state, reason = CONFIGURING, WAITING
        fields = {
            **inventory_fields(inventory, digest),
            "hostname": req.hostname,
            "token_hash": token_hash(token),
            "state": state,
            "state_reason": reason,
            "last_seen_at": at,
            "updated_at": at,
        }
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
                    "tenant_owned": int(site.kind == "custom"),
                    "inventory_rev": 1,
                    "rows_pool_version": node_sql.UNWRITTEN,  # nothing to read nor refresh
                    "created_at": at,
                },
            )
        else:
            if db.own_rows is not None:  # B5: a re-join writes more than a new node's rows
                raise RunAlone
            node_id = existing.id
            if existing.state == LOST:
                res_sql.clear_node_lost(db, node_id)  # its bookings carry on
            if existing.inventory_hash != digest:
                fields.update(inventory_rev=existing.inventory_rev + 1)
            node_sql.update_node(db, node_id, fields)
        row = node_sql.reconcile_row_of(db, node_id)
        assert row is not None
        reconcile_isolated(db, row)
        before = existing.inventory if existing else None
        health_events(db, row.node, pool.owner_tenant_id, before, inventory)
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
        # R8: a re-join mints a new node credential, so it spends a use like a first join:
        # a used-up token plus a host's public identifiers cannot take over its node. Last,
        # so that joins side by side wait on the token's row only for each other's commit.
        if not node_sql.use_join_token(db, join_token.id):
            raise Unauthenticated("the join token is used up")
        return NodeJoined(
            node_id=node_id,
            token=token,
            pool_id=pool.id,
            rejoined=existing is not None,
            inventory_digest=f"sha256:{digest}",
        )

    # B5: a first join writes its new node's rows only: beside other joins and reports; and
    # its token's row, which every join with the token writes.
    return await store.write(txn, own_rows=identity_of(inventory), shares_rows=True)
