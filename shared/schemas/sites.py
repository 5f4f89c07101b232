"""Sites: where pools live."""

from typing import Annotated, Literal

from msgspec import UNSET, Meta, UnsetType

from shared.ids import ID_BODY
from shared.schemas.common import Answer, TenantScoped
from shared.schemas.paging import DEFAULT_PAGE, Cursor, PageLimit
from shared.validation import whole

SiteId = Annotated[str, Meta(max_length=57, pattern=whole(rf"^site_{ID_BODY}{{26,52}}$"))]
SiteName = Annotated[str, Meta(max_length=64, pattern=whole(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"))]
Region = Annotated[str, Meta(max_length=64, pattern=whole(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"))]
SiteKind = Literal["shared", "dedicated", "custom"]


class SitesCreate(TenantScoped):
    name: SiteName
    region: Region
    kind: SiteKind


class SitesList(TenantScoped):
    """The tenant's sites in id order, a page at a time (B1)."""

    limit: PageLimit = DEFAULT_PAGE
    cursor: Cursor | UnsetType = UNSET


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
