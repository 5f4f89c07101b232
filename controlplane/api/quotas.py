"""Quota, capacity and event methods."""

from controlplane.api.method import Method, read, write
from controlplane.services import events, offers, pools
from shared import schemas as s

METHODS = (
    Method(
        "/api/compute/quotas/set",
        s.QuotasSet,
        s.QuotaList,
        write(offers.set_quota),
        "Set a tenant's quota rows on a pool (owner acting).",
    ),
    Method(
        "/api/compute/quotas/list",
        s.QuotasList,
        s.QuotaList,
        read(offers.list_quotas),
        "The caller tenant's quota rows.",
    ),
    Method(
        "/api/compute/capacity/byPool",
        s.CapacityByPool,
        s.CapacityList,
        read(pools.pool_capacity),
        "A pool's capacity rollup; the same answer as pools/capacity.",
    ),
    Method(
        "/api/compute/events/list",
        s.EventsList,
        s.EventList,
        read(events.list_events),
        "Events after a cursor, oldest first.",
    ),
)
