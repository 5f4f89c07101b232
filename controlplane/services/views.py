"""Building answers from rows: a pool as one tenant sees it, quota rows, offers."""

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from msgspec import UNSET, UnsetType

from controlplane.storage import pools as pool_sql
from controlplane.storage import quotas as quota_sql
from controlplane.storage.ledger_types import QuotaRow as StoredQuota
from controlplane.storage.migrations import Scope
from controlplane.storage.sql import Database
from controlplane.storage.types import POOL_COLUMNS, PoolRow, stored_policy
from shared.schemas import OfferView, PoolView, QuotaRow

# F8: what a pool view (and a quota row) shows: the catalog's rows, and the quota figures in
# use that bookings move. Node reports move neither, so they keep cached pool answers.
POOL_VIEW: tuple[Scope, ...] = ("catalog", "usage")


def quota_row(row: StoredQuota) -> QuotaRow:
    return figures_row(row.tenant_id, row.pool_id, row.resource, row.max, row.used)


def figures_row(tenant_id: str, pool_id: str, resource: str, maximum: int, used: int) -> QuotaRow:
    """A quota row as answers show it: its maximum, what is in use and what is left."""
    return QuotaRow(
        tenant_id=tenant_id,
        pool_id=pool_id,
        resource=resource,
        max=maximum,
        used=used,
        available=max(0, maximum - used),
    )


def offers_by_pool(db: Database, pool_ids: Sequence[str]) -> dict[str, list[OfferView]]:
    """Each pool's offers with the offered tenants' quota maxima: two reads for any number of
    pools (a page of pools/list costs no read per pool)."""
    quotas: dict[tuple[str, str], dict[str, int]] = {}
    for row in quota_sql.pool_quota_rows(db, pool_ids):
        quotas.setdefault((row.pool_id, row.tenant_id), {})[row.resource] = row.max
    offers: dict[str, list[OfferView]] = {pool_id: [] for pool_id in pool_ids}
    for offer in pool_sql.offers_of_pools(db, pool_ids):
        key = (offer.pool_id, offer.to_tenant_id)
        offers[offer.pool_id].append(
            OfferView(
                to_tenant_id=offer.to_tenant_id,
                quota=quotas.get(key, {}),
                include_descendants=offer.include_descendants,
                priority=offer.priority,
                not_after=offer.not_after,
            )
        )
    return offers


# Policy fields that hold secrets: only the pool's owner sees them.
SECRET_POLICY_FIELDS = (("kubernetes", "token"),)


def policy_for(policy: dict[str, Any], owned: bool) -> dict[str, Any]:
    """The policy as the caller may see it: an offered tenant does not get the owner's secrets."""
    if owned:
        return policy
    for section, key in SECRET_POLICY_FIELDS:
        found = policy.get(section)
        if isinstance(found, dict) and key in found:
            policy = {**policy, section: {k: v for k, v in found.items() if k != key}}
    return policy


def pool_view(
    db: Database,
    pool: PoolRow,
    tenant_id: str,
    quotas: Iterable[StoredQuota] | None = None,
    offers: list[OfferView] | None = None,
    offer_end: str | UnsetType | None = UNSET,
) -> PoolView:
    """The pool as ``tenant_id`` sees it (seed 000); the owner also sees its offers, an
    offered tenant its offer's end (C3). A caller that read them passes the tenant's
    ``quotas`` rows, the owner's ``offers`` or the tenant's ``offer_end``."""
    owned = pool.owner_tenant_id == tenant_id
    if quotas is None:
        quotas = quota_sql.quota_rows(db, tenant_id, [pool.id])
    view = PoolView(
        id=pool.id,
        owner_tenant_id=pool.owner_tenant_id,
        site_id=pool.site_id,
        pool_class=pool.pool_class,
        gpu_model=pool.gpu_model,
        sharing=pool.sharing,
        agent=pool.agent,
        policy=policy_for(pool.stored_policy or {}, owned),  # a damaged one shows as {}
        version=pool.version,
        owned=owned,
        archived=pool.archived_at is not None,
        quotas=[quota_row(q) for q in quotas],
        created_at=pool.created_at,
        updated_at=pool.updated_at,
    )
    if owned:
        view.offers = offers_by_pool(db, [pool.id])[pool.id] if offers is None else offers
        if pool.provider_account_id is not None:
            view.provider_account_id = pool.provider_account_id
    else:
        view.offer_ends_at = (
            pool_sql.offer_ends(db, tenant_id, [pool.id]).get(pool.id)
            if offer_end is UNSET
            else offer_end
        )
    return view


def pool_views(
    rows: Sequence[Sequence[Any]],
    tenant_id: str,
    figures: Iterable[tuple[str, str, int, int]],
    offers: Mapping[str, list[OfferView]],
    ends: Mapping[str, str | None],
) -> list[PoolView]:
    """``pool_view`` of a page of pools/list, built straight from its rows (F8): the
    visible-pool rows (storage.pools), the tenant's quota ``figures`` on them (pool,
    resource, max, used, in order), the owned pools' ``offers`` and the ``ends`` of the
    offers the others were made under (C3); no typed row between."""
    quotas: dict[str, list[QuotaRow]] = {}
    for pool_id, resource, maximum, used in figures:
        quotas.setdefault(pool_id, []).append(
            figures_row(tenant_id, pool_id, resource, maximum, used)
        )
    views = []
    # Pools made from one template share their policy text: decoded (and stripped) once.
    policies: dict[tuple[str, bool], dict[str, Any]] = {}
    for row in rows:
        (pool_id, owner, site, pool_class, gpu_model, sharing, agent, policy, provider) = row[:9]
        (version, archived_at, created_at, updated_at) = row[9:POOL_COLUMNS]
        owned = owner == tenant_id
        shown = policies.get((policy, owned))
        if shown is None:
            shown = policies[policy, owned] = policy_for(stored_policy(policy) or {}, owned)
        view = PoolView(
            id=pool_id,
            owner_tenant_id=owner,
            site_id=site,
            pool_class=pool_class,
            gpu_model=gpu_model,
            sharing=sharing,
            agent=agent,
            policy=shown,
            version=version,
            owned=owned,
            archived=archived_at is not None,
            quotas=quotas.get(pool_id, []),
            created_at=created_at,
            updated_at=updated_at,
        )
        if owned:
            view.offers = offers.get(pool_id, [])
            if provider is not None:
                view.provider_account_id = provider
        else:
            view.offer_ends_at = ends.get(pool_id)
        views.append(view)
    return views
