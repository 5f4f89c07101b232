"""SQL for keyset pages (B1): the secret that seals list cursors, and pages merged from
several index ranges."""

import os
import secrets
import weakref
from collections.abc import Hashable, Sequence
from typing import Any

from controlplane.storage.rows import rows
from controlplane.storage.sql import Database, PostgresDatabase

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
    """The secret list cursors are sealed with (services/paging.py): read once per process
    for each database (``identity``), then remembered for the connection too."""
    known = _BY_CONNECTION.get(db)
    if known is None:
        where = identity(db)
        known = _BY_DATABASE.get(where) if where is not None else None
        if known is None:
            known = bytes(db.execute("SELECT key FROM cursor_key WHERE id = 1").fetchone()[0])
            if where is not None:
                _BY_DATABASE[where] = known
        _BY_CONNECTION[db] = known
    return known


def identity(db: Database) -> Hashable | None:
    """Which database ``db`` is connected to: a PostgreSQL server's database, or a SQLite
    file (its device and inode, whatever path reached it); None for a database without a
    file (in memory), whose key is then read on each connection."""
    if isinstance(db, PostgresDatabase):
        info = db.borrowed().info
        return ("postgresql", info.host, info.port, info.dbname)
    file = next((row[2] for row in db.execute("PRAGMA database_list") if row[1] == "main"), "")
    if not file:
        return None
    found = os.stat(file)
    return ("sqlite", found.st_dev, found.st_ino)


# The cursor key of each database this process opened, and of each connection it has seen
# (a connection asks no identity again); the key of a database never changes (B4).
_BY_DATABASE: dict[Hashable, bytes] = {}
_BY_CONNECTION: "weakref.WeakKeyDictionary[Database, bytes]" = weakref.WeakKeyDictionary()


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
