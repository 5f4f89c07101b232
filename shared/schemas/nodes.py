"""Nodes: join tokens, joining, the agent's report and spec, and the operator's node methods."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from shared.ids import ID_BODY
from shared.inventory import Inventory
from shared.nodespec import Booking, Unit
from shared.schemas.common import Answer, PoolId, PoolScoped, Request, TenantScoped
from shared.schemas.paging import DEFAULT_PAGE, Cursor, PageLimit
from shared.validation import whole

NodeId = Annotated[str, Meta(max_length=57, pattern=whole(rf"^node_{ID_BODY}{{26,52}}$"))]
Hostname = Annotated[
    str,
    Meta(
        max_length=253,
        pattern=whole(r"^[A-Za-z0-9]([A-Za-z0-9-]{0,62})(\.[A-Za-z0-9]([A-Za-z0-9-]{0,62}))*$"),
    ),
]
Attestor = Annotated[str, Meta(max_length=64, pattern=whole(r"^[a-z0-9][a-z0-9.-]{0,63}$"))]


class JoinTokensCreate(PoolScoped):
    ttl_seconds: Annotated[int, Meta(ge=60, le=30 * 86400)] = 86400
    max_uses: Annotated[int, Meta(ge=1, le=100_000)] = 1


class NodesJoin(Request):
    join_token: Annotated[str, Meta(min_length=1, max_length=256)]
    attestor: Attestor
    hostname: Hostname
    inventory: Inventory


DeliveryReported = Literal["delivered", "failed", "released", "release-blocked"]


class BookingReport(Request):
    """D5–D7: what the agent did with one booking of its spec. ``reason`` says why a booking
    failed (``gpu busy: pid 4242``) or why its release is blocked (the pids still running)."""

    reservation_id: Annotated[str, Meta(max_length=56)]
    state: DeliveryReported
    reason: Annotated[str, Meta(max_length=500)] | None = None


# F9: the digest of the inventory the control plane holds for a node, as its answers give it.
InventoryDigest = Annotated[
    str,
    Meta(
        pattern=whole(r"^sha256:[0-9a-f]{64}$"),
        description="The digest of the inventory the control plane holds for the node, as "
        "its last report or join answer gave it (F9).",
    ),
]
ONE_INVENTORY = "give inventory or inventoryDigest, exactly one of them"


class NodesReport(Request):
    """A report carries exactly one of ``inventory`` (the whole inventory: at join, when it
    changed, when an answer said ``inventoryWanted``) and ``inventoryDigest`` (F9: the
    inventory is the one the control plane holds; such a report is a small heartbeat)."""

    node_id: NodeId
    inventory: Inventory | UnsetType = UNSET
    inventory_digest: InventoryDigest | UnsetType = UNSET
    applied: dict[str, Any] | UnsetType = UNSET  # the last apply: each unit's outcome
    bookings: Annotated[list[BookingReport], Meta(max_length=4096)] | UnsetType = UNSET

    def __post_init__(self) -> None:
        if (self.inventory is UNSET) == (self.inventory_digest is UNSET):
            # msgspec reports this message as the body's error; the path names the field.
            raise ValueError(f"{ONE_INVENTORY} - at `$.inventoryDigest`")


class NodesSpec(Request):
    node_id: NodeId


NodeState = Literal["configuring", "ready", "quarantined", "lost"]
Reason = Annotated[str, Meta(min_length=1, max_length=500)]


class NodesList(TenantScoped):
    """H7: a pool's nodes, or without poolId every node of every pool the tenant owns."""

    pool_id: PoolId | UnsetType = UNSET
    states: Annotated[list[NodeState], Meta(max_length=4)] | UnsetType = UNSET
    limit: PageLimit = DEFAULT_PAGE
    cursor: Cursor | UnsetType = UNSET


class NodesCordon(TenantScoped):
    node_id: NodeId
    reason: Reason


class NodesUncordon(TenantScoped):
    node_id: NodeId


class NodesDrain(TenantScoped):
    node_id: NodeId
    reason: Reason
    deadline_seconds: Annotated[int, Meta(ge=0, le=30 * 86400)] | UnsetType = UNSET


class NodesRemove(TenantScoped):
    node_id: NodeId
    force: bool = False


class NodeRemoved(Answer):
    removed: bool


class NodesGet(TenantScoped):
    node_id: NodeId


class JoinTokenCreated(Answer):
    token: str
    pool_id: str
    expires_at: str
    max_uses: int


class NodeJoined(Answer):
    node_id: str
    token: str
    pool_id: str
    rejoined: bool
    inventory_digest: str | UnsetType = UNSET  # F9: the digest of the inventory it stored


class Reported(Answer):
    spec_version: str
    # F9: the digest of the inventory held for the node (null: none held), and whether the
    # next report must carry the whole inventory (its digest was not the one held, or none is).
    inventory_digest: str | None
    inventory_wanted: bool


class NodeSpec(Answer):
    """What a node should be: the pool's policy rendered for it as ordered units (N6)."""

    node_id: str
    pool_id: str
    version: str  # the units' content hash
    pool_version: int
    pool_class: str = msgspec.field(name="class")
    sharing: str
    gpu_model: str | None
    policy: dict[str, Any]
    units: list[Unit]
    reboot: bool
    booked_gpus: list[str]  # H4: GPUs with a live booking when the spec was rendered
    bookings: list[Booking] = msgspec.field(
        default_factory=list
    )  # D5: the node's live and releasing bookings to deliver


class ResourceRowView(Answer):
    resource: str
    capacity: int
    allocated: int
    ratio: float


class DeviceView(Answer):
    device_id: str
    resource: str
    gpu_uuid: str
    profile: str | None
    allocated: bool
    unhealthy: bool  # H5: its GPU is not healthy: never placed
    held: bool  # H4: a drain-gated unit is about to reconfigure its GPU


class GpuSummary(Answer):
    index: int
    uuid: str
    name: str
    family: str | None
    memory_bytes: int
    mig: bool
    health: str  # H5: healthy | unhealthy | unknown
    health_reason: str | None


class CordonView(Answer):
    reason: str
    at: str


class DrainView(Answer):
    reason: str
    state: str  # draining | drained
    started_at: str
    deadline: str | None


class NodeBookingView(Answer):
    """D4: one booking on the node as its pool's owner sees it."""

    reservation_id: str
    tenant_id: str
    state: str  # the reservation's state
    gpus: list[str]  # UUIDs
    mig_instances: list[str]
    slots: list[str]
    cpus: str
    cpu_quota: int | None
    memory_bytes: int | None
    delivery: str  # pending | delivered | failed | releasing | released | release-blocked


class NodeView(Answer):
    id: str
    pool_id: str
    hostname: str
    state: str
    state_reason: str | None
    tenant_owned: bool
    joined_at: str
    last_seen_at: str | None
    gpus: list[GpuSummary]
    resources: list[ResourceRowView]
    devices: list[DeviceView]
    inventory: Inventory | None
    spec_version: str | None
    applied_version: str | None  # H1: the last spec version applied cleanly
    pending_reboot: bool
    schedulable: bool  # H2: ready, not cordoned, not being drained
    cordon: CordonView | None
    drain: DrainView | None
    applied: dict[str, Any] | None  # the agent's last apply: spec version and each unit's outcome
    bookings: list[NodeBookingView] = msgspec.field(
        default_factory=list
    )  # D4: live and releasing bookings (the owner's view)


class NodeList(Answer):
    items: list[NodeView]
    next: str | None  # the cursor of the next page (B1); null at the end
