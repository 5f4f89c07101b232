"""Quotas and offers: the maxima a tenant may use of a pool, and who a pool is offered to."""

from datetime import datetime
from typing import Annotated

from msgspec import UNSET, Meta, UnsetType

from shared.schemas.common import Answer, PoolId, PoolScoped, PoolVersion, TenantId, TenantScoped
from shared.schemas.paging import DEFAULT_PAGE, Cursor, PageLimit
from shared.validation import whole

QuotaKey = Annotated[str, Meta(pattern=whole(r"^[A-Za-z][A-Za-z0-9._-]{0,63}$"))]
QuotaValue = Annotated[int, Meta(ge=0, le=2147483647)]
Quota = Annotated[dict[QuotaKey, QuotaValue], Meta(max_length=64)]
Priority = Annotated[int, Meta(ge=-1000, le=1000)]
# C3: an offer's end, RFC 3339 with its offset, in the future and at most 10 years ahead.
NotAfter = Annotated[
    datetime,
    Meta(
        tz=True,
        description="C3: when the offer ends (RFC 3339, in the future, at most 10 years "
        "ahead); null clears it; left out, an offer made again keeps the end it had.",
    ),
]
Warnings = Annotated[
    list[str],
    Meta(
        description="C5: resources whose offered quota maxima exceed their schedulable "
        "capacity, e.g. `quota gpu: 40 offered over 32 schedulable` (overselling is allowed)."
    ),
]


class PoolsOffer(PoolScoped):
    to_tenant_id: TenantId
    quota: Quota
    include_descendants: bool = False
    priority: Priority = 0
    not_after: NotAfter | UnsetType | None = UNSET
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
    not_after: str | None  # C3: when the offer ends; null: until unoffered


class Unoffered(Answer):
    removed: bool


class QuotaRows(Answer):
    """The rows quotas/set wrote."""

    items: list[QuotaRow]
    warnings: Warnings | UnsetType = UNSET  # C5


class QuotaList(Answer):
    items: list[QuotaRow]
    next: str | None  # the cursor of the next page (B1); null at the end
