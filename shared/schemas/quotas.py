"""Quotas and offers: the maxima a tenant may use of a pool, and who a pool is offered to."""

from typing import Annotated

from msgspec import UNSET, Meta, UnsetType

from shared.schemas.common import Answer, PoolId, PoolScoped, PoolVersion, TenantId, TenantScoped
from shared.schemas.paging import DEFAULT_PAGE, Cursor, PageLimit
from shared.validation import whole

QuotaKey = Annotated[str, Meta(pattern=whole(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$"))]
QuotaValue = Annotated[int, Meta(ge=0, le=2147483647)]
Quota = Annotated[dict[QuotaKey, QuotaValue], Meta(max_length=64)]
Priority = Annotated[int, Meta(ge=-1000, le=1000)]


class PoolsOffer(PoolScoped):
    to_tenant_id: TenantId
    quota: Quota
    include_descendants: bool = False
    priority: Priority = 0
    version: PoolVersion | UnsetType = UNSET


class PoolsUnoffer(PoolScoped):
    to_tenant_id: TenantId
    version: PoolVersion | UnsetType = UNSET


class QuotasSet(PoolScoped):
    for_tenant_id: TenantId
    quota: Quota
    version: PoolVersion | UnsetType = UNSET


class QuotasList(TenantScoped):
    """The caller tenant's quota rows in (poolId, resource) order, a page at a time (B1)."""

    pool_id: PoolId | UnsetType = UNSET
    limit: PageLimit = DEFAULT_PAGE
    cursor: Cursor | UnsetType = UNSET


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


class Unoffered(Answer):
    removed: bool


class QuotaRows(Answer):
    """The rows quotas/set wrote."""

    items: list[QuotaRow]


class QuotaList(QuotaRows):
    next: str | None  # the cursor of the next page (B1); null at the end
