"""Events: the log read in seq order, a page at a time or waiting for the next (B1, B2)."""

from typing import Annotated, Any

from msgspec import UNSET, Meta, UnsetType

from shared.schemas.common import Answer, TenantScoped
from shared.schemas.paging import DEFAULT_PAGE, PageLimit
from shared.validation import whole

EventType = Annotated[str, Meta(max_length=64, pattern=whole(r"^[a-z]+(\.[a-z][A-Za-z]*)+$"))]
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
