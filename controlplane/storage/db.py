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

import sqlite_utils

from controlplane.storage.migrations import migrate

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


def connect(path: Path, durability: Durability = "full") -> sqlite_utils.Database:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute(f"PRAGMA synchronous = {SYNCHRONOUS[durability]}")
    conn.execute("PRAGMA foreign_keys = ON")
    conn.execute("PRAGMA busy_timeout = 5000")
    return sqlite_utils.Database(conn)


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
def savepoint(db: sqlite_utils.Database) -> Iterator[None]:
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
    """The database of one control plane: a writer and a reader on one file."""

    def __init__(self, path: Path, durability: Durability = "full") -> None:
        self.path = path
        _private_files(path)
        self._writer_db = connect(path, durability)
        migrate(self._writer_db)
        self.reader = connect(path, durability)
        _private_files(path)  # the -wal and -shm files SQLite made beside it
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        self._gate: Callable[[sqlite_utils.Database], None] | None = None

    def gated(self, gate: Callable[[sqlite_utils.Database], None]) -> "Store":
        """This store as one API method uses it: each of its transactions first runs ``gate``
        (the method's IAM decision, R1), so the decision and the change see one state."""
        view = copy.copy(self)  # the same connections and writer thread
        view._gate = gate
        return view

    @contextmanager
    def snapshot(self) -> Iterator[sqlite_utils.Database]:
        """A read transaction: every statement inside sees the same committed state."""
        self.reader.execute("BEGIN")
        try:
            yield self.reader
        finally:
            self.reader.execute("COMMIT")

    def transact(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        """Run ``fn`` in one ``BEGIN IMMEDIATE`` transaction on the calling thread."""
        db = self._writer_db
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

    async def write(self, fn: Callable[[sqlite_utils.Database], T]) -> T:
        """Run the mutation ``fn`` on the writer thread, in one transaction."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._writer, self.transact, fn)

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._writer_db.conn.close()
        self.reader.conn.close()
