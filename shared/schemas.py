"""Request and response schemas: the one place input constraints are declared.

The request structs match the seed's input tables (003) exactly: patterns,
lengths, enums, ranges, required fields, and unknown fields refused. The same
structs generate the OpenAPI document, and the response structs serialize
answers.
"""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from shared.ids import ID_BODY
from shared.inventory import Inventory
from shared.nodespec import Unit
from shared.validation import whole

TenantId = Annotated[str, Meta(max_length=128, pattern=whole(r"^[A-Za-z0-9._:-]{1,128}$"))]
PoolId = Annotated[str, Meta(max_length=57, pattern=whole(rf"^pool_{ID_BODY}{{26,52}}$"))]
SiteId = Annotated[str, Meta(max_length=57, pattern=whole(rf"^site_{ID_BODY}{{26,52}}$"))]
CredentialId = Annotated[str, Meta(max_length=57, pattern=whole(rf"^cred_{ID_BODY}{{26,52}}$"))]
ProviderAccountId = Annotated[
    str, Meta(max_length=58, pattern=whole(rf"^pacct_{ID_BODY}{{26,52}}$"))
]
GpuModel = Annotated[str, Meta(max_length=32, pattern=whole(r"^[A-Za-z0-9-]{1,32}$"))]
QuotaKey = Annotated[str, Meta(pattern=whole(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$"))]
QuotaValue = Annotated[int, Meta(ge=0, le=2147483647)]
Quota = Annotated[dict[QuotaKey, QuotaValue], Meta(max_length=64)]
IdempotencyKey = Annotated[
    str, Meta(max_length=128, pattern=whole(r"^[A-Za-z0-9._~:/+=-]{1,128}$"))
]
Priority = Annotated[int, Meta(ge=-1000, le=1000)]
DisplayName = Annotated[str, Meta(min_length=1, max_length=200)]
SiteName = Annotated[str, Meta(max_length=64, pattern=whole(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"))]
Region = Annotated[str, Meta(max_length=64, pattern=whole(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"))]
EventType = Annotated[str, Meta(max_length=64, pattern=whole(r"^[a-z]+(\.[a-z][A-Za-z]*)+$"))]
# B1: a list answers at most this many items a page (100 unless told) and the cursor of the next.
PageLimit = Annotated[int, Meta(ge=1, le=1000, description="At most this many items (B1).")]
DEFAULT_PAGE = 100
# B1: the `next` of the page before, as the list gave it: opaque (a position the server sealed,
# base64url), refused by any other list.
Cursor = Annotated[
    str,
    Meta(
        max_length=256,
        pattern=whole(r"^[A-Za-z0-9_-]{1,256}$"),
        description="The `next` of the page before (B1), as given.",
    ),
]

PoolClass = Literal["metal-host", "metal-dedicated", "vps-host", "provider"]
Sharing = Literal["exclusive", "mig", "timeslice", "mps"]
AgentKind = Literal["bcd", "none"]
SiteKind = Literal["shared", "dedicated", "custom"]

# An IAM action: service:group:verb, where any part may be "*".
ActionPattern = Annotated[
    str, Meta(max_length=128, pattern=whole(r"^(\*|[a-z]+(:(\*|[a-zA-Z]+)){0,2}(:\*)?)$"))
]
ResourceType = Literal["compute-fleet", "compute-tenant", "compute-pool", "*"]


class Request(Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """Every request body: a JSON object with unknown fields refused."""


class TenantScoped(Request):
    tenant_id: TenantId


class PoolScoped(TenantScoped):
    pool_id: PoolId


# --- IAM -------------------------------------------------------------------


class Conditions(Struct, forbid_unknown_fields=True, rename={"pool_class": "class"}):
    """Conditions on the pool's authz attributes; each lists the values that match."""

    gpuModel: list[GpuModel] | UnsetType = UNSET
    pool_class: list[PoolClass] | UnsetType = UNSET
    sharing: list[Sharing] | UnsetType = UNSET
    region: list[Region] | UnsetType = UNSET
    owned: list[bool] | UnsetType = UNSET


class Statement(Struct, forbid_unknown_fields=True):
    effect: Literal["allow", "deny"]
    actions: Annotated[list[ActionPattern], Meta(min_length=1, max_length=64)]
    resources: Annotated[list[ResourceType], Meta(min_length=1, max_length=8)]
    conditions: Conditions | UnsetType = UNSET


class TenantsCreate(TenantScoped):
    parent_tenant_id: TenantId | UnsetType = UNSET
    name: DisplayName | UnsetType = UNSET


class TenantsDelete(TenantScoped):
    pass


class CredentialsCreate(TenantScoped):
    name: DisplayName | UnsetType = UNSET
    statements: Annotated[list[Statement], Meta(max_length=64)] | UnsetType = UNSET


class CredentialsRevoke(TenantScoped):
    credential_id: CredentialId


class CredentialsWhoami(Request):
    """No fields: the answer is about the credential that calls."""


# --- sites -----------------------------------------------------------------


class SitesCreate(TenantScoped):
    name: SiteName
    region: Region
    kind: SiteKind


class SitesList(TenantScoped):
    """The tenant's sites in id order, a page at a time (B1)."""

    limit: PageLimit = DEFAULT_PAGE
    cursor: Cursor | UnsetType = UNSET


# --- pools (seed 003) ------------------------------------------------------


class PoolsList(TenantScoped):
    """L1, B1: without limit every pool (the seed's contract), else a page; in id order."""

    limit: PageLimit | UnsetType = UNSET
    cursor: Cursor | UnsetType = UNSET


class PoolsGet(PoolScoped):
    pass


class PoolsCapacity(PoolScoped):
    pass


# R3: a pool mutation may name the pool's version as last read; a stale one is CONFLICT.
PoolVersion = Annotated[
    int,
    Meta(ge=1, le=2**63 - 1, description="The pool's version as last read (R3); stale: CONFLICT."),
]


class PoolsArchive(PoolScoped):
    version: PoolVersion | UnsetType = UNSET


class PoolsCreate(TenantScoped):
    site_id: SiteId
    pool_class: PoolClass = msgspec.field(name="class")
    gpu_model: GpuModel | UnsetType = UNSET
    sharing: Sharing = "exclusive"
    agent: AgentKind | UnsetType = UNSET
    policy: dict[str, Any] | UnsetType = UNSET
    owner_quota: Quota | UnsetType = UNSET
    provider_account_id: ProviderAccountId | UnsetType = UNSET
    idempotency_key: IdempotencyKey | UnsetType = UNSET


class PoolsOffer(PoolScoped):
    to_tenant_id: TenantId
    quota: Quota
    include_descendants: bool = False
    priority: Priority = 0
    version: PoolVersion | UnsetType = UNSET


class PoolsUnoffer(PoolScoped):
    to_tenant_id: TenantId
    version: PoolVersion | UnsetType = UNSET


class PoolsUpdate(PoolScoped):
    policy: dict[str, Any] | UnsetType = UNSET
    gpu_model: GpuModel | UnsetType = UNSET
    version: PoolVersion | UnsetType = UNSET


# --- quotas, capacity, events ----------------------------------------------


class QuotasSet(PoolScoped):
    for_tenant_id: TenantId
    quota: Quota
    version: PoolVersion | UnsetType = UNSET


class QuotasList(TenantScoped):
    """The caller tenant's quota rows in (poolId, resource) order, a page at a time (B1)."""

    pool_id: PoolId | UnsetType = UNSET
    limit: PageLimit = DEFAULT_PAGE
    cursor: Cursor | UnsetType = UNSET


class CapacityByPool(PoolScoped):
    pass


# An event's position in the log: its seq (0 before the first).
Seq = Annotated[int, Meta(ge=0, le=2**63 - 1)]


class EventsList(TenantScoped):
    """Events after a position in seq order (B1): `after` (the seed's), or the same position
    as `cursor`, the `next` of the page before as given or as its decimal string."""

    after: Seq | UnsetType = UNSET
    cursor: Seq | Annotated[str, Meta(pattern=whole(r"^[0-9]{1,18}$"))] | UnsetType = UNSET
    limit: PageLimit = DEFAULT_PAGE
    types: Annotated[list[EventType], Meta(max_length=32)] | UnsetType = UNSET
    # B2: with nothing visible after the position yet, wait up to this long for an event.
    wait_seconds: Annotated[float, Meta(ge=0, le=60)] = 0


# --- answers ---------------------------------------------------------------


class Answer(Struct, rename="camel", kw_only=True, omit_defaults=True):
    """Every answer body; UNSET fields are left out."""


class QuotaRow(Answer):
    tenant_id: str
    pool_id: str
    resource: str
    max: int
    used: int
    available: int


class OfferView(Answer):
    to_tenant_id: str
    quota: dict[str, int]
    include_descendants: bool
    priority: int


class PoolView(Answer):
    id: str
    owner_tenant_id: str
    site_id: str
    pool_class: str = msgspec.field(name="class")
    gpu_model: str | None
    sharing: str
    agent: str
    policy: dict[str, Any]
    version: int
    owned: bool
    archived: bool
    quotas: list[QuotaRow]
    created_at: str
    updated_at: str
    offers: list[OfferView] | UnsetType = UNSET
    provider_account_id: str | UnsetType = UNSET
    warnings: (
        Annotated[
            list[str],
            Meta(
                description="pools/create and pools/update only: policy fields the code does "
                "not read (stored as given, P9), e.g. `policy.hugepage: not a field the code "
                "reads; did you mean hugepages?`"
            ),
        ]
        | UnsetType
    ) = UNSET


class PoolList(Answer):
    items: list[PoolView]
    next: str | None  # the cursor of the next page (B1); null at the end and without limit


class Unoffered(Answer):
    removed: bool


class QuotaRows(Answer):
    """The rows quotas/set wrote."""

    items: list[QuotaRow]


class QuotaList(QuotaRows):
    next: str | None  # the cursor of the next page (B1); null at the end


class CapacityRow(Answer):
    """H6, the capacity ledger: total over every node; schedulable over ready, schedulable
    nodes and healthy GPUs; allocated as booked; available = schedulable not booked;
    offered = quota maxima of tenants other than the owner (shown to the owner only)."""

    pool_id: str
    resource: str
    total: int
    schedulable: int
    allocated: int
    available: int
    offered: int | UnsetType = UNSET


class CapacityList(Answer):
    items: list[CapacityRow]


class SiteView(Answer):
    id: str
    owner_tenant_id: str
    name: str
    region: str
    kind: str
    created_at: str


class SiteList(Answer):
    items: list[SiteView]
    next: str | None  # the cursor of the next page (B1); null at the end


class TenantView(Answer):
    tenant_id: str
    parent_tenant_id: str | None
    name: str | None
    created_at: str


class TenantDeleted(Answer):
    tenant_id: str
    archived_pools: list[str]
    withdrawn_offers: list[str]
    revoked_credentials: int


class CredentialCreated(Answer):
    credential_id: str
    tenant_id: str
    token: str


class CredentialRevoked(Answer):
    credential_id: str
    revoked: bool


class CallerView(Answer):
    """Who the calling credential is (iam/credentials/whoami)."""

    tenant_id: str
    credential_id: str
    root: bool  # the root tenant's: it may act for any tenant (compute-fleet)
    admin: bool  # no statements: every action on its tenant and the pools it owns or is offered


class EventView(Answer):
    seq: int
    id: str
    type: str
    at: str
    pool_id: str | None
    data: dict[str, Any]


class EventList(Answer):
    items: list[EventView]
    # The position after the last event read (B1): never null, the log has no end; `after`
    # (or `cursor`) = next continues, and answers nothing new until more events come.
    next: int


class ErrorDetail(Struct):
    code: str
    message: str
    details: dict[str, Any]
    requestId: str


class ErrorBody(Struct):
    error: ErrorDetail


# --- nodes -----------------------------------------------------------------

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


class NodesReport(Request):
    node_id: NodeId
    inventory: Inventory
    applied: dict[str, Any] | UnsetType = UNSET  # per-unit apply results (the NodeSpec issue)


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


class Reported(Answer):
    spec_version: str


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


class NodeList(Answer):
    items: list[NodeView]
    next: str | None  # the cursor of the next page (B1); null at the end


# --- reservations and budgets -------------------------------------------------

ReservationId = Annotated[str, Meta(max_length=56, pattern=whole(rf"^res_{ID_BODY}{{26,52}}$"))]
Amount = Annotated[int, Meta(ge=1, le=1_000_000)]
Meter = Annotated[str, Meta(max_length=64, pattern=whole(r"^gpu\.[a-z0-9-]{1,32}\.hours$"))]
ReservationState = Literal["pending", "placed", "active", "ended", "failed"]


class ReservationResources(
    Struct,
    forbid_unknown_fields=True,
    omit_defaults=True,
    rename={"gpu_mig": "gpu.mig", "gpu_slot": "gpu.slot"},
):
    """What a reservation asks for: atoms by the pool's sharing mode (S1) and rows."""

    gpu: Amount | UnsetType = UNSET
    gpu_mig: Amount | UnsetType = UNSET
    gpu_slot: Amount | UnsetType = UNSET
    vcpu: Amount | UnsetType = UNSET
    memoryGiB: Amount | UnsetType = UNSET
    hugepages2Mi: Amount | UnsetType = UNSET
    hugepages1Gi: Amount | UnsetType = UNSET
    diskGiB: Amount | UnsetType = UNSET


class ReservationsCreate(PoolScoped):
    resources: ReservationResources
    mig_profile: (
        Annotated[
            str, Meta(max_length=32, pattern=whole(r"^([1-9]c\.)?[1-9]g\.[0-9]+gb([+-][a-z.]+)?$"))
        ]
        | UnsetType
    ) = UNSET
    idempotency_key: IdempotencyKey | UnsetType = UNSET


class ReservationsGet(TenantScoped):
    reservation_id: ReservationId


class ReservationsEnd(TenantScoped):
    reservation_id: ReservationId


class ReservationsList(TenantScoped):
    """The tenant's reservations in id order, a page at a time (B1)."""

    pool_id: PoolId | UnsetType = UNSET
    states: Annotated[list[ReservationState], Meta(max_length=5)] | UnsetType = UNSET
    limit: PageLimit = DEFAULT_PAGE
    cursor: Cursor | UnsetType = UNSET


class BudgetsSet(TenantScoped):
    meter: Meter
    limit: Annotated[float, Meta(ge=0, le=1e12)] | None


class BudgetsGet(TenantScoped):
    meter: Meter


class ReservationView(Answer):
    id: str
    tenant_id: str
    pool_id: str
    resources: dict[str, int]
    mig_profile: str | None
    state: str
    reason: str | None
    node_id: str | None
    created_at: str
    updated_at: str
    placed_at: str | None
    ended_at: str | None
    expires_at: str | None


class ReservationList(Answer):
    items: list[ReservationView]
    next: str | None  # the cursor of the next page (B1); null at the end


class BudgetView(Answer):
    tenant_id: str
    meter: str
    limit: float | None
    spent: float
