"""Quota rows and what is "in use" on them (O2, O6, A1, R6); quotas.list (B1).

A row's ``used`` follows every live reservation from admission on, pending ones
included, so admission never over-admits. "In use", which an offer's new
maximum is raised to and an unoffer or archive drops the maximum to, counts
placed and active reservations only (R6): pending ones about to fail with
PoolGone must not keep quota the owner never granted again.
"""

from msgspec import UNSET

from controlplane.services.access import readable_pools
from controlplane.services.call import Call
from controlplane.services.paging import page, position, scope
from controlplane.services.views import quota_row
from controlplane.storage import pools as pool_sql
from controlplane.storage import quotas as quota_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.ledger_types import QuotaRow
from controlplane.storage.sql import Database
from shared.errors import NotFound
from shared.schemas import QuotaList, QuotasList


def grant(
    db: Database, pool_id: str, tenant_id: str, quota: dict[str, int], at: str
) -> tuple[dict[str, int], list[QuotaRow]]:
    """Set the tenant's maxima, each raised to what is in use (O2). Returns the rows that
    changed, with their stored maxima, and every row of the tenant's on the pool as it now
    stands, in resource order (what quota_rows would read back)."""
    in_use = res_sql.in_use(db, pool_id, tenant_id)
    rows = {row.resource: row for row in quota_sql.quota_rows(db, tenant_id, [pool_id])}
    changed = {}
    for resource, asked in quota.items():
        maximum = max(asked, in_use.get(resource, 0))
        row = rows.get(resource)
        if row is None or row.max != maximum:
            quota_sql.put_quota(db, pool_id, tenant_id, resource, maximum, at)
            changed[resource] = maximum
            rows[resource] = QuotaRow(
                pool_id=pool_id,
                tenant_id=tenant_id,
                resource=resource,
                max=maximum,
                used=0 if row is None else row.used,
                updated_at=at,
            )
    return changed, [rows[resource] for resource in sorted(rows)]


def drop_to_in_use(db: Database, pool_id: str, tenant_id: str, at: str) -> None:
    """O6, A1, R6: every row of the tenant's on the pool drops to what placed and active
    reservations hold."""
    in_use = res_sql.in_use(db, pool_id, tenant_id)
    for row in quota_sql.quota_rows(db, tenant_id, [pool_id]):
        maximum = in_use.get(row.resource, 0)
        if row.max != maximum:
            quota_sql.put_quota(db, pool_id, tenant_id, row.resource, maximum, at)


def coverage(schedulable: int, offered: int) -> float | None:
    """C5: schedulable ÷ offered; None when nothing is offered, 0 when nothing is
    schedulable; under 1 the resource is oversold."""
    return None if offered == 0 else schedulable / offered


def oversold(offered: dict[str, int], schedulable: dict[str, int]) -> list[str]:
    """C5: a warning for each resource whose offered maxima exceed its schedulable capacity."""
    return [
        f"quota {resource}: {amount} offered over {schedulable.get(resource, 0)} schedulable"
        for resource, amount in sorted(offered.items())
        if amount > schedulable.get(resource, 0)
    ]


def coverage_warnings(db: Database, pool_id: str, owner: str) -> list[str]:
    """C5: what pools/offer and quotas/set warn of, as the pool stands after the change."""
    schedulable = {row.resource: row.schedulable for row in pool_sql.capacity_ledger(db, pool_id)}
    return oversold(quota_sql.offered_maxima(db, pool_id, owner), schedulable)


def list_quotas(db: Database, call: Call[QuotasList]) -> QuotaList:
    """The caller tenant's own rows on pools it can still see, in (pool, resource) order, a
    page at a time (B1); the cursor moves past the rows of pools the credential may not read
    (R1). A poolId the tenant cannot see is NOT_FOUND."""
    principal, req = call.principal, call.body
    action = "compute:quotas:read"
    pool_id = None if req.pool_id is UNSET else req.pool_id
    if pool_id is not None and (
        not pool_sql.authz_row_exists(db, req.tenant_id, pool_id)
        or not readable_pools(db, principal, req.tenant_id, {pool_id}, action)
    ):
        raise NotFound("pool not found", field="poolId")
    pool, _, resource = position(db, scope("quotas", req), req.cursor).partition("/")
    found, cursor = page(
        db,
        scope("quotas", req),
        quota_sql.visible_quota_rows(db, req.tenant_id, pool_id, (pool, resource), req.limit + 1),
        req.limit,
        lambda row: f"{row.pool_id}/{row.resource}",
    )
    allowed = readable_pools(db, principal, req.tenant_id, {r.pool_id for r in found}, action)
    return QuotaList(
        items=[quota_row(r) for r in found if r.pool_id in allowed],
        next=cursor,
    )
