"""SQL for sites."""

from collections.abc import Mapping
from typing import Any

from controlplane.storage.ledger_types import SiteRow
from controlplane.storage.rows import one, rows
from controlplane.storage.sql import Database


def insert_site(db: Database, row: Mapping[str, Any]) -> None:
    db.execute(
        "INSERT INTO sites (id, owner_tenant_id, name, region, kind, created_at) "
        "VALUES (:id, :owner_tenant_id, :name, :region, :kind, :created_at)",
        row,
    )


def site_name_taken(db: Database, owner: str, name: str) -> bool:
    row = db.execute(
        "SELECT 1 FROM sites WHERE owner_tenant_id = ? AND name = ?", [owner, name]
    ).fetchone()
    return row is not None


def get_site(db: Database, site_id: str) -> SiteRow | None:
    found = one(db, "SELECT * FROM sites WHERE id = ?", [site_id])
    return None if found is None else SiteRow.from_row(found)


def list_sites(db: Database, owner: str, after: str, limit: int) -> list[SiteRow]:
    """B1: the owner's sites in id order after ``after``, at most ``limit`` (an index walk)."""
    found = rows(
        db,
        "SELECT * FROM sites WHERE owner_tenant_id = ? AND id > ? ORDER BY id LIMIT ?",
        [owner, after, limit],
    )
    return [SiteRow.from_row(row) for row in found]
