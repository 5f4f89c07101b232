"""The seed's eight pools methods (003)."""

from controlplane.api.method import Method, Read, Write
from controlplane.services import offers, pools
from controlplane.services.access import Access
from controlplane.services.views import POOL_VIEW
from shared import schemas as s

METHODS = (
    Method(
        "/api/compute/pools/list",
        s.PoolsList,
        s.PoolList,
        Read(pools.list_pools, offload=True, cached=True, scopes=POOL_VIEW),
        "Pools the tenant owns or is offered, each with owned, archived and its quota rows, by "
        "id; without limit every pool, with limit a page (B1: cursor; next is null at the end).",
        Access("compute:pools:read", "tenant", items=True),
    ),
    Method(
        "/api/compute/pools/get",
        s.PoolsGet,
        s.PoolView,
        Read(pools.get_pool, cached=True, scopes=POOL_VIEW),
        "One pool as the tenant sees it.",
        Access("compute:pools:read", "pool"),
    ),
    Method(
        "/api/compute/pools/create",
        s.PoolsCreate,
        s.PoolView,
        Write(pools.create_pool),
        "Create a pool on a site the tenant owns; version 1, empty rollup.",
        Access("compute:pools:create", "tenant", keyed="pool"),
    ),
    Method(
        "/api/compute/pools/capacity",
        s.PoolsCapacity,
        s.CapacityList,
        Read(pools.pool_capacity),
        "One pool's rollup rows, one per resource.",
        Access("compute:capacity:read", "pool"),
    ),
    Method(
        "/api/compute/pools/offer",
        s.PoolsOffer,
        s.PoolView,
        Write(offers.offer_pool),
        "Offer a pool to a tenant with a quota, or update the offer; notAfter ends it (C3); "
        "warnings name resources offered over their schedulable capacity (C5).",
        Access("compute:pools:share", "owned-pool"),
    ),
    Method(
        "/api/compute/pools/unoffer",
        s.PoolsUnoffer,
        s.Unoffered,
        Write(offers.unoffer_pool),
        "Withdraw a pool's offer from a tenant.",
        Access("compute:pools:share", "owned-pool"),
    ),
    Method(
        "/api/compute/pools/update",
        s.PoolsUpdate,
        s.PoolView,
        Write(pools.update_pool),
        "Replace the policy, the GPU model, or both; version + 1. With dryRun (C1) nothing "
        "changes and the answer is {pool, plan}: per node the units added, changed or removed "
        "and what they need, the bookings in the way, capacity before and after, the offered "
        "quotas left uncovered.",
        Access("compute:pools:manage", "owned-pool"),
    ),
    Method(
        "/api/compute/pools/archive",
        s.PoolsArchive,
        s.PoolView,
        Write(pools.archive_pool),
        "Retire a pool: remove every offer and stop new work.",
        Access("compute:pools:manage", "owned-pool"),
    ),
)
