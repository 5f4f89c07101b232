"""Offers and quotas: pools.offer, pools.unoffer, quotas.set (O1–O6, E1); offers that end
(C3) and the coverage warnings of what is offered (C5)."""

import time
from datetime import datetime

from msgspec import UNSET, UnsetType

from controlplane.services.call import Call
from controlplane.services.quotas import coverage_warnings, drop_to_in_use, grant
from controlplane.services.views import pool_view, quota_row
from controlplane.storage import events
from controlplane.storage import iam as iam_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage import sites as site_sql
from controlplane.storage.db import Store, now, timestamp
from controlplane.storage.ledger_types import OfferRow
from controlplane.storage.sql import Database
from controlplane.storage.types import PoolRow
from shared.errors import InvalidInput, InvalidState, NotFound
from shared.schemas import (
    PoolsOffer,
    PoolsUnoffer,
    PoolView,
    QuotaRows,
    QuotasSet,
    Unoffered,
)

SINGLE_TENANT_SHARING = ("timeslice", "mps")  # S1: no isolation between slots
OFFER_TERM_MAX = 10 * 366 * 86400  # C3: an offer ends at most 10 years ahead


def offer_end(given: datetime | UnsetType | None, kept: str | None) -> str | None:
    """C3: the end an offer takes: as given (null clears it), else the one it ``kept``; a
    given end is in the future and at most 10 years ahead."""
    if given is UNSET:
        return kept
    if given is None:
        return None
    at = given.timestamp()
    if at <= time.time():
        raise InvalidInput("notAfter must be in the future", field="notAfter")
    if at > time.time() + OFFER_TERM_MAX:
        raise InvalidInput("notAfter must be at most 10 years ahead", field="notAfter")
    return timestamp(at)


def _check_offer_rules(db: Database, pool: PoolRow, req: PoolsOffer) -> None:
    """O4: what may not be offered to a tenant other than the owner."""
    if pool.sharing in SINGLE_TENANT_SHARING:
        raise InvalidState(
            f"a {pool.sharing} pool is single-tenant: it can be offered only to its owner",
            field="toTenantId",
        )
    if pool_sql.tenant_owned_nodes(db, req.pool_id):
        raise InvalidState(
            "a pool holding tenant-owned nodes can be offered only to its owner",
            field="toTenantId",
        )
    if pool.single_tenant:
        if req.include_descendants:
            raise InvalidState(
                "a singleTenant pool cannot be offered with includeDescendants",
                field="includeDescendants",
            )
        others = [
            o for o in pool_sql.offers_of(db, req.pool_id) if o.to_tenant_id != req.to_tenant_id
        ]
        if others:
            raise InvalidState(
                "a singleTenant pool is already offered to another tenant", field="toTenantId"
            )


async def offer_pool(store: Store, call: Call[PoolsOffer]) -> PoolView:
    req = call.body

    def txn(db: Database) -> PoolView:
        pool = call.pool  # owned, at the version asked (R3), decided in this transaction
        if pool.archived_at is not None:
            raise InvalidState("the pool is archived")
        at = now()
        target = req.to_tenant_id
        not_after = None
        if target != pool.owner_tenant_id:
            if iam_sql.get_tenant(db, target) is None:
                raise NotFound("tenant not found", field="toTenantId")
            _check_offer_rules(db, pool, req)
            site = site_sql.get_site(db, pool.site_id)
            assert site is not None
            kept = pool_sql.offer_to(db, pool.id, target)
            not_after = offer_end(req.not_after, kept.not_after if kept else None)
            pool_sql.put_offer(
                db, pool.id, target, req.include_descendants, req.priority, at, not_after
            )
            pool_sql.put_authz(db, target, pool, site.region)  # O5
        elif req.not_after not in (UNSET, None):
            raise InvalidInput("the owner's own quota has no end", field="notAfter")
        _, rows = grant(db, pool.id, target, dict(req.quota), at)  # O2
        stored = {row.resource: row.max for row in rows if row.resource in req.quota}
        events.append(
            db,
            "pool.offered",
            pool_id=pool.id,
            data={
                "toTenantId": target,
                "quota": stored,
                "includeDescendants": req.include_descendants,
                "priority": req.priority,
                # C3: the offer's end, when it has one or this offer cleared it
                **({"notAfter": not_after} if not_after or req.not_after is None else {}),
            },
            audience=[pool.owner_tenant_id, target],
        )
        view = pool_view(db, pool, target, quotas=rows, offer_end=not_after)
        warnings = coverage_warnings(db, pool.id, pool.owner_tenant_id)  # C5
        if warnings:
            view.warnings = warnings
        return view

    return await store.write(txn)


def withdraw_offer(db: Database, pool: PoolRow, tenant: str, reason: str | None = None) -> bool:
    """O6: remove the offer, drop quotas to what is in use, remove the authz row, emit the
    event; C3: the reconciler withdraws an offer whose end passed here too (``reason``
    ``expired``)."""
    pool_id = str(pool.id)
    if not pool_sql.delete_offer(db, pool_id, tenant):
        return False
    drop_to_in_use(db, pool_id, tenant, now())
    pool_sql.delete_authz(db, tenant, pool_id)
    res_sql.mark_pool_gone(db, pool_id, tenant)
    events.append(
        db,
        "pool.unoffered",
        pool_id=pool_id,
        data={"toTenantId": tenant} if reason is None else {"toTenantId": tenant, "reason": reason},
        audience=[str(pool.owner_tenant_id), tenant],
    )
    return True


def expire_offer(db: Database, offer: OfferRow) -> bool:
    """C3: an offer whose end passed is withdrawn as pools/unoffer withdraws one."""
    pool = pool_sql.get_pool(db, offer.pool_id)
    assert pool is not None
    return withdraw_offer(db, pool, offer.to_tenant_id, reason="expired")


async def unoffer_pool(store: Store, call: Call[PoolsUnoffer]) -> Unoffered:
    req = call.body

    def txn(db: Database) -> Unoffered:
        pool = call.pool  # owned, at the version asked (R3), decided in this transaction
        if req.to_tenant_id == pool.owner_tenant_id:
            raise InvalidInput("a pool cannot be unoffered from its owner", field="toTenantId")
        return Unoffered(removed=withdraw_offer(db, pool, req.to_tenant_id))

    return await store.write(txn)


async def set_quota(store: Store, call: Call[QuotasSet]) -> QuotaRows:
    """The owner sets a tenant's quota rows; quota.updated when a row changes (E1)."""
    req = call.body

    def txn(db: Database) -> QuotaRows:
        pool = call.pool  # owned, at the version asked (R3), decided in this transaction
        if pool.archived_at is not None:
            raise InvalidState("the pool is archived")
        target = req.for_tenant_id
        offered = {o.to_tenant_id for o in pool_sql.offers_of(db, pool.id)}
        if target != pool.owner_tenant_id and target not in offered:
            raise InvalidState("the pool is not offered to that tenant", field="forTenantId")
        at = now()
        changed, rows = grant(db, pool.id, target, dict(req.quota), at)
        if changed:
            events.append(
                db,
                "quota.updated",
                pool_id=pool.id,
                data={"forTenantId": target, "quota": changed},
                audience=[pool.owner_tenant_id, target],
            )
        answer = QuotaRows(items=[quota_row(r) for r in rows])
        warnings = coverage_warnings(db, pool.id, pool.owner_tenant_id)  # C5
        if warnings:
            answer.warnings = warnings
        return answer

    return await store.write(txn)
