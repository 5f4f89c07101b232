"""SQL for keyset pages (B1): the secret that seals list cursors, and pages merged from
several index ranges."""

import secrets
from collections.abc import Sequence
from typing import Any

from controlplane.storage.rows import rows
from controlplane.storage.sql import Database

# SQLite's cap on the SELECTs of one compound statement (SQLITE_MAX_COMPOUND_SELECT's default).
MAX_ARMS = 500


def make_cursor_key(db: Database) -> None:
    """The database's cursor key, 32 random bytes, made once when absent: by the first store
    to start on it; every replica of a PostgreSQL database reads the same row (B4)."""
    db.execute(
        "INSERT INTO cursor_key (id, key) VALUES (1, ?) ON CONFLICT (id) DO NOTHING",
        [secrets.token_bytes(32)],
    )


def cursor_key(db: Database) -> bytes:
    """The secret list cursors are sealed with (services/paging.py): one primary-key read."""
    return bytes(db.execute("SELECT key FROM cursor_key WHERE id = 1").fetchone()[0])


def merged(
    db: Database, arms: Sequence[tuple[str, Sequence[Any]]], limit: int
) -> list[dict[str, Any]]:
    """B1: the first ``limit`` rows, in id order, of several keyset arms (``SELECT * … WHERE
    <an index range ending in id > ?>`` and its parameters), each read only as far as the page
    needs and nothing sorted. SQLite merges the plain arms (MERGE); PostgreSQL merges arms
    that each stop at the limit (Merge Append), as it would append plain ones and sort them
    whole. More arms than one statement takes are read a statement per batch and merged here."""
    limited = db.dialect.name == "postgresql"
    found: list[dict[str, Any]] = []
    for start in range(0, len(arms), MAX_ARMS):
        selects: list[str] = []
        params: list[Any] = []
        for n, (arm, args) in enumerate(arms[start : start + MAX_ARMS]):
            params += args
            if limited:
                arm = f"SELECT * FROM ({arm} ORDER BY id LIMIT ?) AS s{n}"
                params.append(limit)
            selects.append(arm)
        found += rows(db, " UNION ALL ".join(selects) + " ORDER BY id LIMIT ?", [*params, limit])
    return sorted(found, key=lambda row: row["id"])[:limit] if len(arms) > MAX_ARMS else found
