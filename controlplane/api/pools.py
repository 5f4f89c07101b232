"""The seed's eight pools methods (003)."""

from typing import Any

from controlplane.api.method import Method, read
from controlplane.iam.decide import Principal
from controlplane.services import offers, pools
from controlplane.storage.db import Store
from shared import schemas as s


def methods(attestors: frozenset[str]) -> tuple[Method, ...]:
    """The pools methods; create and update validate against the registered attestors (P8)."""

    def create(store: Store, principal: Principal, body: Any) -> Any:
        return pools.create_pool(store, principal, body, attestors)

    def update(store: Store, principal: Principal, body: Any) -> Any:
        return pools.update_pool(store, principal, body, attestors)

    return (
        Method(
            "/api/compute/pools/list",
            s.PoolsList,
            s.PoolList,
            read(pools.list_pools),
            "Pools the tenant owns or is offered, each with owned, archived and its quota rows.",
        ),
        Method(
            "/api/compute/pools/get",
            s.PoolsGet,
            s.PoolView,
            read(pools.get_pool),
            "One pool as the tenant sees it.",
        ),
        Method(
            "/api/compute/pools/create",
            s.PoolsCreate,
            s.PoolView,
            create,
            "Create a pool on a site the tenant owns; version 1, empty rollup.",
        ),
        Method(
            "/api/compute/pools/capacity",
            s.PoolsCapacity,
            s.CapacityList,
            read(pools.pool_capacity),
            "One pool's rollup rows, one per resource.",
        ),
        Method(
            "/api/compute/pools/offer",
            s.PoolsOffer,
            s.PoolView,
            offers.offer_pool,
            "Offer a pool to a tenant with a quota, or update the offer.",
        ),
        Method(
            "/api/compute/pools/unoffer",
            s.PoolsUnoffer,
            s.Unoffered,
            offers.unoffer_pool,
            "Withdraw a pool's offer from a tenant.",
        ),
        Method(
            "/api/compute/pools/update",
            s.PoolsUpdate,
            s.PoolView,
            update,
            "Replace the policy, the GPU model, or both; version + 1.",
        ),
        Method(
            "/api/compute/pools/archive",
            s.PoolsArchive,
            s.PoolView,
            pools.archive_pool,
            "Retire a pool: remove every offer and stop new work.",
        ),
    )
