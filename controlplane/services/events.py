"""events.list: the caller tenant's events after a cursor; root acting as itself sees the fleet's."""

import msgspec
import sqlite_utils
from msgspec import UNSET

from controlplane.iam.decide import Principal
from controlplane.services.access import act_for, require
from controlplane.storage import events
from shared.schemas import EventList, EventsList, EventView


def list_events(db: sqlite_utils.Database, principal: Principal, req: EventsList) -> EventList:
    act_for(db, principal, req.tenant_id, "compute:events:read")
    require(principal, "compute:events:read", "compute-tenant")
    fleet = principal.is_root and req.tenant_id == principal.tenant_id
    rows = events.list_events(
        db,
        tenant_id=None if fleet else req.tenant_id,
        after=req.after,
        limit=req.limit,
        types=None if req.types is UNSET else req.types,
    )
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
    ]
    return EventList(items=items, next=items[-1].seq if items else req.after)
