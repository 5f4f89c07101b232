"""Storage: one transaction per mutation with its event, migrations, and a crash mid-write."""

import sqlite3
from pathlib import Path

import pytest

from controlplane.storage import events
from controlplane.storage.db import Store
from controlplane.storage.migrations import MIGRATIONS
from controlplane.storage.sql import Database


def test_a_failed_mutation_leaves_no_row_no_event_and_no_seq_gap(tmp_path: Path) -> None:
    """E1: a mutation that fails after writing rolls back its rows and its event together."""
    store = Store(tmp_path / "db")

    def first(db: Database) -> None:
        db.execute("INSERT INTO tenants (id, created_at) VALUES ('a', 'now')")
        events.append(db, "tenant.created", pool_id=None, data={}, audience=["a"])

    def crashes(db: Database) -> None:
        db.execute("INSERT INTO tenants (id, created_at) VALUES ('b', 'now')")
        events.append(db, "tenant.created", pool_id=None, data={}, audience=["b"])
        raise RuntimeError("power cut")

    store.transact(first)
    with pytest.raises(RuntimeError):
        store.transact(crashes)
    store.transact(lambda db: events.append(db, "x.y", pool_id=None, data={}, audience=[]))
    store.close()
    conn = sqlite3.connect(tmp_path / "db")
    assert conn.execute("SELECT id FROM tenants").fetchall() == [("a",)]
    assert conn.execute("SELECT seq, type FROM events").fetchall() == [
        (1, "tenant.created"),
        (2, "x.y"),
    ]
    conn.close()


def test_migrations_apply_once_with_wal_and_foreign_keys(tmp_path: Path) -> None:
    """Numbered migrations run at start and not again; WAL and foreign keys are on."""
    Store(tmp_path / "db").close()
    store = Store(tmp_path / "db")
    assert store.reader.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    assert store.reader.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with pytest.raises(sqlite3.IntegrityError):
        store.transact(
            lambda db: db.execute(
                "INSERT INTO sites VALUES ('s', 'ghost', 'n', 'r', 'custom', 'now')"
            )
        )
    store.close()
