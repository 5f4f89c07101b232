"""Node liveness stamps, stored where writing them costs the writer nothing.

The writer is the order of mutations: SQLite's write lock on the database file, PostgreSQL's
``SERIAL_LOCK`` and ``WRITER_LOCK`` that every replica's mutations take (db.py). A report with
nothing new only stamps memory (capacity/liveness.py); each replica writes those stamps here,
each node's about every third of --node-lost-after, so that the leader's lost-node check and
the other replicas' node views see nodes that report elsewhere (B4). With 100,000 nodes that
is 100,000 stamps per flush: on the wide ``nodes`` rows, in the writer, 0.4 s of every
mutation's time; here none of it.

- SQLite: a database file of its own beside the main one (``<db>.liveness``, 0600 like it,
  R7), with its own connections and thread. A write there takes that file's lock only, so a
  flush runs beside any mutation and no mutation waits for one.
- PostgreSQL: a table in the same database written by a connection of its own, in autocommit
  and without the writer lock; MVCC lets it run beside every replica's mutations (none of
  them writes this table).

One statement per flush, on both backends: the batch goes as one JSON object
``{node id: second}`` into an ``INSERT … ON CONFLICT`` that never moves a stamp back (a node
that moved to another replica). ``seen_at`` is whole epoch seconds rounded down: never later
than the report it stands for, so a node may be found silent up to a second early, never late.

The table is not one of the numbered migrations (migrations.py): on SQLite it lives in a file
that the main schema does not reach, and what it holds is disposable. Losing it costs nothing
but a grace period: a control plane marks nothing lost for --node-lost-after after it starts
or takes the lead, by which time memory and fresh flushes hold every node that reports. So
each store creates the table when absent (on PostgreSQL under the migration lock, as replicas
may start together). ``nodes.last_seen_at`` stays: the stamp of a join, or of a report that
changed something, written by those mutations anyway. A node's stored stamp is the later of
the two, so no stamp needed copying over.

F10: ``replica_behind`` (one row per replica process: the last epoch second it was behind,
rounded up) is here too, written the same way by each replica's flush, and read by the
leader's lost-node check: a grace period must pass with no replica behind before a node is
marked lost (controlplane/overload.py). Rows older than a grace period say nothing any more:
the leader deletes them as it reads.

The lost-node check reads here as well, off the writer (``silent``): the watched nodes with
neither stamp at or after the cutoff, in one join. On SQLite the main file is ATTACHed to
this file's flushing connection for that join; that connection only ever runs single
statements in autocommit, each of which locks only the files it writes (``BEGIN IMMEDIATE``
there would lock every attached file, the main one too). The leader's pass then re-reads only
those few nodes in its writer transaction (storage/nodes.py ``silent_nodes``) and marks them.
"""

import asyncio
import math
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from controlplane.storage.db import DB_TIMEOUT, _private_files, connect, is_postgres, timestamp
from controlplane.storage.migrations import MIGRATION_LOCK
from controlplane.storage.nodes import WATCHED

T = TypeVar("T")
TABLE = (
    "CREATE TABLE IF NOT EXISTS node_liveness "
    "(node_id TEXT PRIMARY KEY, seen_at INTEGER NOT NULL) WITHOUT ROWID"
)
UPSERT = (
    "INSERT INTO node_liveness (node_id, seen_at) "
    "SELECT j.key, CAST(j.value AS BIGINT) FROM {entries} WHERE true "
    "ON CONFLICT (node_id) DO UPDATE SET seen_at = excluded.seen_at "
    "WHERE excluded.seen_at > node_liveness.seen_at"
)
BEHIND_TABLE = (
    "CREATE TABLE IF NOT EXISTS replica_behind "
    "(replica_id TEXT PRIMARY KEY, behind_at INTEGER NOT NULL) WITHOUT ROWID"
)
RECORD_BEHIND = (
    "INSERT INTO replica_behind (replica_id, behind_at) VALUES (?, ?) "
    "ON CONFLICT (replica_id) DO UPDATE SET behind_at = excluded.behind_at "
    "WHERE excluded.behind_at > replica_behind.behind_at"
)
SILENT = (
    "SELECT n.id FROM nodes n LEFT JOIN node_liveness l ON l.node_id = n.id "
    f"WHERE {WATCHED} AND n.last_seen_at < ? AND (l.seen_at IS NULL OR l.seen_at < ?)"
)


def liveness_file(path: Path) -> Path:
    """SQLite: the liveness database beside the main one."""
    return path.with_name(path.name + ".liveness")


class LivenessStore:
    """The stamps of one control plane: flushes and the lost-node check on a thread of their
    own, single stamps (node views, activation) from any thread."""

    def __init__(self, location: str | Path, timeout: float = DB_TIMEOUT) -> None:
        self.postgres = is_postgres(location)
        path = liveness_file(Path(location))  # SQLite's (meaningless for PostgreSQL)
        place = location if self.postgres else path
        if not self.postgres:
            _private_files(path)
        # Stamps are disposable (a grace period covers their loss): no sync at each commit.
        self._db = connect(place, "relaxed", timeout=timeout)
        self._create()
        if not self.postgres:
            self._db.execute("ATTACH DATABASE ? AS controlplane", [str(location)])
        self._lookups = connect(place, "relaxed", timeout=timeout)
        if not self.postgres:
            _private_files(path)  # the -wal and -shm files SQLite made beside it
        self._lock = threading.Lock()  # one lookup at a time on their connection
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="liveness")

    def _create(self) -> None:
        ddl = self._db.dialect.ddl(f"{TABLE};\n{BEHIND_TABLE};")
        if not self.postgres:
            self._db.script(ddl)
            return
        self._db.execute("SELECT pg_advisory_lock(?)", [MIGRATION_LOCK])
        try:
            self._db.script(ddl)
        finally:
            self._db.execute("SELECT pg_advisory_unlock(?)", [MIGRATION_LOCK])

    def write(self, stamps: Mapping[str, int]) -> None:
        """Store ``{node id: epoch second}`` in one statement; a stored later stamp stays."""
        if stamps:
            entries = self._db.dialect.json_int_entries("?")
            self._db.execute(UPSERT.format(entries=entries), [msgspec.json.encode(stamps).decode()])

    def record_behind(self, replica: str, at: float) -> None:
        """F10: ``replica`` was behind at ``at`` (epoch seconds); a later record stays."""
        self._db.execute(RECORD_BEHIND, [replica, math.ceil(at)])

    def last_behind(self, since: float) -> float | None:
        """F10: the last time any replica was behind, when at or after ``since`` (older
        records are deleted: they no longer hold the lost-node check back)."""
        self._db.execute("DELETE FROM replica_behind WHERE behind_at < ?", [math.floor(since)])
        found = self._db.execute("SELECT max(behind_at) FROM replica_behind").fetchone()
        return None if found is None or found[0] is None else float(found[0])

    def silent(self, before: float) -> list[str]:
        """The watched nodes (live, not removed) with no stored stamp at or after ``before``,
        neither here nor in ``nodes.last_seen_at``."""
        found = self._db.execute(SILENT, [timestamp(before), before])
        return [row[0] for row in found]

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on this store's thread (``write``, ``silent``, or what prepares a
        flush: 100,000 stamps are tens of milliseconds of Python, kept off the event loop)."""
        return await asyncio.get_running_loop().run_in_executor(self._thread, fn, *args)

    def stamp(self, node_id: str) -> int | None:
        """The node's stamp written here (epoch seconds), if any."""
        with self._lock:
            found = self._lookups.execute(
                "SELECT seen_at FROM node_liveness WHERE node_id = ?", [node_id]
            ).fetchone()
        return None if found is None else int(found[0])

    def close(self) -> None:
        self._thread.shutdown(wait=True)
        self._db.close()
        self._lookups.close()
