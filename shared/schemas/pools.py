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
