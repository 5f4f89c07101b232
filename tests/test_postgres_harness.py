"""The PostgreSQL test harness (DESIGN §10, B3): the real server the PostgreSQL backend's tests run on."""

import os
import sqlite3
import subprocess
from pathlib import Path

import psutil
import psycopg
import pytest

from tests.postgres import (
    OWNER_FILE,
    PREFIX,
    SUPERUSER,
    PostgresServer,
    PostgresUnavailable,
    sweep_stale,
)


def test_server_runs_as_an_unprivileged_user(postgres_server: PostgresServer) -> None:
    """B3: initdb/postgres refuse root, so as root the cluster belongs to an unprivileged user."""
    postmaster = psutil.Process(postgres_server.postmaster_pid())
    assert postmaster.uids().real != 0
    assert postmaster.uids().effective != 0
    assert postmaster.username() == postgres_server.os_user
    if os.geteuid() == 0:
        assert postgres_server.uid != 0
    else:
        assert postgres_server.uid == os.geteuid()
    with psycopg.connect(postgres_server.url()) as conn:
        backend = conn.execute("SELECT pg_backend_pid()").fetchone()
        assert backend is not None
        assert psutil.Process(backend[0]).uids().effective == postgres_server.uid


def test_server_listens_on_loopback_only(postgres_server: PostgresServer) -> None:
    """B3: the test server (trust auth) is reachable on 127.0.0.1 only, on its own port."""
    with psycopg.connect(postgres_server.url()) as conn:
        row = conn.execute("SHOW listen_addresses").fetchone()
        assert row == ("127.0.0.1",)
        assert conn.execute("SHOW port").fetchone() == (str(postgres_server.port),)
    listening = {
        c.laddr.ip
        for c in psutil.net_connections(kind="inet")
        if c.status == psutil.CONN_LISTEN and c.laddr.port == postgres_server.port
    }
    assert listening == {"127.0.0.1"}


def test_each_postgres_url_is_a_different_empty_database(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    """B3: every test gets its own fresh, empty database."""
    other = postgres_server.new_database()
    try:
        assert other != postgres_url
        names = set()
        for url in (postgres_url, other):
            assert url.startswith(f"postgresql://{SUPERUSER}@127.0.0.1:{postgres_server.port}/")
            with psycopg.connect(url) as conn:
                row = conn.execute("SELECT current_database()").fetchone()
                assert row is not None
                names.add(row[0])
                tables = conn.execute(
                    "SELECT count(*) FROM information_schema.tables"
                    " WHERE table_schema NOT IN ('pg_catalog', 'information_schema')"
                ).fetchone()
                assert tables == (0,)
        assert len(names) == 2
        with psycopg.connect(postgres_url) as conn:
            conn.execute("CREATE TABLE mine (id TEXT PRIMARY KEY)")
        with psycopg.connect(other) as conn:
            seen = conn.execute("SELECT to_regclass('public.mine')").fetchone()
            assert seen == (None,)
    finally:
        postgres_server.drop_database(other)
    with psycopg.connect(postgres_server.url()) as conn:
        gone = conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", (other.rsplit("/", 1)[-1],)
        ).fetchone()
        assert gone == (0,)


def test_a_connection_creates_inserts_and_reads_back(postgres_url: str) -> None:
    """B3: psycopg 3 reaches the test database and a write is read back after commit."""
    with psycopg.connect(postgres_url) as conn:
        conn.execute("CREATE TABLE pools (id TEXT PRIMARY KEY, gpus INTEGER NOT NULL)")
        conn.execute("INSERT INTO pools VALUES (%s, %s), (%s, %s)", ("p2", 8, "p1", 4))
    with psycopg.connect(postgres_url) as conn:
        rows = conn.execute("SELECT id, gpus FROM pools ORDER BY id").fetchall()
    assert rows == [("p1", 4), ("p2", 8)]


def test_collation_is_c_so_order_matches_sqlite(postgres_url: str) -> None:
    """B3: the cluster is C-collated, so ORDER BY on text ids sorts like SQLite's BINARY."""
    words = ["b", "B", "a", "_x", "Z", "01", "é", "e", "a-b", "a_b", "ab"]
    with psycopg.connect(postgres_url) as conn:
        info = conn.info
        if info.server_version < 160000:  # PostgreSQL 16 dropped the lc_collate setting
            assert conn.execute("SHOW lc_collate").fetchone() == ("C",)
        row = conn.execute(
            "SELECT datcollate, datctype, pg_encoding_to_char(encoding) FROM pg_database"
            " WHERE datname = current_database()"
        ).fetchone()
        assert row == ("C", "C", "UTF8")
        conn.execute("CREATE TABLE ids (id TEXT PRIMARY KEY)")
        for word in words:
            conn.execute("INSERT INTO ids VALUES (%s)", (word,))
        on_postgres = [r[0] for r in conn.execute("SELECT id FROM ids ORDER BY id").fetchall()]
    lite = sqlite3.connect(":memory:")
    try:
        lite.execute("CREATE TABLE ids (id TEXT PRIMARY KEY)")
        lite.executemany("INSERT INTO ids VALUES (?)", [(w,) for w in words])
        on_sqlite = [r[0] for r in lite.execute("SELECT id FROM ids ORDER BY id").fetchall()]
    finally:
        lite.close()
    assert on_postgres == on_sqlite == sorted(words, key=lambda w: w.encode())


def test_a_template_database_is_copied_per_test(postgres_server: PostgresServer) -> None:
    """B3: a database prepared once (say, migrated) is handed out as fresh copies."""

    def build(url: str) -> None:
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
            conn.execute("INSERT INTO schema_version VALUES (7)")

    template = postgres_server.template("harness-selftest", build)
    assert postgres_server.template("harness-selftest", build) == template  # built once
    with postgres_server.database(template) as first, postgres_server.database(template) as second:
        assert first != second
        with psycopg.connect(first) as conn:
            conn.execute("UPDATE schema_version SET version = 8")
        with psycopg.connect(second) as conn:
            assert conn.execute("SELECT version FROM schema_version").fetchone() == (7,)


def test_missing_binaries_fail_with_a_clear_message(tmp_path: Path) -> None:
    """B3: without PostgreSQL the harness says what is missing instead of skipping."""
    server = PostgresServer(bindir=tmp_path / "no-postgres-here")
    with pytest.raises(PostgresUnavailable, match="initdb"):
        server.start()
    assert server.base is None  # its temporary directory is gone


def test_clusters_of_dead_test_processes_are_swept(tmp_path: Path) -> None:
    """B3: a cluster left by a killed test run is removed by the next one; a live one is kept."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f"{PREFIX}stale"
    live = tmp_path / f"{PREFIX}live"
    foreign = tmp_path / f"{PREFIX}foreign"
    for path, owner in ((stale, dead.pid), (live, os.getpid())):
        (path / "data").mkdir(parents=True)
        (path / OWNER_FILE).write_text(f"{owner}\n")
    foreign.mkdir()
    sweep_stale(tmp_path)
    assert not stale.exists()
    assert live.exists()
    assert foreign.exists()


def test_reset_empties_tables_in_place(postgres_server: PostgresServer, postgres_url: str) -> None:
    """B3: the in-place reset (the alternative to a new database) empties tables, keeps the
    schema version, restarts sequences and ends sessions still on the database."""
    with psycopg.connect(postgres_url) as conn:
        conn.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO schema_version VALUES (3)")
        conn.execute("CREATE TABLE parents (id BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY)")
        conn.execute("CREATE TABLE children (parent BIGINT NOT NULL REFERENCES parents(id))")
        conn.execute("INSERT INTO parents DEFAULT VALUES")
        conn.execute("INSERT INTO children VALUES (1)")
    leftover = psycopg.connect(postgres_url, autocommit=True)
    leftover.execute("SELECT pg_advisory_lock(42)")
    postgres_server.reset_database(postgres_url)
    with pytest.raises(psycopg.OperationalError):
        leftover.execute("SELECT 1")
    leftover.close()
    with psycopg.connect(postgres_url) as conn:
        assert conn.execute("SELECT count(*) FROM children").fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM parents").fetchone() == (0,)
        assert conn.execute("SELECT version FROM schema_version").fetchone() == (3,)
        assert conn.execute("INSERT INTO parents DEFAULT VALUES RETURNING id").fetchone() == (1,)
        assert conn.execute("SELECT pg_try_advisory_lock(42)").fetchone() == (True,)
