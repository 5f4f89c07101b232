"""Building answers from rows: a pool as one tenant sees it, quota rows, offers."""

from collections.abc import Iterable, Sequence
from typing import Any

from controlplane.storage import pools as pool_sql
from controlplane.storage import quotas as quota_sql
from controlplane.storage.db import Scope
from controlplane.storage.ledger_types import QuotaRow as StoredQuota
from controlplane.storage.sql import Database
from controlplane.storage.types import PoolRow
from shared.schemas import OfferView, PoolView, QuotaRow

# F8: what a pool view (and a quota row) shows: the catalog's rows, and the quota figures in
# use that bookings move. Node reports move neither, so they keep cached pool answers.
POOL_VIEW: tuple[Scope, ...] = ("catalog", "usage")


def quota_row(row: StoredQuota) -> QuotaRow:
    return QuotaRow(
        tenant_id=row.tenant_id,
        pool_id=row.pool_id,
        resource=row.resource,
        max=row.max,
        used=row.used,
        available=max(0, row.max - row.used),
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
            )
        )
    return offers


# Policy fields that hold secrets: only the pool's owner sees them.
SECRET_POLICY_FIELDS = (("kubernetes", "token"),)


def policy_for(policy: dict[str, Any], owned: bool) -> dict[str, Any]:
    """The policy as the caller may see it: an offered tenant does not get the owner's secrets."""
    if owned:
        return policy
    shown = dict(policy)
    for section, key in SECRET_POLICY_FIELDS:
        if isinstance(shown.get(section), dict) and key in shown[section]:
            shown[section] = {k: v for k, v in shown[section].items() if k != key}
    return shown


def pool_view(
    db: Database,
    pool: PoolRow,
    tenant_id: str,
    quotas: Iterable[StoredQuota] | None = None,
    offers: list[OfferView] | None = None,
) -> PoolView:
    """The pool as ``tenant_id`` sees it (seed 000); the owner also sees its offers. A list
    passes the tenant's ``quotas`` rows and the owner's ``offers`` it read for a whole page."""
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
        policy=policy_for(pool.policy, owned),
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
    return view
