"""Quota, capacity and event methods."""

from controlplane.api.method import Method, read, write
from controlplane.services import events, offers, pools
from controlplane.services.access import Access
from shared import schemas as s

METHODS = (
    Method(
        "/api/compute/quotas/set",
        s.QuotasSet,
        s.QuotaList,
        write(offers.set_quota),
        "Set a tenant's quota rows on a pool (owner acting).",
        Access("compute:quotas:manage", "owned-pool"),
    ),
    Method(
        "/api/compute/quotas/list",
        s.QuotasList,
        s.QuotaList,
        read(offers.list_quotas),
        "The caller tenant's quota rows.",
        Access("compute:quotas:read", "tenant", items=True),
    ),
    Method(
        "/api/compute/capacity/byPool",
        s.CapacityByPool,
        s.CapacityList,
        read(pools.pool_capacity),
        "A pool's capacity rollup; the same answer as pools/capacity.",
        Access("compute:capacity:read", "pool"),
    ),
    Method(
        "/api/compute/events/list",
        s.EventsList,
        s.EventList,
        read(events.list_events),
        "Events after a cursor, oldest first.",
        Access("compute:events:read", "tenant", items=True),
    ),
)
