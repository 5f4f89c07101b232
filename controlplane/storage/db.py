"""The database: one writer thread, a reader on the event loop, reader threads for long reads.

Every mutation is a plain synchronous function ``fn(db)`` run by the single
writer inside ``BEGIN IMMEDIATE`` (PostgreSQL: ``BEGIN`` and the serial lock, see
``SERIAL_LOCK``) and committed as a whole, events included; nothing awaits inside a
transaction. On SQLite, node reports and first joins waiting one behind the other share a
group commit, each in a savepoint (``GROUP_MAX``). On PostgreSQL those run instead on
``OWN_ROW_WRITERS`` threads of their own, each transaction on its own connection, beside
each other (the serial lock shared), while the writer thread runs every other mutation.
Reads use other connections, which WAL (PostgreSQL's MVCC) lets run beside the
writer: short ones on the event loop's own, long ones (lists) on a small pool of
reader threads, each with its own connection (B6), so a long read holds the
loop no longer than the interpreter's switch interval at a time.

Each committed mutation moves, in its transaction, the generation of every scope it
wrote (the database's own triggers do it, so no write can forget: migration 11), and a
cached read answer is good while the generations of the scopes it shows stand; it says the
seq of the last event it appended to ``on_commit`` (long-polls wake on it); on PostgreSQL
the latter is also a ``NOTIFY`` that every replica listens to.
"""

import asyncio
import collections
import contextlib
import math
import os
import queue
import sqlite3
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, TypeVar

from controlplane.config import DB_TIMEOUT_S, Durability
from controlplane.storage.heads import NodeHeads
from controlplane.storage.migrations import EVERY_SCOPE, Scope, migrate
from controlplane.storage.paging import make_cursor_key
from controlplane.storage.sql import Contended, Database, PostgresDatabase, SqliteDatabase
from shared.errors import Unavailable

T = TypeVar("T")


class RunAlone(Exception):
    """Raised inside a mutation run beside others (``own_rows``) that finds it must write
    more than its node's own rows: nothing of it is written, and it runs again, alone."""


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
SYNCHRONOUS: dict[Durability, str] = {"full": "FULL", "relaxed": "NORMAL"}
PRIVATE_FILE, PRIVATE_DIR = 0o600, 0o700


# PostgreSQL's two transaction-level locks, which make every replica's mutations keep B5 as
# SQLite's single writer does. Every mutation takes SERIAL_LOCK first: exclusively, so that it
# runs alone (quotas never over-admitted, one object per idempotency key), except a mutation
# of one node's own rows (``own_rows``: its report, its first join), which takes it shared and
# so runs beside the others of its kind, on every replica, each holding the lock of its node
# (NODE_LOCK, by node id or machine identity) first. Such a mutation never runs beside one
# that runs alone, so what those read stays as it was.
SERIAL_LOCK = 0x6263_7372  # "bcsr"
NODE_LOCK = 0x6263_6E64  # "bcnd": with hashtext(the node's key), a two-key advisory lock
# WRITER_LOCK orders the events: a transaction takes it at its very end, right before it
# inserts its events, assigns their seqs under it (max + 1) and commits holding it (the commit
# releases it). So seqs are gapless and committed in their order, a reader never sees seq N + 1
# before N, and no transaction ever waits for a row while holding it. A mutation that appends
# no event never takes it.
WRITER_LOCK = 0x6263_7772  # "bcwr"
CONTENDED_TRIES = 3  # runs of a mutation that PostgreSQL ended to break a deadlock
EVENTS_CHANNEL = "bc_events"  # PostgreSQL NOTIFY channel: the seq of the last event committed
NOTICE_MAX = 7_000  # a NOTIFY payload is at most 8000 bytes: beyond this, "for everyone"


def notice(audience: frozenset[str]) -> str:
    """What follows a commit's last seq in its NOTIFY payload, ``seq:tenant,tenant`` (who may
    see its events), or nothing, ``seq`` alone (everyone's: too many tenants to name), when
    that would be too long."""
    named = f":{','.join(sorted(audience))}"
    return named if len(named) <= NOTICE_MAX else ""


# Reads at once on threads: lists on SQLite; on PostgreSQL every read (each waits on the
# server, not on the interpreter).
READER_THREADS = {"sqlite": 4, "postgresql": 8}
SHORT_READER_THREADS = 4
# PostgreSQL: mutations of one node's own rows (reports, first joins) run on this many threads,
# each on a connection of its own, beside the writer thread and each other (SERIAL_LOCK
# shared), each taking the others waiting into a group commit. Two, not more: one transaction
# held up on its node leaves the other running, while more threads only traded the GIL
# (fleet_sim, 2 replicas, 2,000 hosts: 1 writer 339 joins/s, 2 writers 290, 4 writers 198).
OWN_ROW_WRITERS = 2


def is_postgres(location: str | Path) -> bool:
    return str(location).startswith(("postgresql://", "postgres://"))


DB_TIMEOUT = DB_TIMEOUT_S


def connection_options(timeout: float) -> dict[str, Any]:
    """F1: how every PostgreSQL connection reaches the server: a connect timeout, and TCP
    keepalives with a user timeout, so a dead server or a cut network is noticed in seconds
    (the kernel's default is about two hours), not left hanging."""
    seconds = max(1, round(timeout))
    return {
        "autocommit": True,
        "connect_timeout": seconds,
        "keepalives": 1,
        "keepalives_idle": seconds,
        "keepalives_interval": 1,
        "keepalives_count": 3,
        "tcp_user_timeout": seconds * 1000,
    }


def postgres_pool(
    location: str | Path, durability: Durability, size: int, timeout: float = DB_TIMEOUT
) -> Any:
    """A psycopg-pool pool of ``size`` connections, each checked on borrow (F1)."""
    import psycopg_pool

    def configure(conn: Any) -> None:
        if durability == "relaxed":
            conn.execute("SET synchronous_commit = off")

    return psycopg_pool.ConnectionPool(
        str(location),
        min_size=0,
        max_size=size,
        kwargs=connection_options(timeout),
        configure=configure,
        check=psycopg_pool.ConnectionPool.check_connection,
        timeout=timeout,
        open=True,
        name="better-compute",
    )


def connect(
    location: str | Path,
    durability: Durability = "full",
    pool: Any = None,
    timeout: float = DB_TIMEOUT,
) -> Database:
    """A connection in autocommit mode (transactions are explicit) to a SQLite file or a
    PostgreSQL URL (its password from PGPASSWORD or ~/.pgpass, never the command line); on
    PostgreSQL borrowed from ``pool`` (one of its own when none is given)."""
    if is_postgres(location):
        if pool is not None:
            return PostgresDatabase(pool, timeout)
        return PostgresDatabase(postgres_pool(location, durability, 1, timeout), timeout, True)
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
def snapshot_of(db: Database) -> Iterator[Database]:
    """A read transaction on ``db``: every statement inside sees the same committed state."""
    postgres = db.dialect.name == "postgresql"
    db.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY" if postgres else "BEGIN")
    try:
        yield db
    finally:
        db.execute("COMMIT")


@lru_cache(maxsize=16)
def _generation_sql(scopes: tuple[Scope, ...]) -> str:
    marks = ", ".join("?" * len(scopes))
    return f"SELECT CAST(sum(n) AS BIGINT) FROM generations WHERE scope IN ({marks})"


def generation(db: Database, scopes: tuple[Scope, ...] = EVERY_SCOPE) -> int:
    """Where ``scopes`` stand, read in ``db``'s transaction (an answer made there is tagged
    with the state it saw): the sum of their generations, which only grow, so it moves
    exactly when a committed mutation wrote one of them."""
    return int(db.execute(_generation_sql(scopes), scopes).fetchone()[0])


@contextmanager
def savepoint(db: Database) -> Iterator[None]:
    """A nested transaction: on an exception, what it wrote is undone and the exception goes
    on, while the enclosing transaction and what it wrote before stay (R5); so do the events
    it appended as the commit will tell long-polls of them (an undone event's seq is the next
    one's: told of, it would hide that one). Right inside a savepoint that nothing was
    written since (``db.clean_savepoint``: a group member's, its gate's reads only), it is
    that savepoint: rolling back to it undoes the same, and costs no statement otherwise."""
    events_before = db.appended, db.audience
    pending = getattr(db, "pending_events", None)
    pending_before = 0 if pending is None else len(pending)
    enclosing = db.clean_savepoint
    if enclosing is None:
        db.execute("SAVEPOINT unit")
        db.clean_savepoint = "unit"
    try:
        yield
    except BaseException:
        if not db.in_transaction:  # SQLite ended the whole transaction: nothing to undo here
            raise
        db.execute(f"ROLLBACK TO {enclosing or 'unit'}")
        if enclosing is None:
            db.execute("RELEASE unit")
        db.clean_savepoint = enclosing  # as at the start
        db.appended, db.audience = events_before
        if pending is not None:
            del pending[pending_before:]
        raise
    if enclosing is None:
        db.execute("RELEASE unit")


# A group commit (SQLite): node reports and first joins waiting one behind the other share
# one transaction, each in a savepoint of its own, and so one fsync of the WAL (~0.35 ms, half
# a storm report's writer time), as long as the group holds at most GROUP_MAX of them and has
# run for at most GROUP_SECONDS when the next would start (each waits for its group's commit).
GROUP_MAX = 64
GROUP_SECONDS = 0.025
Outcome = tuple[Any, int, frozenset[str]]  # a mutation's result, last seq and audience


class _Mutation:
    """A mutation for the writer thread, waiting since ``since`` (monotonic seconds); each is
    its own (compared by identity). ``outcome`` is set once it is committed, or refused."""

    __slots__ = ("fn", "gate", "outcome", "own_rows", "shares_rows", "since")

    def __init__(
        self,
        fn: Callable[[Database], Any],
        own_rows: str | None,
        gate: Callable[[Database], None] | None,
        shares_rows: bool = False,
    ) -> None:
        self.fn, self.own_rows, self.gate = fn, own_rows, gate
        self.shares_rows = shares_rows
        self.since = time.monotonic()
        self.outcome: Future[Outcome] = Future()

    def settle(self, ended: Outcome | BaseException) -> None:
        """Tell its caller how it ended: its outcome, or the exception it raises there."""
        if isinstance(ended, BaseException):
            self.outcome.set_exception(ended)
        else:
            self.outcome.set_result(ended)


class Store:
    """The database of one control plane: a writer and readers, on a SQLite file or a
    PostgreSQL database that several replicas share (B3, B4)."""

    def __init__(
        self,
        location: str | Path,
        durability: Durability = "full",
        reader_threads: int | None = None,
        db_timeout: float = DB_TIMEOUT,
    ) -> None:
        self.location = location
        self.durability = durability
        self.postgres = is_postgres(location)
        self.path = Path(location)  # the SQLite file (meaningless for PostgreSQL)
        self.db_timeout = db_timeout
        threads = reader_threads or READER_THREADS["postgresql" if self.postgres else "sqlite"]
        # F1: one pool for every connection of this store: the writers, the loop's reader,
        # each reader thread's, each short reader's.
        self._pool = (
            postgres_pool(
                location,
                durability,
                threads + SHORT_READER_THREADS + 2 + OWN_ROW_WRITERS,
                db_timeout,
            )
            if self.postgres
            else None
        )
        if not self.postgres:
            _private_files(self.path)
        self._writer_db = self._connect()
        migrate(self._writer_db)
        make_cursor_key(self._writer_db)
        # F9: on SQLite, node heads kept in memory, dropped by the writer's own triggers.
        self.heads: NodeHeads | None = None
        if isinstance(self._writer_db, SqliteDatabase):
            self.heads = NodeHeads()
            self.heads.watch(self._writer_db.conn)
        self.reader = self._connect()
        if not self.postgres:
            _private_files(self.path)  # the -wal and -shm files SQLite made beside it
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-writer")
        # Mutations not yet taken by the writer thread, in arrival order: the loop appends
        # (and removes one whose caller left), the writer thread takes from the left.
        self._waiting: collections.deque[_Mutation] = collections.deque()
        # PostgreSQL: the own-row mutations, waiting for the own-row writers; a free writer
        # thread takes one of the connections in ``_free_writers``.
        self._own_waiting: collections.deque[_Mutation] = collections.deque()
        self._own_writer_dbs = [
            self._connect() for _ in range(OWN_ROW_WRITERS if self.postgres else 0)
        ]
        self._free_writers: queue.SimpleQueue[Database] = queue.SimpleQueue()
        for db in self._own_writer_dbs:
            self._free_writers.put(db)
        self._own_writers = ThreadPoolExecutor(
            max_workers=max(1, len(self._own_writer_dbs)), thread_name_prefix="own-row-writer"
        )
        self._readers = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="reader")
        # PostgreSQL's short reads (a get, a cache check, a write's IAM pre-check) on threads of
        # their own: never queued behind long lists.
        self._short_readers = ThreadPoolExecutor(
            max_workers=SHORT_READER_THREADS, thread_name_prefix="short-reader"
        )
        self._local = threading.local()
        self._reader_dbs: list[Database] = []  # every reader thread's connection, to close
        self._gate: Callable[[Database], None] | None = None
        # Called on the event loop after a mutation that appended events: the last seq and
        # the tenants they are visible to.
        self.on_commit: Callable[[int, frozenset[str]], None] | None = None

    def _connect(self) -> Database:
        return connect(self.location, self.durability, self._pool, self.db_timeout)

    def gated(self, gate: Callable[[Database], None]) -> "Store":
        """This store as one API method uses it: each of its transactions first runs ``gate``
        (the method's IAM decision, R1), so the decision and the change see one state."""
        # The same connections and writer thread: a shallow copy of the attributes (the
        # copy module's generic protocol took a few microseconds of every request).
        view = Store.__new__(Store)
        view.__dict__.update(self.__dict__)
        view._gate = gate
        return view

    def snapshot(self, db: Database | None = None) -> AbstractContextManager[Database]:
        """A read transaction on the loop's reader (or on ``db``)."""
        return snapshot_of(self.reader if db is None else db)

    def _thread_reader(self) -> Database:
        db: Database | None = getattr(self._local, "db", None)
        if db is None:
            db = self._local.db = self._connect()
            self._reader_dbs.append(db)
        return db

    def _read_in_thread(self, fn: Callable[[Database], T]) -> T:
        with self.snapshot(self._thread_reader()) as db:
            return fn(db)

    async def read(self, fn: Callable[[Database], T]) -> T:
        """Run ``fn`` in one read transaction on a reader thread, off the event loop (B6)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._readers, self._read_in_thread, fn)

    async def read_short(self, fn: Callable[[Database], T]) -> T:
        """``read`` for a short read, on the threads long lists never take."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._short_readers, self._read_in_thread, fn)

    async def read_latest(self, fn: Callable[[Database], T]) -> T:
        """``fn`` on a short reader thread outside a transaction, each statement seeing the
        latest commit, as SQLite's reader on the loop does: for a check that is made again
        in a write's transaction, at one round trip a statement (no BEGIN nor COMMIT)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._short_readers, self._latest_in_thread, fn)

    def _latest_in_thread(self, fn: Callable[[Database], T]) -> T:
        db = self._thread_reader()
        try:
            return fn(db)
        except Unavailable:
            if not isinstance(db, PostgresDatabase) or db.conn is not None:
                raise
            # Its connection broke (a restart, a failover, an idle session ended) and was
            # dropped: once more on a fresh one, as a BEGIN is (F1). Nothing was written.
            return fn(db)

    @property
    def writer_dbs(self) -> list[Database]:
        """Every connection a mutation runs on: the writer's, then the own-row writers'."""
        return [self._writer_db, *self._own_writer_dbs]

    def transact(self, fn: Callable[[Database], T]) -> T:
        """Run ``fn`` in one transaction on the calling thread: ``BEGIN IMMEDIATE`` on
        SQLite, ``BEGIN`` and the serial lock on PostgreSQL."""
        return self._transact(fn, None, self._gate)[0]

    def _transact(
        self,
        fn: Callable[[Database], T],
        own_rows: str | None = None,
        gate: Callable[[Database], None] | None = None,
        db: Database | None = None,
    ) -> tuple[T, int, frozenset[str]]:
        """``fn``'s result, the seq of the last event it appended (0 when none) and the
        tenants its events are visible to; on the writer's connection, or ``db``. On
        PostgreSQL, ``own_rows`` (a node's key) runs it beside other such mutations
        (``SERIAL_LOCK``); one that raises ``RunAlone``, or that PostgreSQL ended to break a
        deadlock, runs again alone."""
        for attempt in range(1, CONTENDED_TRIES + 1):
            try:
                return self._transact_once(fn, own_rows, gate, db or self._writer_db)
            except RunAlone:
                own_rows = None
            except Contended:
                if attempt == CONTENDED_TRIES:
                    raise Unavailable("the database is contended; try again") from None
                own_rows = None
        raise AssertionError("unreachable")

    def _transact_once(
        self,
        fn: Callable[[Database], T],
        own_rows: str | None,
        gate: Callable[[Database], None] | None,
        db: Database,
    ) -> tuple[T, int, frozenset[str]]:
        if isinstance(db, SqliteDatabase):
            db.execute("BEGIN IMMEDIATE")  # one writer: always alone
        else:
            db.execute("BEGIN")
            if own_rows is None:
                db.execute("SELECT pg_advisory_xact_lock(?)", [SERIAL_LOCK])
            else:  # its node first, then beside the others of its kind
                db.execute(
                    "SELECT pg_advisory_xact_lock(?, hashtext(?)), pg_advisory_xact_lock_shared(?)",
                    [NODE_LOCK, own_rows, SERIAL_LOCK],
                )
            db.pending_events = []
            db.own_rows = own_rows
        db.appended, db.audience = 0, frozenset()
        try:
            if gate is not None:
                gate(db)
            result = fn(db)
            if not isinstance(db, SqliteDatabase) and db.pending_events:
                assert db.write_events is not None
                db.write_events(db)  # takes WRITER_LOCK: the last lock, held to the commit
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:  # a failed COMMIT (a deferred constraint) leaves it open
                db.execute("ROLLBACK")
            raise
        finally:
            if self.heads is not None:
                self.heads.ended()
        return result, db.appended, db.audience

    def write_wait(self) -> float:
        """Seconds the oldest mutation still waiting for the writer thread has waited (0 when
        none waits): how far behind this replica's writes are (F10)."""
        waiting, own = self._waiting, self._own_waiting
        if not waiting and not own:
            return 0.0
        oldest = min(waiting[0].since if waiting else math.inf, own[0].since if own else math.inf)
        return time.monotonic() - oldest

    def _take(
        self, follower: bool, waiting: "collections.deque[_Mutation] | None" = None
    ) -> _Mutation | None:
        """On a writer thread: the next mutation waiting (in ``waiting``, else the writer's)
        whose caller is still there (its outcome now running), or None. A ``follower`` (for a
        group under way) only when it writes one node's own rows (on PostgreSQL, and shares no
        row with its kind): any other is left at the head, for its own turn."""
        waiting = self._waiting if waiting is None else waiting
        while True:
            try:
                mutation = waiting.popleft()
            except IndexError:
                return None
            if follower and (mutation.own_rows is None or (self.postgres and mutation.shares_rows)):
                waiting.appendleft(mutation)
                return None
            if mutation.outcome.set_running_or_notify_cancel():  # else its caller left
                return mutation

    def _run_waiting(self) -> None:
        """On the writer thread: the next waiting mutation, committed before its caller hears
        of it; alone in its transaction, or (SQLite) when it writes one node's own rows and
        the next waiting mutation does too, in a group commit with those that follow. A group
        that cannot commit (or whose transaction a failure ended) is run again one by one,
        each alone, as if there were no groups."""
        head = self._take(follower=False)
        if head is None:
            return  # an earlier group took this call's mutation
        waiting = self._waiting
        if self.postgres or head.own_rows is None or not waiting or waiting[0].own_rows is None:
            head.settle(self._alone(head))
            return
        group = [head]  # grows as the group runs
        try:
            ended = self._transact_group(group)
        except BaseException:
            for mutation in group:
                mutation.settle(self._alone(mutation))
            return
        for mutation, end in zip(group, ended, strict=True):
            mutation.settle(end)

    def _alone(self, mutation: _Mutation, db: Database | None = None) -> Outcome | BaseException:
        try:
            return self._transact(mutation.fn, mutation.own_rows, mutation.gate, db)
        except BaseException as exc:  # as the executor's work items do: the caller re-raises
            return exc

    def _run_own_rows(self) -> None:
        """PostgreSQL, on an own-row writer thread: the next waiting mutation of one node's
        own rows, on a free own-row connection, beside the other writers' transactions; with
        the own-row mutations waiting behind it, in a group commit as on SQLite, so that the
        group takes the event order's lock and waits for the WAL's flush once. A group that
        cannot commit is run again one by one, each alone."""
        head = self._take(follower=False, waiting=self._own_waiting)
        if head is None:
            return  # an earlier group took this call's mutation, or its caller left
        db = self._free_writers.get()  # one per thread: never empty here
        try:
            if not self._own_waiting or head.shares_rows:
                head.settle(self._alone(head, db))
                return
            group = [head]  # grows as the group runs
            try:
                ended = self._postgres_group(db, group)
            except BaseException:
                for mutation in group:
                    mutation.settle(self._alone(mutation, db))
                return
            for mutation, end in zip(group, ended, strict=True):
                if end is not None:
                    mutation.settle(end)
            for mutation, end in zip(group, ended, strict=True):
                if end is None:  # its node held elsewhere, or more than its node's rows
                    mutation.settle(self._alone(mutation, db))
        finally:
            self._free_writers.put(db)

    def _postgres_group(
        self, db: Database, group: list[_Mutation]
    ) -> list[Outcome | BaseException | None]:
        """PostgreSQL: ``group`` in one transaction, each mutation in a savepoint of its own
        and holding its node's lock, taking the own-row mutations that wait behind it while
        the group holds fewer than GROUP_MAX and has run for at most GROUP_SECONDS; the
        events of all of them appended at the end, under WRITER_LOCK, in the group's order.
        How each ended: its outcome, the exception it raised, or None when it is to run on
        its own after the commit (a follower whose node another transaction holds is not
        waited for while the group holds other nodes' locks: no deadlock between groups)."""
        head = group[0]
        db.execute("BEGIN")
        started = time.monotonic()
        ended: list[Outcome | BaseException | None] = []
        spans: list[tuple[int, int]] = []  # each mutation's events in pending_events
        db.pools_read = {}
        try:
            db.execute(
                "SELECT pg_advisory_xact_lock(?, hashtext(?)), pg_advisory_xact_lock_shared(?)",
                [NODE_LOCK, head.own_rows, SERIAL_LOCK],
            )
            db.pending_events = []
            audience: frozenset[str] = frozenset()
            runs = True  # the mutation at len(ended) holds its node's lock
            while len(ended) < len(group):
                mutation = group[len(ended)]
                before = len(db.pending_events)
                end = self._in_postgres_savepoint(db, mutation) if runs else None
                spans.append((before, len(db.pending_events)))
                ended.append(end)
                if isinstance(end, tuple):
                    audience |= end[2]
                runs = True
                if len(group) < GROUP_MAX and time.monotonic() - started <= GROUP_SECONDS:
                    follower = self._take(follower=True, waiting=self._own_waiting)
                    if follower is not None:
                        group.append(follower)
                        (runs,) = db.execute(
                            "SELECT pg_try_advisory_xact_lock(?, hashtext(?))",
                            [NODE_LOCK, follower.own_rows],
                        ).fetchone()
            seqs: list[int] = []
            db.appended, db.audience = 0, audience
            if db.pending_events:
                assert db.write_events is not None
                seqs = db.write_events(db)  # takes WRITER_LOCK: the last lock, held to the commit
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.pools_read = None
        return [
            (end[0], seqs[last - 1] if last > first else 0, end[2])
            if isinstance(end, tuple)
            else end
            for end, (first, last) in zip(ended, spans, strict=True)
        ]

    @staticmethod
    def _in_postgres_savepoint(db: Database, mutation: _Mutation) -> Outcome | Exception | None:
        """One mutation of a PostgreSQL group: its outcome (its seq filled in at the commit),
        the exception it raised with its writes and events taken back, or None when it raised
        ``RunAlone`` or was ended by a deadlock; a failure that the savepoint cannot undo is
        raised."""
        db.appended, db.audience = 0, frozenset()
        db.own_rows = mutation.own_rows
        before = len(db.pending_events)
        db.execute("SAVEPOINT mutation")
        db.clean_savepoint = "mutation"
        try:
            if mutation.gate is not None:
                mutation.gate(db)
            result = mutation.fn(db)
        except (RunAlone, Exception) as exc:
            db.execute("ROLLBACK TO mutation")  # raises when the connection is gone
            db.execute("RELEASE mutation")
            del db.pending_events[before:]
            # PostgreSQL ended it to break a deadlock: it runs again on its own, as alone.
            return None if isinstance(exc, RunAlone | Contended) else exc
        db.execute("RELEASE mutation")
        return result, 0, db.audience

    @staticmethod
    def _in_savepoint(db: Database, mutation: _Mutation) -> Outcome | Exception:
        """One mutation of a group: its outcome, or the exception it raised with its writes
        taken back; a failure that ended the whole transaction is raised."""
        db.appended, db.audience = 0, frozenset()
        db.execute("SAVEPOINT mutation")
        db.clean_savepoint = "mutation"
        try:
            if mutation.gate is not None:
                mutation.gate(db)
            result = mutation.fn(db)
        except Exception as exc:
            if not db.in_transaction:  # SQLite ended the whole transaction
                raise
            db.execute("ROLLBACK TO mutation")
            db.execute("RELEASE mutation")
            return exc
        db.execute("RELEASE mutation")
        return result, db.appended, db.audience

    def _transact_group(self, group: list[_Mutation]) -> list[Outcome | BaseException]:
        """SQLite: ``group`` in one transaction, each mutation in a savepoint, taking the own-row
        mutations that wait behind it into ``group`` while it holds fewer than GROUP_MAX and
        has run for at most GROUP_SECONDS; how each ended (its outcome, or the exception it
        raised), once the transaction is committed."""
        db = self._writer_db
        db.execute("BEGIN IMMEDIATE")
        started = time.monotonic()
        ended: list[Outcome | BaseException] = []
        db.pools_read = {}  # the one writer: no pool changes under the group
        try:
            while len(ended) < len(group):
                ended.append(self._in_savepoint(db, group[len(ended)]))
                if len(group) < GROUP_MAX and time.monotonic() - started <= GROUP_SECONDS:
                    follower = self._take(follower=True)
                    if follower is not None:
                        group.append(follower)
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise
        finally:
            db.pools_read = None
            if self.heads is not None:
                self.heads.ended()
        return ended

    async def write(
        self, fn: Callable[[Database], T], own_rows: str | None = None, shares_rows: bool = False
    ) -> T:
        """Run the mutation ``fn`` on the writer thread, in one transaction; ``own_rows``:
        it writes only the rows of the node of that key (its id, or for a first join its
        machine identity), and may run beside other such mutations (``SERIAL_LOCK``) and share
        a group commit with them. ``shares_rows``: it also writes a row others of its kind
        write (a join token's uses): on PostgreSQL it then commits in a transaction of its own,
        never holding that row while a whole group runs (the others would wait for all of it)."""
        mutation = _Mutation(fn, own_rows, self._gate, shares_rows)
        beside = self.postgres and own_rows is not None  # on the own-row writers
        waiting = self._own_waiting if beside else self._waiting
        waiting.append(mutation)
        try:
            if beside:
                self._own_writers.submit(self._run_own_rows)
            else:
                self._writer.submit(self._run_waiting)
            result, appended, audience = await asyncio.wrap_future(mutation.outcome)
        finally:
            with contextlib.suppress(ValueError):  # cancelled before the writer took it
                waiting.remove(mutation)
        if appended and self.on_commit is not None:
            self.on_commit(appended, audience)
        return result  # type: ignore[no-any-return]

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self._own_writers.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        self._short_readers.shutdown(wait=True)
        self._writer_db.close()
        for db in self._own_writer_dbs:
            db.close()
        self.reader.close()
        for db in self._reader_dbs:
            db.close()
        if self._pool is not None:
            self._pool.close()
