"""The SQLite database: WAL, foreign keys, one writer thread, reads on the caller's thread.

Every mutation is a plain synchronous function ``fn(db)`` run by the single
writer inside ``BEGIN IMMEDIATE`` and committed as a whole, events included;
nothing awaits inside a transaction. Reads use a second connection, which WAL
lets run beside the writer.
"""

import asyncio
import copy
import os
import sqlite3
import stat
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Literal, TypeVar

from controlplane.storage.migrations import migrate
from controlplane.storage.sql import Database, PostgresDatabase, SqliteDatabase

T = TypeVar("T")


def timestamp(epoch: float) -> str:
    """A time as the API shows it: ISO 8601, UTC, milliseconds (``2026-11-30T13:04:10.123Z``)."""
    moment = datetime.fromtimestamp(epoch, UTC)
    return moment.isoformat(timespec="milliseconds").replace("+00:00", "Z")


def epoch(at: str) -> float:
    """A time as the API shows it, back to seconds since the epoch."""
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def now() -> str:
    """The current time as the API shows it."""
    return timestamp(time.time())


# R7: "full" syncs the WAL at every commit, so an acknowledged write survives a power loss;
# "relaxed" (synchronous=NORMAL) syncs only at checkpoints: a crash of the process loses
# nothing, a power loss may lose the last commits. bench/durability.py measures the cost.
Durability = Literal["full", "relaxed"]
SYNCHRONOUS: dict[Durability, str] = {"full": "FULL", "relaxed": "NORMAL"}
PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700


# Every mutation takes this transaction-level lock first on PostgreSQL, so mutations from
# every replica are one serial order, as SQLite's single writer makes them (B5): quotas
# never over-admitted, one object per idempotency key, a gapless event seq.
WRITER_LOCK = 0x6263_7772  # "bcwr"


def is_postgres(location: str | Path) -> bool:
    return str(location).startswith(("postgresql://", "postgres://"))


def connect(location: str | Path, durability: Durability = "full") -> Database:
    """A connection in autocommit mode (transactions are explicit) to a SQLite file or a
    PostgreSQL URL (its password from PGPASSWORD or ~/.pgpass, never the command line)."""
    if is_postgres(location):
        import psycopg

        pg = psycopg.connect(str(location), autocommit=True)
        if durability == "relaxed":
            pg.execute("SET synchronous_commit = off")
        return PostgresDatabase(pg)
    conn = sqlite3.connect(location, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[durability]}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA busy_timeout = 5000")
    return SqliteDatabase(conn)


def _private_files(path: Path) -> None:
    """R7: the database and its -wal/-shm files 0600 and their directory 0700, whatever the
    umask. An existing directory is tightened when this process owns it and it is not a
    shared one (sticky, like /tmp): a directory the operator shares stays as they made it."""
    directory = path.parent
    directory.mkdir(parents=True, exist_ok=True, mode=PRIVATE_DIR)
    found = directory.stat()
    if (
        found.st_uid == os.geteuid()
        and not found.st_mode & stat.S_ISVTX
        and stat.S_IMODE(found.st_mode) != PRIVATE_DIR
    ):
        directory.chmod(PRIVATE_DIR)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, PRIVATE_FILE))
    for file in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        if file.exists() and file.stat().st_mode & 0o777 != PRIVATE_FILE:
            file.chmod(PRIVATE_FILE)


@contextmanager
def savepoint(db: Database) -> Iterator[None]:
    """A nested transaction: on an exception, what it wrote is undone and the exception goes
    on, while the enclosing transaction and what it wrote before stay (R5)."""
    db.execute("SAVEPOINT unit")
    try:
        yield
    except BaseException:
        db.execute("ROLLBACK TO unit")
        db.execute("RELEASE unit")
        raise
    db.execute("RELEASE unit")


class Store:
    """The database of one control plane: a writer and a reader, on a SQLite file or a
    PostgreSQL database that several replicas share (B3, B4)."""

    def __init__(self, location: str | Path, durability: Durability = "full") -> None:
        self.location = location
        self.postgres = is_postgres(location)
        self.path = Path(location)  # the SQLite file (meaningless for PostgreSQL)
        if not self.postgres:
            _private_files(self.path)
        self._writer_db = connect(location, durability)
        migrate(self._writer_db)
        self.reader = connect(location, durability)
        if not self.postgres:
            _private_files(self.path)  # the -wal and -shm files SQLite made beside it
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        self._gate: Callable[[Database], None] | None = None

    def gated(self, gate: Callable[[Database], None]) -> "Store":
        """This store as one API method uses it: each of its transactions first runs ``gate``
        (the method's IAM decision, R1), so the decision and the change see one state."""
        view = copy.copy(self)  # the same connections and writer thread
        view._gate = gate
        return view

    @contextmanager
    def snapshot(self) -> Iterator[Database]:
        """A read transaction: every statement inside sees the same committed state."""
        self.reader.execute(
            "BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if self.postgres else "BEGIN"
        )
        try:
            yield self.reader
        finally:
            self.reader.execute("COMMIT")

    def transact(self, fn: Callable[[Database], T]) -> T:
        """Run ``fn`` in one transaction on the calling thread: ``BEGIN IMMEDIATE`` on
        SQLite, ``BEGIN`` and the writer lock on PostgreSQL."""
        db = self._writer_db
        if self.postgres:
            db.execute("BEGIN")
            db.execute("SELECT pg_advisory_xact_lock(?)", [WRITER_LOCK])
        else:
            db.execute("BEGIN IMMEDIATE")
        try:
            if self._gate is not None:
                self._gate(db)
            result = fn(db)
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        return result

    async def write(self, fn: Callable[[Database], T]) -> T:
        """Run the mutation ``fn`` on the writer thread, in one transaction."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, self.transact, fn)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._writer_db.close()
        self.reader.close()
