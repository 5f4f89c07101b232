"""One node's reconcile: its NodeSpec (capacity/spec.py), state (capacity/states.py) and
node_resources rows and GPU atoms (capacity/rows.py) follow its inventory and its pool's
policy.

Rows derive only from (inventory, pool policy), so each node remembers the
inventory revision and pool version its rows were computed from; the reconciler
recomputes just the nodes where either moved and rewrites only rows whose
values changed (N5). A node whose rows are held at what is allocated, or whose
booked atom vanished, is left stale so every pass looks again until the
booking ends. A pool's new version also re-decides each node's admission (a
new gpuModel or acceptance check). Each node is reconciled in its own savepoint
(R5), in the caller's transaction: a pass, a join or a report; the node's own columns
that move are written in one statement.
"""

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from controlplane.capacity import delivery
from controlplane.capacity.rows import UNCHANGED, write_atoms, write_resources
from controlplane.capacity.spec import respecify
from controlplane.capacity.states import quarantine_unreconcilable, readmit
from controlplane.storage import nodes as node_sql
from controlplane.storage.db import savepoint
from controlplane.storage.node_types import ReconcileRow
from controlplane.storage.nodes import STALE, UNWRITTEN
from controlplane.storage.sql import Database
from shared.policy import parse_policy

log = structlog.get_logger("controlplane.capacity")
T = TypeVar("T")


@dataclass(frozen=True)
class Failed:
    """A part of a pass that raised; what it wrote was undone."""

    error: str


def isolated(db: Database, what: str, what_id: str, fn: Callable[..., T], *args: Any) -> T | Failed:
    """Run one node's or reservation's part of a pass in a savepoint: a failure undoes only
    that part, is logged, and the pass goes on for every other one (R5)."""
    try:
        with savepoint(db):
            return fn(*args)
    except Exception as exc:
        if not db.in_transaction:
            raise  # SQLite rolled the whole transaction back (disk full, I/O): stop the pass
        log.exception(f"{what} could not be reconciled", id=what_id)
        return Failed(str(exc) or repr(exc))


@dataclass(frozen=True)
class Reconciled:
    """What one node's reconcile did."""

    writes: int  # rows and atoms written
    spec_version: str | None  # the spec version the node is to apply


def reconcile_node(db: Database, row: ReconcileRow, written: Mapping[str, Any]) -> Reconciled:
    """Bring one node's spec, state, rows and atoms to what its inventory and pool imply;
    ``written``: the caller's own columns of the node (``row.node`` has them already), written
    in the same statement as the reconcile's."""
    node, pool = row.node, row.pool
    if node.rows_pool_version == STALE:  # its bookings moved, or an upgrade left them unwritten
        node = node.updated(delivery.refresh_bookings(db, node.id, node))
    policy = parse_policy(pool.policy)
    inventory = node.inventory
    fields: dict[str, Any] = dict(written)
    new = node.rows_pool_version == UNWRITTEN  # a node that joined: nothing of its rows to read
    atoms = {} if new else node_sql.devices(db, node.id)
    booked = frozenset(atom.gpu_uuid for atom in atoms.values() if atom.allocated)
    version, held, gated = node.spec_version, False, frozenset[str]()
    if inventory is not None:
        spec = respecify(node, pool, policy, inventory, booked)
        version, held, gated = spec.version, spec.held_layout, spec.gated_gpus
        fields.update(spec.fields)
        fields.update(readmit(db, node, pool, inventory, spec.refusal, spec.version))
    rows_of = (node.inventory_rev, pool.version)
    current = (node.rows_inventory_rev, node.rows_pool_version) == rows_of
    # N5: rows derive from the inventory and the policy alone, and were written (none held)
    # at this revision and version: nothing of them can have moved.
    if current:
        resources = UNCHANGED
    else:
        have = {} if new else node_sql.resource_rows(db, node.id)
        resources = write_resources(db, node, pool, policy, have)
    devices = write_atoms(db, node, pool, policy, inventory, atoms, gated)
    if devices.free != node.free_atoms:  # the bin-packing order (capacity/placer.py)
        fields.update(free_atoms=devices.free)
    held = held or resources.held or devices.held
    if not held and not current:
        fields.update(rows_inventory_rev=node.inventory_rev, rows_pool_version=pool.version)
    if fields:
        node_sql.update_node(db, node.id, fields)
    return Reconciled(resources.writes + devices.writes, version)


def reconcile_isolated(
    db: Database, row: ReconcileRow, written: Mapping[str, Any] | None = None
) -> Reconciled | Failed:
    """One node's reconcile in a savepoint (R5); a node that cannot be reconciled is
    quarantined with the reason instead, and the caller's other writes stay, ``written`` (its
    own columns of the node, written with the reconcile's) among them."""
    node = row.node
    done = isolated(db, "node", node.id, reconcile_node, db, row, written or {})
    if isinstance(done, Failed):
        if written:
            node_sql.update_node(db, node.id, dict(written))
        isolated(db, "node", node.id, quarantine_unreconcilable, db, node, row.pool, done.error)
    return done
