"""Quota rows and what is "in use" on them (O2, O6, A1, R6).

A row's ``used`` follows every live reservation from admission on, pending ones
included, so admission never over-admits. "In use", which an offer's new
maximum is raised to and an unoffer or archive drops the maximum to, counts
placed and active reservations only (R6): pending ones about to fail with
PoolGone must not keep quota the owner never granted again.
"""

from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.sql import Database


def grant(
    db: Database, pool_id: str, tenant_id: str, quota: dict[str, int], at: str
) -> dict[str, int]:
    """Set the tenant's maxima, each raised to what is in use (O2); returns the rows that
    changed, with their stored maxima."""
    in_use = res_sql.in_use(db, pool_id, tenant_id)
    current = {row["resource"]: row["max"] for row in pool_sql.quota_rows(db, tenant_id, [pool_id])}
    changed = {}
    for resource, asked in quota.items():
        maximum = max(asked, in_use.get(resource, 0))
        if current.get(resource) != maximum:
            pool_sql.put_quota(db, pool_id, tenant_id, resource, maximum, at)
            changed[resource] = maximum
    return changed


def drop_to_in_use(db: Database, pool_id: str, tenant_id: str, at: str) -> None:
    """O6, A1, R6: every row of the tenant's on the pool drops to what placed and active
    reservations hold."""
    in_use = res_sql.in_use(db, pool_id, tenant_id)
    for row in pool_sql.quota_rows(db, tenant_id, [pool_id]):
        maximum = in_use.get(row["resource"], 0)
        if row["max"] != maximum:
            pool_sql.put_quota(db, pool_id, tenant_id, row["resource"], maximum, at)
