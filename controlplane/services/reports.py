"""What a node's own credential does: nodes/report (an unchanged one writes nothing) and nodes/spec."""

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from controlplane.capacity.admission import LOST
from controlplane.capacity.handover import take_report
from controlplane.capacity.nodes import Failed, reconcile_isolated
from controlplane.capacity.states import back_from_lost, health_events, state_event
from controlplane.iam.tokens import token_hash
from controlplane.services.call import Call
from controlplane.services.joining import held_digest, inventory_fields
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import Store, now
from controlplane.storage.heads import NodeHeads
from controlplane.storage.node_types import NodeHead, NodeRow, ReconcileRow
from controlplane.storage.sql import Database
from shared.gpu import with_families
from shared.inventory import stable_digest
from shared.nodespec import NodeSpecUnits
from shared.schemas import (
    NodeSpec,
    NodesReport,
    NodesSpec,
    Reported,
)


def authenticate_node(db: Database, token: str) -> NodeRow | None:
    return node_sql.node_for_token(db, token_hash(token))


def authenticate_head(db: Database, token: str, heads: NodeHeads | None) -> NodeHead | None:
    """The head of a node credential's node: what a report decides on before any
    transaction (F9), its large columns unread; from ``heads`` when they keep it."""
    hashed = token_hash(token)
    return node_sql.head_for_token(db, hashed) if heads is None else heads.head(db, hashed)


def failed_units(applied: Mapping[str, Any] | None, spec_units: Sequence[str]) -> set[str]:
    """The units of the node's spec that a report's ``applied`` says failed."""
    units = (applied or {}).get("units")
    if not isinstance(units, list):
        return set()
    return {
        unit["id"]
        for unit in units
        if isinstance(unit, dict)
        and unit.get("status") == "failed"
        and unit.get("id") in spec_units
    }


def newly_failed(node: NodeRow, applied: dict[str, Any] | UnsetType) -> set[str]:
    """M1: the units this report says failed that the node's last one did not, so a unit is
    counted once each time it turns failed, not on every report repeating it; only units of
    the spec it was served (an agent cannot make up label values)."""
    if applied is UNSET:
        return set()
    spec = node.spec
    ids = [unit.id for unit in spec.units] if spec else []
    return failed_units(applied, ids) - failed_units(node.applied, ids)


def answer(node: NodeHead, spec_version: str | None, sent: str | UnsetType) -> Reported:
    """F9: a report's answer, with the digest of the inventory held for the node; the whole
    inventory is wanted when the report's digest (``sent``) is not it, or none is held."""
    held = held_digest(node.inventory_hash)
    wanted = held is None or (sent is not UNSET and sent != held)
    return Reported(spec_version=spec_version or "", inventory_digest=held, inventory_wanted=wanted)


async def report_node(store: Store, call: Call[NodesReport]) -> Reported:
    """A node's report: its inventory whole, or (F9) the digest of the one held for it.

    A digest report decodes no inventory. When its digest is the one held it is the whole
    inventory as far as this report goes; when not, the node is alive (a heartbeat) but
    nothing else of the report is taken, and the answer asks for the whole inventory.

    It is decided first on the node's head (what its credential resolved to, the large
    columns unread): a report that brings nothing new ends there, writing nothing; one that
    does is taken in a transaction, on the node's whole row read afresh there.
    """
    liveness, node, req = call.env.liveness, call.caller, call.body
    assert isinstance(node, NodeHead), "a node's method"
    sent = req.inventory_digest
    if sent is not UNSET and sent != held_digest(node.inventory_hash):
        liveness.seen(node.id)  # alive; its inventory, applied units and bookings wait
        return answer(node, node.spec_version, sent)
    inventory = None if isinstance(req.inventory, UnsetType) else with_families(req.inventory)
    digest = node.inventory_hash if inventory is None else stable_digest(inventory)
    # the inventory reported whole, and its digest
    whole = None if inventory is None or digest is None else (inventory, digest)
    applied = None if req.applied is UNSET else msgspec.json.encode(req.applied).decode()
    deliveries = None if req.bookings is UNSET else msgspec.json.encode(req.bookings).decode()
    unchanged = (
        digest == node.inventory_hash
        and (applied is None or applied == node.applied_json)
        and (deliveries is None or deliveries == node.deliveries_json)
    )
    if unchanged and node.state != LOST:
        liveness.seen(node.id)  # nothing new: no write (liveness is batched)
        return answer(node, node.spec_version, sent)

    def txn(db: Database) -> tuple[Reported, set[str]]:
        current = call.node  # read afresh by the credential's check in this transaction
        if sent is not UNSET and sent != held_digest(current.inventory_hash):
            liveness.seen(current.id)  # its inventory moved meanwhile: ask for it
            return answer(current, current.spec_version, sent), set()
        pool = node_sql.pool_of_node(db, current.pool_id)
        assert pool is not None
        failed = newly_failed(current, req.applied)
        at = now()
        fields: dict[str, Any] = {"last_seen_at": at, "updated_at": at}
        if applied is not None:
            fields.update(applied=applied)
        if deliveries is not None and deliveries != current.deliveries_json:
            fields.update(deliveries=deliveries)
        moved = whole is not None and whole[1] != current.inventory_hash
        if whole is not None and moved:
            # R4: the hostname is join's (validated there); a report never rewrites it.
            fields.update(inventory_fields(*whole))
            fields.update(inventory_rev=current.inventory_rev + 1)
            health_events(db, current, pool.owner_tenant_id, current.inventory, whole[0])
        if current.state == LOST:
            back, reason = back_from_lost(current)
            fields.update(state=back, state_reason=reason)
            state_event(db, current, pool.owner_tenant_id, back, reason)
            res_sql.clear_node_lost(db, current.id)  # its bookings carry on
        liveness.seen(current.id)
        written = fields  # the report's columns, written with the reconcile's in one statement
        if req.bookings is not UNSET:
            node_sql.update_node(db, current.id, fields)  # what take_report reads
            written = {}
            if take_report(db, current, pool.owner_tenant_id, req.bookings):
                # D5-D7: its bookings moved (the spec version with them)
                stored = node_sql.get_node(db, current.id)
                assert stored is not None
                current = stored
                fields = {}
        # One place decides a node's state: the same render and admission as every pass.
        reported = current.updated(fields, inventory if moved else None)
        done = reconcile_isolated(db, ReconcileRow(node=reported, pool=pool), written)
        version = reported.spec_version if isinstance(done, Failed) else done.spec_version
        return answer(reported, version, sent), failed

    # B5: a report writes its own node's rows only (beside other reports and joins), unless
    # it moves bookings, which hold tenants' quotas: then it runs alone.
    alone = req.bookings is not UNSET and bool(req.bookings)
    reported, failed = await store.write(txn, own_rows=None if alone else node.id)
    for unit in failed:  # counted once committed
        call.env.counters.unit_failed(node.pool_id, unit)
    return reported


def node_spec(db: Database, call: Call[NodesSpec]) -> NodeSpec:
    """The node's NodeSpec as the reconciler last rendered it for this host (N6)."""
    node = call.node
    pool = pool_sql.get_pool(db, node.pool_id)
    assert pool is not None
    units = node.spec or NodeSpecUnits(version="", units=[], reboot=False)
    return NodeSpec(
        node_id=node.id,
        pool_id=pool.id,
        version=node.spec_version or "",
        pool_version=pool.version,
        pool_class=pool.pool_class,
        sharing=pool.sharing,
        gpu_model=pool.gpu_model,
        policy=pool.policy,
        units=units.units,
        reboot=units.reboot,
        booked_gpus=units.booked_gpus,
        bookings=node.bookings,
    )
