"""What a node's own credential does: nodes/report (an unchanged one writes nothing) and nodes/spec."""

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from controlplane.capacity.admission import LOST, stable_digest
from controlplane.capacity.handover import take_report
from controlplane.capacity.nodes import Failed, reconcile_isolated
from controlplane.capacity.states import back_from_lost, health_events, state_event
from controlplane.iam.tokens import token_hash
from controlplane.services.call import Call
from controlplane.services.joining import inventory_fields
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import Store, now
from controlplane.storage.node_types import NodeRow, ReconcileRow
from controlplane.storage.sql import Database
from shared.gpu import with_families
from shared.nodespec import NodeSpecUnits
from shared.schemas import (
    NodeSpec,
    NodesReport,
    NodesSpec,
    Reported,
)


def authenticate_node(db: Database, token: str) -> NodeRow | None:
    return node_sql.node_for_token(db, token_hash(token))


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


async def report_node(store: Store, call: Call[NodesReport]) -> Reported:
    liveness, node, req = call.env.liveness, call.node, call.body
    inventory = with_families(req.inventory)
    digest = stable_digest(inventory)
    applied = None if req.applied is UNSET else msgspec.json.encode(req.applied).decode()
    deliveries = None if req.bookings is UNSET else msgspec.json.encode(req.bookings).decode()
    unchanged = (
        digest == node.inventory_hash
        and (applied is None or applied == node.applied_json)
        and (deliveries is None or deliveries == node.deliveries_json)
    )
    if unchanged and node.state != LOST:
        liveness.seen(node.id)  # nothing new: no write (liveness is batched)
        return Reported(spec_version=node.spec_version or "")

    def txn(db: Database) -> tuple[Reported, set[str]]:
        current = call.node  # read afresh by the credential's check in this transaction
        pool = node_sql.pool_of_node(db, current.pool_id)
        assert pool is not None
        failed = newly_failed(current, req.applied)
        at = now()
        fields: dict[str, Any] = {"last_seen_at": at, "updated_at": at}
        if applied is not None:
            fields.update(applied=applied)
        if deliveries is not None and deliveries != current.deliveries_json:
            fields.update(deliveries=deliveries)
        moved = digest != current.inventory_hash
        if moved:
            # R4: the hostname is join's (validated there); a report never rewrites it.
            fields.update(inventory_fields(inventory, digest))
            fields.update(inventory_rev=current.inventory_rev + 1)
            health_events(db, current, pool.owner_tenant_id, current.inventory, inventory)
        if current.state == LOST:
            back, reason = back_from_lost(current)
            fields.update(state=back, state_reason=reason)
            state_event(db, current, pool.owner_tenant_id, back, reason)
            res_sql.clear_node_lost(db, current.id)  # its bookings carry on
        node_sql.update_node(db, current.id, fields)
        liveness.seen(current.id)
        if req.bookings is not UNSET and take_report(
            db, current, pool.owner_tenant_id, req.bookings
        ):  # D5-D7: its bookings moved (the spec version with them)
            stored = node_sql.get_node(db, current.id)
            assert stored is not None
            current = stored
            fields = {}
        # One place decides a node's state: the same render and admission as every pass.
        reported = current.updated(fields, inventory if moved else None)
        done = reconcile_isolated(db, ReconcileRow(node=reported, pool=pool))
        version = reported.spec_version if isinstance(done, Failed) else done.spec_version
        return Reported(spec_version=version or ""), failed

    reported, failed = await store.write(txn)
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
