"""events.list: the caller tenant's events after a cursor; root acting as itself sees the fleet's."""

import msgspec
from msgspec import UNSET

from controlplane.iam.decide import Principal
from controlplane.services.access import readable_pools
from controlplane.services.call import Call
from controlplane.storage import events
from controlplane.storage.sql import Database
from shared.errors import InvalidInput
from shared.schemas import EventList, EventsList, EventView


def position(req: EventsList) -> int:
    """Where the page starts (B1): after ``after``, or the same position given as ``cursor``
    (the ``next`` of the page before, as given or as its string); both is INVALID_INPUT."""
    if req.cursor is UNSET:
        return 0 if req.after is UNSET else req.after
    if req.after is not UNSET:
        raise InvalidInput("give after or cursor, not both", field="cursor")
    return int(req.cursor)


def whose_events(req: EventsList, principal: Principal) -> str | None:
    """The tenant whose audience the events shown come from; None: every event (root acting
    as itself sees the fleet's log)."""
    return None if principal.is_root and req.tenant_id == principal.tenant_id else req.tenant_id


def list_events(db: Database, call: Call[EventsList]) -> EventList:
    """The events after the position in seq order, at most ``limit``; ``next`` is the position
    after the last event read, never null (the log has no end): after=next continues."""
    principal, req = call.principal, call.body
    fleet = whose_events(req, principal) is None
    after = position(req)
    rows = events.list_events(
        db,
        tenant_id=None if fleet else req.tenant_id,
        after=after,
        limit=req.limit,
        types=None if req.types is UNSET else req.types,
    )
    # R1: events of a pool only where the credential may read that pool's events.
    pools = {row.pool_id for row in rows if row.pool_id is not None}
    allowed = readable_pools(db, principal, req.tenant_id, pools, "compute:events:read")
    items = [
        EventView(
            seq=row.seq, id=row.id, type=row.type, at=row.at, pool_id=row.pool_id, data=row.data
        )
        for row in rows
        if row.pool_id is None or row.pool_id in allowed
    ]
    # The cursor moves past what was read, shown or not, so paging never stalls.
    return EventList(items=items, next=rows[-1].seq if rows else after)


def resume_after(req: EventsList, answer: EventList) -> tuple[EventsList, bool] | None:
    """B2: an empty page reads again from where it got to: at once when it read past events
    the caller may not see, else after the next commit."""
    if answer.items:
        return None
    moved = answer.next != position(req)
    return msgspec.structs.replace(req, after=answer.next, cursor=UNSET), moved
