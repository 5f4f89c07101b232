"""Typed rows of the node tables: a node (and its head: the small columns a report decides
on first), a node with its pool as the reconciler reads it, a
node_resources row, a GPU atom (node_devices), a join token and a silent node.

Each row is read by position from the columns its statement names (no dict per row). A JSON
column is kept as its stored text and decoded on first read, then cached: a node whose
inventory, spec or report no longer decodes still loads, and fails only the step that reads
that column (R5: the reconciler quarantines it, a node view of it fails alone).
"""

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, NamedTuple

import msgspec
from msgspec import Struct

from controlplane.storage.types import policy_of, stored_policy
from shared.inventory import Inventory
from shared.nodespec import Booking, NodeSpecUnits

# The columns of ``nodes`` a NodeRow holds, in its fields' order (the credential's hash stays
# in storage); a JSON column's field is named ``<column>_json``.
NODE_COLUMNS = (
    "id",
    "pool_id",
    "hostname",
    "tenant_owned",
    "state",
    "state_reason",
    "created_at",
    "updated_at",
    "last_seen_at",
    "identity",
    "machine_id",
    "inventory",
    "inventory_hash",
    "inventory_rev",
    "rows_inventory_rev",
    "rows_pool_version",
    "logical_cpus",
    "memory_total_bytes",
    "hugepages_2mi",
    "hugepages_1gi",
    "disk_total_bytes",
    "applied",
    "applied_version",
    "applied_units",
    "pending_reboot",
    "spec",
    "spec_version",
    "cordon_reason",
    "cordoned_at",
    "drain_reason",
    "drain_state",
    "drain_started_at",
    "drain_deadline",
    "removed_at",
    "topology",
    "bookings",
    "deliveries",
    "free_atoms",
)
JSON_COLUMNS = frozenset(
    {"inventory", "applied", "applied_units", "spec", "topology", "bookings", "deliveries"}
)
FLAG_COLUMNS = frozenset({"tenant_owned", "pending_reboot"})  # 0/1 integers, read as bools
NODE_FIELDS = tuple(f"{c}_json" if c in JSON_COLUMNS else c for c in NODE_COLUMNS)
_FIELD_OF = dict(zip(NODE_COLUMNS, NODE_FIELDS, strict=True))


class NodeHead(Struct, frozen=True):
    """What a node credential resolves to before any transaction: the node's small columns a
    report's first step decides on (F9: whether it brings news). The row's large columns
    (inventory, spec, topology, bookings) are not read: a NodeRow, read whole in the
    transaction of a report that has news, is the rest."""

    id: str
    pool_id: str
    state: str
    inventory_hash: str | None
    spec_version: str | None
    applied_json: str | None  # the agent's last report of what it applied, as stored
    deliveries_json: str | None  # D5-D7: the agent's last report of its bookings


_COLUMN_OF = {field: column for column, field in _FIELD_OF.items()}
# The columns of ``nodes`` a NodeHead holds, in its fields' order.
HEAD_COLUMNS = tuple(_COLUMN_OF[field] for field in NodeHead.__struct_fields__)


def node_head(row: Sequence[Any]) -> NodeHead:
    """A row of a statement that selects ``HEAD_COLUMNS`` (in that order, its fields'):
    positional, as the head is read on every heartbeat (a dict of it took twice as long)."""
    return NodeHead(*row)


class NodeRow(NodeHead, frozen=True, kw_only=True, dict=True):
    """A row of ``nodes``. ``inventory``, ``applied``, ``applied_units`` and ``spec`` are
    decoded from their stored text on first read."""

    hostname: str
    tenant_owned: bool
    state_reason: str | None
    created_at: str
    updated_at: str | None
    last_seen_at: str | None
    identity: str | None
    machine_id: str | None
    inventory_json: str | None
    inventory_rev: int
    rows_inventory_rev: int
    rows_pool_version: int
    logical_cpus: int
    memory_total_bytes: int
    hugepages_2mi: int
    hugepages_1gi: int
    disk_total_bytes: int
    applied_version: str | None
    applied_units_json: str | None
    pending_reboot: bool
    spec_json: str | None
    cordon_reason: str | None
    cordoned_at: str | None
    drain_reason: str | None
    drain_state: str | None
    drain_started_at: str | None
    drain_deadline: str | None
    removed_at: str | None
    topology_json: str | None  # D2: the host's GPU and CPU topology (capacity/topology.py)
    bookings_json: str | None  # D5: the bookings its NodeSpec carries
    free_atoms: int  # placeable GPU atoms not booked: the placer's bin-packing order

    @cached_property
    def bookings(self) -> list[Booking]:
        """D5: the node's live and releasing bookings, as its NodeSpec carries them."""
        if not self.bookings_json:
            return []
        return msgspec.json.decode(self.bookings_json, type=list[Booking])

    @cached_property
    def inventory(self) -> Inventory | None:
        """The host's last inventory (None before its first)."""
        if not self.inventory_json:
            return None
        return msgspec.json.decode(self.inventory_json, type=Inventory)

    @cached_property
    def applied(self) -> dict[str, Any] | None:
        """The agent's last report of what it applied (``version``, ``units``), if any."""
        return msgspec.json.decode(self.applied_json) if self.applied_json else None

    @cached_property
    def applied_units(self) -> dict[str, str]:
        """H4: per unit id, the key of the unit the agent last reported applied."""
        if not self.applied_units_json:
            return {}
        return msgspec.json.decode(self.applied_units_json, type=dict[str, str])

    @cached_property
    def spec(self) -> NodeSpecUnits | None:
        """The NodeSpec units last rendered for the node, if any."""
        return msgspec.json.decode(self.spec_json, type=NodeSpecUnits) if self.spec_json else None

    def updated(self, columns: Mapping[str, Any], inventory: Inventory | None = None) -> "NodeRow":
        """The row once ``columns`` (by column name) are written. What this row decoded of
        the other JSON columns comes along, and ``inventory`` is the parsed inventory they
        wrote: nothing is decoded again."""
        row = msgspec.structs.replace(
            self, **{_FIELD_OF[name]: value for name, value in columns.items()}
        )
        # A decoded column is cached under its column's name (the properties above).
        row.__dict__.update((k, v) for k, v in self.__dict__.items() if k not in columns)
        if inventory is not None:
            row.__dict__.update(inventory=inventory)
        return row


def node_row(row: Sequence[Any]) -> NodeRow:
    """A row of a statement that selects ``NODE_COLUMNS`` (in that order) first."""
    values = dict(zip(NODE_FIELDS, row[: len(NODE_FIELDS)], strict=True))
    for flag in FLAG_COLUMNS:
        values[flag] = bool(values[flag])
    return NodeRow(**values)


class NodePool(Struct, frozen=True, kw_only=True, dict=True):
    """What a node's reconcile reads of its pool. ``policy_json`` is the stored text (the
    spec's version hashes it as stored); ``policy`` its object, decoded on first read."""

    id: str
    version: int
    pool_class: str
    sharing: str
    policy_json: str
    gpu_model: str | None
    owner_tenant_id: str

    @cached_property
    def policy(self) -> dict[str, Any]:
        return policy_of(self.id, stored_policy(self.policy_json))


POOL_COLUMNS = ("id", "version", "class", "sharing", "policy", "gpu_model", "owner_tenant_id")


def node_pool(row: Sequence[Any]) -> NodePool:
    """A row of a statement that selects ``POOL_COLUMNS`` (in that order)."""
    pool_id, version, pool_class, sharing, policy, gpu_model, owner = row
    return NodePool(
        id=pool_id,
        version=version,
        pool_class=pool_class,
        sharing=sharing,
        policy_json=policy,
        gpu_model=gpu_model,
        owner_tenant_id=owner,
    )


class ReconcileRow(Struct, frozen=True, kw_only=True):
    """A node with its pool: what the reconciler reads of each node it reconciles or drains."""

    node: NodeRow
    pool: NodePool


def reconcile_row(row: Sequence[Any]) -> ReconcileRow:
    """A row of ``NODE_COLUMNS`` then ``POOL_COLUMNS``."""
    return ReconcileRow(node=node_row(row), pool=node_pool(row[len(NODE_COLUMNS) :]))


class ResourceRow(Struct, frozen=True, kw_only=True):
    """A row of ``node_resources``."""

    node_id: str
    resource: str
    capacity: int
    allocated: int
    ratio: float


RESOURCE_COLUMNS = ("node_id", "resource", "capacity", "allocated", "ratio")


def resource_row(row: Sequence[Any]) -> ResourceRow:
    node_id, resource, capacity, allocated, ratio = row
    return ResourceRow(
        node_id=node_id, resource=resource, capacity=capacity, allocated=allocated, ratio=ratio
    )


class DeviceRow(Struct, frozen=True, kw_only=True):
    """A row of ``node_devices``: one GPU atom, and whether it is booked or out of placement."""

    node_id: str
    device_id: str
    resource: str
    gpu_uuid: str
    profile: str | None
    allocated: bool
    reservation_id: str | None
    unhealthy: bool  # H5
    held: bool  # H4


class NewAtom(NamedTuple):
    """An atom to write: new, so not booked; its flags as it is written (H4, H5)."""

    device_id: str
    resource: str
    gpu_uuid: str
    profile: str | None
    unhealthy: bool
    held: bool


DEVICE_COLUMNS = (
    "node_id",
    "device_id",
    "resource",
    "gpu_uuid",
    "profile",
    "allocated",
    "reservation_id",
    "unhealthy",
    "held",
)


def device_row(row: Sequence[Any]) -> DeviceRow:
    node_id, device_id, resource, gpu_uuid, profile, allocated, reservation, unhealthy, held = row
    return DeviceRow(
        node_id=node_id,
        device_id=device_id,
        resource=resource,
        gpu_uuid=gpu_uuid,
        profile=profile,
        allocated=bool(allocated),
        reservation_id=reservation,
        unhealthy=bool(unhealthy),
        held=bool(held),
    )


class JoinTokenRow(Struct, frozen=True, kw_only=True):
    """A row of ``join_tokens`` (its hash stays in storage)."""

    id: str
    pool_id: str
    expires_at: str
    max_uses: int
    uses: int


class SilentRow(Struct, frozen=True, kw_only=True):
    """A watched node whose stored stamp is old, with its pool's owner (for node.lost)."""

    id: str
    pool_id: str
    hostname: str
    last_seen_at: str
    owner_tenant_id: str
