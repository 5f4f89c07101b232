"""events.list: the caller tenant's events after a cursor; root acting as itself sees the fleet's."""

import msgspec
from msgspec import UNSET

from controlplane.iam.decide import Principal
from controlplane.services.access import readable_pools
from controlplane.storage import events
from controlplane.storage.sql import Database
from shared.schemas import EventList, EventsList, EventView


def list_events(db: Database, principal: Principal, req: EventsList) -> EventList:
    fleet = principal.is_root and req.tenant_id == principal.tenant_id
    rows = events.list_events(
        db,
        tenant_id=None if fleet else req.tenant_id,
        after=req.after,
        limit=req.limit,
        types=None if req.types is UNSET else req.types,
    )
    # R1: events of a pool only where the credential may read that pool's events.
    pools = {row["pool_id"] for row in rows if row["pool_id"] is not None}
    allowed = readable_pools(db, principal, req.tenant_id, pools, "compute:events:read")
    items = [
        EventView(
            seq=row["seq"],
            id=row["id"],
            type=row["type"],
            at=row["at"],
            pool_id=row["pool_id"],
            data=msgspec.json.decode(row["data"]),
        )
        for row in rows
        if row["pool_id"] is None or row["pool_id"] in allowed
    ]
    # The cursor moves past what was read, shown or not, so paging never stalls.
    return EventList(items=items, next=rows[-1]["seq"] if rows else req.after)
