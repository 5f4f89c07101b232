"""F9: node heads held in memory by credential, so a heartbeat that brings nothing new reads
no database at all.

A node credential resolves to its node's head (storage/nodes.py ``head_for_token``): the
small columns a report decides on. On SQLite this process is the database's only writer
(the file is the daemon's alone: a write to it from outside while it serves is not seen),
so it knows every write: a temporary trigger on the writer's connection names the
credential of each node row whose head columns an ``UPDATE`` or ``DELETE`` touches, and
once that transaction has ended (committed or not) those credentials' heads are dropped.
The liveness stamps (``last_seen_at``, written by the batched flush) are no head column, so
they drop nothing.

A read that a write ended during is not kept (``_ended`` moved since it began): it may
have seen the row from before that commit. A credential that is no node's is never kept, so
a node joined a moment later is found. At most ``HEADS_MAX`` heads are kept; past that the
oldest kept goes first.

On PostgreSQL other replicas write too, and nothing here would see their writes: there every
head is read from the database, as before.
"""

import sqlite3
import threading

from controlplane.storage import nodes as node_sql
from controlplane.storage.node_types import HEAD_COLUMNS, NodeHead
from controlplane.storage.sql import Database

HEADS_MAX = 200_000  # past 100,000 hosts; a head is a few hundred bytes
_WRITTEN = "bc_node_head_written"  # the SQL function the triggers call
# The head's columns and the credential itself: a write to any of them drops the head.
_WATCHED = ", ".join(sorted({*HEAD_COLUMNS, "token_hash"}))
_TRIGGERS = (
    f"CREATE TEMP TRIGGER bc_node_head_updated AFTER UPDATE OF {_WATCHED} ON main.nodes "
    f"BEGIN SELECT {_WRITTEN}(OLD.token_hash); END",
    f"CREATE TEMP TRIGGER bc_node_head_deleted AFTER DELETE ON main.nodes "
    f"BEGIN SELECT {_WRITTEN}(OLD.token_hash); END",
)


class NodeHeads:
    """The heads of node credentials seen lately, by credential hash, on one SQLite store."""

    def __init__(self) -> None:
        self._by_token: dict[bytes, NodeHead] = {}
        self._ended = 0  # transactions ended that wrote a head: a read across one is not kept
        # Written by the open transaction on the writer thread: dropped again when it ends.
        self._written: list[bytes] = []
        self._lock = threading.Lock()  # the writer thread drops, the event loop keeps

    def watch(self, conn: sqlite3.Connection) -> None:
        """Call ``written`` from the writer connection ``conn`` for every head it writes."""
        conn.create_function(_WRITTEN, 1, self.written, deterministic=False)
        for trigger in _TRIGGERS:
            conn.execute(trigger)

    def head(self, db: Database, hashed: bytes) -> NodeHead | None:
        """The head of the credential ``hashed``: kept, or read in ``db`` (and then kept)."""
        kept = self._by_token.get(hashed)
        if kept is not None:
            return kept
        began = self._ended
        found = node_sql.head_for_token(db, hashed)
        if found is not None:
            with self._lock:
                if self._ended == began:  # no write ended while it was read
                    if len(self._by_token) >= HEADS_MAX:
                        del self._by_token[next(iter(self._by_token))]
                    self._by_token[hashed] = found
        return found

    def written(self, hashed: bytes | None) -> None:
        """The trigger's call, in the writer's open transaction: the head goes now (a read
        before the commit may keep it again) and once more when the transaction ends."""
        if hashed is not None:
            self._by_token.pop(hashed, None)
            self._written.append(hashed)

    def ended(self) -> None:
        """The writer's transaction committed or rolled back: what it wrote is dropped, and
        a read that was under way is not kept."""
        if not self._written:
            return
        with self._lock:
            self._ended += 1
            for hashed in self._written:
                self._by_token.pop(hashed, None)
        self._written.clear()
