"""One connection as the storage functions use it, on either backend (B3).

Storage writes SQL once, with ``?`` placeholders, in the dialect the two
backends share (ANSI joins, ``ON CONFLICT`` upserts, ``RETURNING``, ``CASE``
instead of scalar ``max``). Where they differ, ``Dialect`` says how: a JSON
object's entries, the schema version, the DDL types. SQLite goes through
sqlite-utils; PostgreSQL through psycopg 3, whose placeholders this class
translates (``?`` → ``%s``) once per statement text.
"""

import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Protocol, TypeVar, cast

import sqlite_utils

from shared.errors import Unavailable


class Cursor(Protocol):
    """What storage reads off an executed statement (both drivers' cursors have it)."""

    @property
    def description(self) -> Any: ...

    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Any: ...


@dataclass(frozen=True)
class Dialect:
    """What differs between the backends' SQL."""

    name: str  # "sqlite" or "postgresql"

    def json_int_entries(self, column: str) -> str:
        """A FROM item over a JSON object of integers: rows ``(key, value)``."""
        if self.name == "postgresql":
            return f"jsonb_each_text({column}::jsonb) AS j(key, value)"
        return f"json_each({column}) AS j"

    def ddl(self, script: str) -> str:
        """A migration written for SQLite, in this backend's DDL."""
        if self.name != "postgresql":
            return script
        script = script.replace(" WITHOUT ROWID", "")
        script = re.sub(r"\bBLOB\b", "BYTEA", script)
        script = re.sub(r"\bREAL\b", "DOUBLE PRECISION", script)
        return re.sub(r"\bINTEGER\b", "BIGINT", script)


SQLITE, POSTGRESQL = Dialect("sqlite"), Dialect("postgresql")


Params = Sequence[Any] | Mapping[str, Any]  # ``?`` placeholders, or ``:name`` ones


class Contended(BaseException):
    """PostgreSQL ended the transaction to break a deadlock between concurrent writers: it
    wrote nothing, and runs again (storage/db.py). A BaseException, so that no step's
    savepoint takes it for that step's own failure (R5)."""


# What makes a SELECT more than a read: PostgreSQL's functions that take locks or send
# notices, a setting's change, and row locks (lost to a rollback to an earlier savepoint).
_NOT_A_READ = re.compile(
    r"\bpg_|\bset_config\b|\bFOR\s+(?:UPDATE|SHARE|NO\s+KEY|KEY)\b", re.IGNORECASE
)


def writes(sql: str) -> bool:
    """Whether a statement may change what a rollback to a savepoint undoes: anything but a
    plain read."""
    return not sql.startswith("SELECT ") or _NOT_A_READ.search(sql) is not None


class Database:
    """One connection: ``execute`` and ``executemany`` with ``?`` (or ``:name``) placeholders."""

    dialect: Dialect = SQLITE
    # The seq of the last event appended in the current transaction (0: none) and the tenants
    # its events are visible to, for the store to tell long-polls after the commit (B2).
    appended: int = 0
    audience: frozenset[str] = frozenset()
    # PostgreSQL: the events of the current transaction, inserted at its end (events.py
    # ``append``), by ``write_events`` once every other statement ran (B5).
    pending_events: list[tuple[Any, ...]]
    write_events: "Callable[[Database], list[int]] | None" = None
    # PostgreSQL: the node key of a mutation running beside others (db.py SERIAL_LOCK), or
    # None when it runs alone (SQLite: always).
    own_rows: str | None = None
    # In a group commit of own-row mutations: the pools its members read, by id. None changes
    # under the group: own-row mutations never write a pool, and on SQLite the group is the
    # one writer's transaction, on PostgreSQL it holds SERIAL_LOCK shared, which every other
    # mutation (a pool's among them) takes whole.
    pools_read: dict[str, Any] | None = None
    # The innermost savepoint while only reads ran since it was set, else None: a savepoint
    # asked for there is that one (db.py ``savepoint``), so a group member's reconcile costs
    # no SAVEPOINT and RELEASE of its own.
    clean_savepoint: str | None = None

    def execute(self, sql: str, params: Params = ()) -> Cursor:
        raise NotImplementedError

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        raise NotImplementedError

    def script(self, sql: str) -> None:
        """Several statements without parameters (a migration)."""
        raise NotImplementedError

    @property
    def in_transaction(self) -> bool:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class SqliteDatabase(Database):
    """SQLite through sqlite-utils, in autocommit mode: transactions are explicit."""

    dialect = SQLITE

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.utils = sqlite_utils.Database(conn)
        self.conn = conn

    def execute(self, sql: str, params: Params = ()) -> Cursor:
        if self.clean_savepoint is not None and writes(sql):
            self.clean_savepoint = None
        return self.conn.execute(sql, params)

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.clean_savepoint = None
        self.conn.executemany(sql, rows)

    def script(self, sql: str) -> None:
        self.clean_savepoint = None
        self.conn.executescript(sql)

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    @property
    def total_changes(self) -> int:
        """Rows changed by this connection since it opened (SQLite counts them for free)."""
        return self.conn.total_changes

    def close(self) -> None:
        self.conn.close()


T = TypeVar("T")
_NAMED = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


def values_of(rows: Sequence[Sequence[Any]], row: str) -> tuple[str, list[Any]]:
    """A multi-row ``VALUES`` list for ``rows``, each as the placeholders ``row`` (``(?, ?)``),
    and their parameters in order: many rows in one statement, on PostgreSQL one round trip
    with none of a pipelined batch's work per row."""
    return ", ".join([row] * len(rows)), [value for values in rows for value in values]


@lru_cache(maxsize=4096)
def to_pyformat(sql: str, named: bool) -> str:
    """``?`` (or ``:name``) placeholders as psycopg's ``%s`` (``%(name)s``), a literal ``%``
    doubled first."""
    sql = sql.replace("%", "%%")
    return _NAMED.sub(r"%(\1)s", sql) if named else sql.replace("?", "%s")


_RECONNECTS = [0]  # connections this process borrowed to replace a broken one (F1)


def reconnects() -> int:
    """How many times this process replaced a broken PostgreSQL connection."""
    return _RECONNECTS[0]


# F1, per pool (by id): since a borrow timed out its database is taken to be away, until a
# borrow succeeds: for the next ``timeout`` seconds every borrow answers so at once, then one
# at a time may wait to find out. So a request waits on the database for at most one timeout
# in all, however many statements it has left and however many requests are queued.
_AWAY: dict[int, float] = {}  # per pool: when a borrow may next wait to find out
_PROBING: set[int] = set()
_AWAY_LOCK = threading.Lock()


def _borrow(pool: Any, timeout: float) -> Any:
    import psycopg_pool

    key = id(pool)
    probing = False
    with _AWAY_LOCK:
        if key in _AWAY:
            if key in _PROBING or time.monotonic() < _AWAY[key]:
                raise Unavailable("the database cannot be reached")
            _PROBING.add(key)
            probing = True
    try:
        conn = pool.getconn(timeout=timeout)
    except psycopg_pool.PoolTimeout as exc:
        with _AWAY_LOCK:
            _AWAY[key] = time.monotonic() + timeout
        raise Unavailable(f"the database cannot be reached: {exc}") from None
    finally:
        if probing:
            with _AWAY_LOCK:
                _PROBING.discard(key)
    with _AWAY_LOCK:
        _AWAY.pop(key, None)
    return conn


class _NoRows:
    """The answer to a statement that did not need to run."""

    rowcount = 0

    def fetchone(self) -> None:
        return None

    def fetchall(self) -> list[Any]:
        return []

    def __iter__(self) -> Iterator[Any]:
        return iter(())


_NO_ROWS: Cursor = cast(Cursor, _NoRows())


class PostgresDatabase(Database):
    """PostgreSQL through psycopg 3, in autocommit mode: transactions are explicit.

    Its connection comes from a pool (psycopg-pool) that checks it on borrow: at each
    ``BEGIN`` a connection that broke (a restart, a failover, a cut network) is handed back,
    where the pool drops it, and a fresh one is borrowed (F1); a ``BEGIN`` that fails on a
    connection the server closed meanwhile is tried once more on a new one. While the
    database cannot be reached every statement raises ``Unavailable`` (503), never an
    internal error, and no borrow waits longer than the pool's timeout.
    """

    dialect = POSTGRESQL

    def __init__(self, pool: Any, timeout: float, owns_pool: bool = False) -> None:
        self.pool = pool  # a psycopg_pool.ConnectionPool
        self.timeout = timeout
        self.owns_pool = owns_pool  # a pool of its own, closed with it
        self.conn: Any = None  # the borrowed psycopg.Connection

    def borrowed(self) -> Any:
        from psycopg.types.numeric import IntDumper

        if self.conn is not None and (self.conn.broken or self.conn.closed):
            self._give_back()
            _RECONNECTS[0] += 1
        if self.conn is None:
            conn = _borrow(self.pool, self.timeout)
            # Flags are 0/1 integers on both backends: a Python bool goes in as one.
            conn.adapters.register_dumper(bool, IntDumper)
            self.conn = conn
        return self.conn

    def _give_back(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            try:
                self.pool.putconn(conn)  # a broken or closed one is dropped, not kept
            except Exception:  # the pool is closing: nothing to give back to
                conn.close()

    def _run(self, fn: Callable[[Any], T], begins: bool) -> T:
        import psycopg
        from psycopg import pq

        for attempt in (1, 2):
            conn = self.borrowed()
            try:
                return fn(conn)
            except (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure) as exc:
                if conn.info.transaction_status != pq.TransactionStatus.INERROR:
                    raise Unavailable(f"the database gave up a statement: {exc}") from None
                raise Contended(str(exc)) from None  # a transaction's: it wrote nothing
            except psycopg.OperationalError as exc:
                broken = conn.broken or conn.closed
                if broken:
                    self._give_back()
                    _RECONNECTS[0] += 1
                if begins and broken and attempt == 1:
                    continue  # nothing was done yet: once more on a fresh connection
                raise Unavailable(f"the database cannot be reached: {exc}") from None
        raise AssertionError("unreachable")

    def execute(self, sql: str, params: Params = ()) -> Cursor:
        if self.conn is None and sql.startswith(("COMMIT", "ROLLBACK")):
            # The connection broke inside the transaction and was dropped: nothing to end.
            return _NO_ROWS
        if self.clean_savepoint is not None and writes(sql):
            self.clean_savepoint = None
        named = isinstance(params, Mapping)
        text = to_pyformat(sql, named)
        cursor: Cursor = self._run(
            lambda conn: conn.execute(text, params or None), sql.startswith("BEGIN")
        )
        return cursor

    def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        self.clean_savepoint = None
        batch = list(rows)
        if not batch:
            return

        def many(conn: Any) -> None:
            with conn.cursor() as cursor:
                cursor.executemany(to_pyformat(sql, False), batch)

        self._run(many, False)

    def script(self, sql: str) -> None:
        self.clean_savepoint = None
        self._run(lambda conn: conn.execute(sql), False)

    @property
    def in_transaction(self) -> bool:
        from psycopg.pq import TransactionStatus

        if self.conn is None or self.conn.closed:
            return False
        return bool(self.conn.info.transaction_status != TransactionStatus.IDLE)

    def close(self) -> None:
        self._give_back()
        if self.owns_pool:  # else its pool's worker threads would outlive it
            self.pool.close()
