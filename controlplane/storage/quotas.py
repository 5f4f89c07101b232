"""SQL for quota rows: a tenant's maximum of a resource on a pool, and what it uses."""

from collections.abc import Iterable, Sequence
from typing import Any

from controlplane.storage.ledger_types import QuotaRow
from controlplane.storage.rows import one, rows
from controlplane.storage.sql import Database


def quota(db: Database, pool_id: str, tenant_id: str, resource: str) -> QuotaRow | None:
    found = one(
        db,
        "SELECT * FROM quotas WHERE pool_id = ? AND tenant_id = ? AND resource = ?",
        [pool_id, tenant_id, resource],
    )
    return None if found is None else QuotaRow.from_row(found)


def quota_rows(
    db: Database, tenant_id: str, pool_ids: Iterable[str] | None = None
) -> list[QuotaRow]:
    """The tenant's quota rows, on the given pools or on all of them."""
    sql = "SELECT * FROM quotas WHERE tenant_id = ?"
    params: list[Any] = [tenant_id]
    if pool_ids is not None:
        ids = list(pool_ids)
        if not ids:
            return []
        sql += f" AND pool_id IN ({', '.join('?' * len(ids))})"
        params.extend(ids)
    return [QuotaRow.from_row(row) for row in rows(db, sql + " ORDER BY pool_id, resource", params)]


def pool_quota_rows(db: Database, pool_ids: Sequence[str]) -> list[QuotaRow]:
    """Every tenant's quota rows on several pools, in one read."""
    if not pool_ids:
        return []
    found = rows(
        db,
        f"SELECT * FROM quotas WHERE pool_id IN ({', '.join('?' * len(pool_ids))}) "
        "ORDER BY pool_id, tenant_id, resource",
        list(pool_ids),
    )
    return [QuotaRow.from_row(row) for row in found]


def quota_figures(
    db: Database, tenant_id: str, after: str, through: str
) -> list[tuple[str, str, int, int]]:
    """The tenant's quota rows on pools after ``after`` up to ``through``, as ``(pool_id,
    resource, max, used)`` in that order: a page of pools/list's figures, by position (a walk
    of the tenant's quotas index)."""
    found: list[tuple[str, str, int, int]] = db.execute(
        "SELECT pool_id, resource, max, used FROM quotas "
        "WHERE tenant_id = ? AND pool_id > ? AND pool_id <= ? ORDER BY pool_id, resource",
        [tenant_id, after, through],
    ).fetchall()
    return found


def visible_quota_rows(
    db: Database, tenant_id: str, pool_id: str | None, after: tuple[str, str], limit: int
) -> list[QuotaRow]:
    """B1: the tenant's quota rows on pools it has an authz row for (owned, or offered and not
    archived), in (pool, resource) order after ``after``, at most ``limit``: a walk of the
    tenant's quotas index from the cursor."""
    sql = (
        "SELECT q.* FROM quotas q JOIN pool_authz a "
        "ON a.tenant_id = q.tenant_id AND a.pool_id = q.pool_id "
        "WHERE q.tenant_id = ? AND (q.pool_id, q.resource) > (?, ?)"
    )
    params: list[Any] = [tenant_id, *after]
    if pool_id is not None:
        sql += " AND q.pool_id = ?"
        params.append(pool_id)
    found = rows(db, sql + " ORDER BY q.pool_id, q.resource LIMIT ?", [*params, limit])
    return [QuotaRow.from_row(row) for row in found]


def put_quota(
    db: Database, pool_id: str, tenant_id: str, resource: str, maximum: int, at: str
) -> None:
    """Store a row's max; a new row starts with nothing used."""
    db.execute(
        "INSERT INTO quotas (pool_id, tenant_id, resource, max, used, updated_at) "
        "VALUES (?, ?, ?, ?, 0, ?) ON CONFLICT (pool_id, tenant_id, resource) "
        "DO UPDATE SET max = excluded.max, updated_at = excluded.updated_at",
        [pool_id, tenant_id, resource, maximum, at],
    )


def zero_quotas(db: Database, pool_id: str, tenant_id: str, at: str) -> None:
    db.execute(
        "UPDATE quotas SET max = 0, updated_at = ? WHERE pool_id = ? AND tenant_id = ?",
        [at, pool_id, tenant_id],
    )


def set_used(db: Database, pool_id: str, tenant_id: str, resource: str, used: int, at: str) -> None:
    """Store a row's ``used`` as given (the rule that computes it lives in capacity)."""
    db.execute(
        "UPDATE quotas SET used = ?, updated_at = ? "
        "WHERE pool_id = ? AND tenant_id = ? AND resource = ?",
        [used, at, pool_id, tenant_id, resource],
    )


def offered_maxima(db: Database, pool_id: str, owner: str) -> dict[str, int]:
    """H6 offered: per resource, the quota maxima of every tenant but the owner."""
    found = db.execute(
        "SELECT resource, CAST(sum(max) AS BIGINT) FROM quotas WHERE pool_id = ? AND tenant_id != ? "
        "GROUP BY resource",
        [pool_id, owner],
    ).fetchall()
    return {resource: int(total) for resource, total in found}
