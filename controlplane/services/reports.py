"""What a node's own credential does: nodes/report (an unchanged one writes nothing) and nodes/spec."""

from collections.abc import Mapping, Sequence
from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from controlplane.capacity.admission import (
    CONFIGURING,
    LOST,
    READY,
    stable_digest,
)
from controlplane.capacity.liveness import Liveness
from controlplane.capacity.nodes import health_events, reconcile_one, state_event
from controlplane.iam.tokens import token_hash
from controlplane.metrics import UNIT_FAILURES
from controlplane.services.joining import inventory_fields
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import Store, now
from controlplane.storage.sql import Database
from shared.gpu import with_families
from shared.inventory import Inventory
from shared.nodespec import NodeSpecUnits
from shared.schemas import (
    NodeSpec,
    NodesReport,
    NodesSpec,
    Reported,
)


def authenticate_node(db: Database, token: str) -> dict[str, Any] | None:
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


def newly_failed(
    db: Database, node: dict[str, Any], applied: dict[str, Any] | UnsetType
) -> set[str]:
    """M1: the units this report says failed that the node's last one did not, so a unit is
    counted once each time it turns failed, not on every report repeating it; only units of
    the spec it was served (an agent cannot make up label values)."""
    if applied is UNSET:
        return set()
    spec = node_sql.spec_of(db, node["id"])
    ids = [unit.id for unit in spec.units] if spec else []
    before = msgspec.json.decode(node["applied"]) if node["applied"] else None
    return failed_units(applied, ids) - failed_units(before, ids)


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

    def txn(db: Database) -> tuple[Reported, set[str]]:
        current = node_sql.get_node(db, node["id"])
        pool = pool_sql.get_pool(db, node["pool_id"])
        assert current is not None and pool is not None
        failed = newly_failed(db, current, req.applied)
        at = now()
        fields: dict[str, Any] = {"last_seen_at": at, "updated_at": at}
        if applied is not None:
            fields["applied"] = applied
        if digest != current["inventory_hash"]:
            # R4: the hostname is join's (validated there); a report never rewrites it.
            fields.update(inventory_fields(inventory))
            fields["inventory_rev"] = current["inventory_rev"] + 1
            before = (
                msgspec.json.decode(current["inventory"], type=Inventory)
                if current["inventory"]
                else None
            )
            health_events(db, current, pool.owner_tenant_id, before, inventory)
        if current["state"] == LOST:
            # Back: ready if it ever applied a spec cleanly (H1), else still configuring; the
            # reconcile below re-decides (acceptance, family, render, what it applied).
            back = READY if current["applied_version"] is not None else CONFIGURING
            reason = None if back == READY else "waiting for the agent to apply its NodeSpec"
            fields.update(state=back, state_reason=reason)
            state_event(db, current, pool.owner_tenant_id, back, reason)
            res_sql.clear_node_lost(db, current["id"])  # its bookings carry on
        node_sql.update_node(db, current["id"], fields)
        liveness.seen(current["id"])
        # One place decides a node's state: the same render and admission as every pass.
        reconcile_one(db, current["id"])
        after = node_sql.get_node(db, current["id"])
        assert after is not None
        return Reported(spec_version=after["spec_version"] or ""), failed

    reported, failed = await store.write(txn)
    for unit in failed:  # counted once committed
        UNIT_FAILURES.labels(node["pool_id"], unit).inc()
    return reported


def node_spec(db: Database, node: dict[str, Any], req: NodesSpec) -> NodeSpec:
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
        pool_id=pool.id,
        version=stored["spec_version"] or "",
        pool_version=pool.version,
        pool_class=pool.pool_class,
        sharing=pool.sharing,
        gpu_model=pool.gpu_model,
        policy=pool.policy,
        units=units.units,
        reboot=units.reboot,
        booked_gpus=units.booked_gpus,
    )
