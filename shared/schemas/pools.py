"""Pools (seed 003): create, read, update, archive, and the pool as answered."""

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

from shared.ids import ID_BODY
from shared.schemas.common import Answer, IdempotencyKey, PoolScoped, PoolVersion, TenantScoped
from shared.schemas.paging import Cursor, PageLimit
from shared.schemas.quotas import OfferView, Quota, QuotaRow
from shared.schemas.sites import SiteId
from shared.validation import whole

ProviderAccountId = Annotated[
    str, Meta(max_length=58, pattern=whole(rf"^pacct_{ID_BODY}{{26,52}}$"))
]
GpuModel = Annotated[str, Meta(max_length=32, pattern=whole(r"^[A-Za-z0-9-]{1,32}$"))]
PoolClass = Literal["metal-host", "metal-dedicated", "vps-host", "provider"]
Sharing = Literal["exclusive", "mig", "timeslice", "mps"]
AgentKind = Literal["bcd", "none"]


class PoolsList(TenantScoped):
    """L1, B1: without limit every pool (the seed's contract), else a page; in id order."""

    limit: PageLimit | UnsetType = UNSET
    cursor: Cursor | UnsetType = UNSET


class PoolsGet(PoolScoped):
    pass


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


class PoolsUpdate(PoolScoped):
    policy: dict[str, Any] | UnsetType = UNSET
    gpu_model: GpuModel | UnsetType = UNSET
    version: PoolVersion | UnsetType = UNSET
    dry_run: Annotated[
        bool,
        Meta(
            description="C1: change nothing and answer {pool, plan}: what the update would do "
            "to every node, the capacity and the offered quotas."
        ),
    ] = False


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
    # C3: an offered tenant's own offer's end (null: until unoffered); not shown to the owner
    offer_ends_at: str | UnsetType | None = UNSET
    warnings: (
        Annotated[
            list[str],
            Meta(
                description="pools/create and pools/update: policy fields the code does "
                "not read (stored as given, P9), e.g. `policy.hugepage: not a field the code "
                "reads; did you mean hugepages?`; pools/offer: resources whose offered quota "
                "maxima exceed their schedulable capacity (C5), e.g. `quota gpu: 40 offered "
                "over 32 schedulable`"
            ),
        ]
        | UnsetType
    ) = UNSET


PlanNeed = Literal["restart", "drain", "reboot"]
UnitChange = Literal["add", "change", "remove"]


class PlanUnit(Answer):
    """C1: one configuration unit the change adds, changes or removes on a node."""

    id: str
    change: UnitChange
    needs: list[PlanNeed]


class PlanNode(Answer):
    """C1: what the change does to one node of the pool."""

    node_id: str
    hostname: str
    units: list[PlanUnit]
    drain_needed: bool  # the change has drain-gated units on this node (H4), booked or not
    bookings_in_the_way: list[str]  # live reservations on the GPUs those units touch
    reboot_needed: bool


class PlanCapacity(Answer):
    """C1: schedulable capacity of one resource now, and once every node took the change
    with today's bookings ended."""

    resource: str
    before: int
    after: int


class PlanQuota(Answer):
    """C1: one offered tenant's quota on one resource against the capacity after."""

    tenant_id: str
    resource: str
    max: int
    schedulable_after: int
    covered: bool  # max ≤ schedulableAfter


class Plan(Answer):
    nodes: list[PlanNode]
    capacity: list[PlanCapacity]
    quotas: list[PlanQuota]
    warnings: list[str]  # as pools/update answers them (P9)


class PoolPlan(Answer):
    """C1: pools/update with dryRun: the pool as it would be (its version still the current
    one: pass it as ``version`` to apply exactly this) and the plan."""

    pool: PoolView
    plan: Plan


class PoolList(Answer):
    items: list[PoolView]
    next: str | None  # the cursor of the next page (B1); null at the end and without limit
