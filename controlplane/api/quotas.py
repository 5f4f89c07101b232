"""Quota, capacity and event methods."""

from controlplane.api.method import LongPoll, Method, Read, Write
from controlplane.services import events, offers, pools, quotas
from controlplane.services.access import Access
from controlplane.services.views import POOL_VIEW
from shared import schemas as s

METHODS = (
    Method(
        "/api/compute/quotas/set",
        s.QuotasSet,
        s.QuotaRows,
        Write(offers.set_quota),
        "Set a tenant's quota rows on a pool (owner acting).",
        Access("compute:quotas:manage", "owned-pool"),
    ),
    Method(
        "/api/compute/quotas/list",
        s.QuotasList,
        s.QuotaList,
        Read(quotas.list_quotas, offload=True, cached=True, scopes=POOL_VIEW),
        "The caller tenant's quota rows by pool and resource, a page at a time (B1: limit, "
        "default 100, and cursor; next is null at the end).",
        Access("compute:quotas:read", "tenant", items=True),
    ),
    Method(
        "/api/compute/capacity/byPool",
        s.CapacityByPool,
        s.CapacityList,
        Read(pools.pool_capacity),
        "A pool's capacity rollup; the same answer as pools/capacity.",
        Access("compute:capacity:read", "pool"),
    ),
    Method(
        "/api/compute/events/list",
        s.EventsList,
        s.EventList,
        Read(
            events.list_events,
            offload=True,
            long_poll=LongPoll(
                lambda req: req.wait_seconds, events.resume_after, events.whose_events
            ),
        ),
        "Events after a position (after, or cursor), oldest first, at most limit (default 100; "
        "B1); next is the position after the last event read, never null: after=next continues.",
        Access("compute:events:read", "tenant", items=True),
    ),
)
