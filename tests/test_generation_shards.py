"""B5, F10 on PostgreSQL's generations: a scope's generation moves once per transaction that
writes it, on a shard no other transaction holds, so that writers side by side (replicas'
own-row writers, whatever their backend pids) never wait on each other's commits for it."""

from collections.abc import Iterator

import psycopg
import pytest

from controlplane.storage.db import Store
from controlplane.storage.migrations import GENERATION_SHARDS


@pytest.fixture
def migrated(postgres_url: str) -> Iterator[str]:
    Store(postgres_url).close()  # migrates the empty database
    yield postgres_url


def catalog(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT sum(n) FROM generations WHERE scope = 'catalog'").fetchone()
        assert row is not None
        return int(row[0])


def tenant(conn: psycopg.Connection, name: str) -> None:
    conn.execute("INSERT INTO tenants (id, created_at) VALUES (%s, 'now')", [name])


def test_b5_a_transaction_moves_a_generation_once_however_many_rows_it_writes(
    migrated: str,
) -> None:
    """Three rows of one scope in one transaction move its generation by one; a savepoint
    rolled back takes its move back with its row, and the next row written moves it again."""
    before = catalog(migrated)
    with psycopg.connect(migrated, autocommit=False) as conn:
        for name in ("a", "b", "c"):
            tenant(conn, name)
        conn.commit()
    assert catalog(migrated) == before + 1
    with psycopg.connect(migrated, autocommit=False) as conn:
        conn.execute("SAVEPOINT step")
        tenant(conn, "undone")
        conn.execute("ROLLBACK TO step")
        tenant(conn, "d")
        conn.commit()
    assert catalog(migrated) == before + 2


def test_f10_a_writer_whose_shard_another_transaction_holds_moves_another_without_waiting(
    migrated: str,
) -> None:
    """A session whose shard (its backend pid's) another open transaction holds moves a free
    shard instead, at once (a wait would pass the lock timeout), and the generation moves by
    one when it commits, while the other transaction still holds its row."""
    before = catalog(migrated)
    with (
        psycopg.connect(migrated, autocommit=False) as writer,
        psycopg.connect(migrated, autocommit=False) as holder,
    ):
        pid = writer.execute("SELECT pg_backend_pid()").fetchone()
        assert pid is not None
        writer.rollback()
        holder.execute(
            "SELECT n FROM generations WHERE scope = 'catalog' AND shard = %s FOR UPDATE",
            [pid[0] % GENERATION_SHARDS],
        )
        writer.execute("SET LOCAL lock_timeout = '2s'")
        tenant(writer, "beside")
        tenant(writer, "beside-too")
        writer.commit()
        assert catalog(migrated) == before + 1
        holder.rollback()
