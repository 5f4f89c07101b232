"""SQL for tenants and credentials."""

from controlplane.storage.ledger_types import CredentialRow, TenantRow
from controlplane.storage.rows import one
from controlplane.storage.sql import Database


def get_tenant(db: Database, tenant_id: str) -> TenantRow | None:
    """A live (not deleted) tenant."""
    found = one(db, "SELECT * FROM tenants WHERE id = ? AND deleted_at IS NULL", [tenant_id])
    return None if found is None else TenantRow.from_row(found)


def tenant_id_taken(db: Database, tenant_id: str) -> bool:
    return db.execute("SELECT 1 FROM tenants WHERE id = ?", [tenant_id]).fetchone() is not None


def insert_tenant(
    db: Database, tenant_id: str, parent_id: str | None, name: str | None, at: str
) -> None:
    db.execute(
        "INSERT INTO tenants (id, parent_id, name, created_at) VALUES (?, ?, ?, ?)",
        [tenant_id, parent_id, name, at],
    )


def live_children(db: Database, tenant_id: str) -> list[str]:
    rows = db.execute(
        "SELECT id FROM tenants WHERE parent_id = ? AND deleted_at IS NULL ORDER BY id",
        [tenant_id],
    )
    return [row[0] for row in rows]


def mark_tenant_deleted(db: Database, tenant_id: str, at: str) -> None:
    db.execute("UPDATE tenants SET deleted_at = ? WHERE id = ?", [at, tenant_id])


def insert_credential(
    db: Database,
    credential_id: str,
    tenant_id: str,
    name: str | None,
    hashed: bytes,
    statements: str | None,
    at: str,
) -> None:
    db.execute(
        "INSERT INTO credentials (id, tenant_id, name, token_hash, statements, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [credential_id, tenant_id, name, hashed, statements, at],
    )


def credential_by_hash(db: Database, hashed: bytes) -> CredentialRow | None:
    """A live credential of a live tenant."""
    row = db.execute(
        "SELECT c.id, c.tenant_id, c.statements FROM credentials c "
        "JOIN tenants t ON t.id = c.tenant_id "
        "WHERE c.token_hash = ? AND c.revoked_at IS NULL AND t.deleted_at IS NULL",
        [hashed],
    ).fetchone()
    return None if row is None else CredentialRow.of(row)


def revoke_credential(db: Database, tenant_id: str, credential_id: str, at: str) -> int:
    """Revoke one live credential; returns how many were revoked (0 or 1)."""
    return db.execute(
        "UPDATE credentials SET revoked_at = ? WHERE id = ? AND tenant_id = ? AND revoked_at IS NULL",
        [at, credential_id, tenant_id],
    ).rowcount


def credential_exists(db: Database, tenant_id: str, credential_id: str) -> bool:
    row = db.execute(
        "SELECT 1 FROM credentials WHERE id = ? AND tenant_id = ?", [credential_id, tenant_id]
    ).fetchone()
    return row is not None


def revoke_all(db: Database, tenant_id: str, at: str) -> int:
    return db.execute(
        "UPDATE credentials SET revoked_at = ? WHERE tenant_id = ? AND revoked_at IS NULL",
        [at, tenant_id],
    ).rowcount
