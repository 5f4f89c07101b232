"""The event log: appended in the writer's transaction, with a gapless ``seq`` (E1)."""

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from controlplane.storage.db import EVENTS_CHANNEL, WRITER_LOCK, notice, now
from controlplane.storage.ledger_types import EventRow
from controlplane.storage.sql import Database
from shared.ids import new_id


def append(
    db: Database,
    event_type: str,
    *,
    pool_id: str | None,
    data: dict[str, Any],
    audience: Iterable[str],
) -> None:
    """Append one event, visible to the ``audience`` tenants, in the mutation's transaction.

    ``seq`` is max+1 under the writer: SQLite's single writer, here and now; on PostgreSQL the
    events wait for the end of the transaction (``write_pending``), where the store takes
    ``WRITER_LOCK`` and holds it to the commit. One total order, committed in seq order, and a
    rolled-back change leaves no gap (E1, B5).
    """
    event = (new_id("evt"), event_type, now(), pool_id, msgspec.json.encode(data).decode())
    tenants = frozenset(audience)
    db.audience = db.audience | tenants
    if db.dialect.name == "postgresql":
        db.pending_events.append((event, tenants))
        db.write_events = write_pending
        return
    db.appended = _insert(db, event, tenants)


# PostgreSQL: a transaction's events, their audience rows and its NOTIFY in one statement (one
# round trip however many events a group commit holds). Each event's seq is the last one's
# plus its place in the list, read after WRITER_LOCK is taken (a statement of its own, so this
# one's snapshot already sees every seq committed before it).
_APPEND_PENDING = (
    "WITH top AS (SELECT coalesce(max(seq), 0) AS seq FROM events), "
    "appended AS (INSERT INTO events (seq, id, type, at, pool_id, data) "
    "SELECT top.seq + e.n, e.id, e.type, e.at, e.pool_id, e.data FROM top, "
    "unnest(?::text[], ?::text[], ?::text[], ?::text[], ?::text[]) WITH ORDINALITY "
    "AS e(id, type, at, pool_id, data, n) RETURNING seq), "
    "seen AS (INSERT INTO event_audience (tenant_id, seq) "
    "SELECT a.tenant_id, top.seq + a.n FROM top, unnest(?::text[], ?::int[]) AS a(tenant_id, n) "
    "ON CONFLICT DO NOTHING) "
    "SELECT top.seq, pg_notify(?, (top.seq + ?)::text || ?), (SELECT count(*) FROM appended) "
    "FROM top"
)


def write_pending(db: Database) -> list[int]:
    """PostgreSQL, at the end of a transaction: take the event order's lock (the last lock it
    takes; the commit releases it), insert the transaction's events, seq after seq, and tell
    the replicas' long-polls (``notice``); their seqs, in order."""
    db.execute("SELECT pg_advisory_xact_lock(?)", [WRITER_LOCK])
    events = db.pending_events
    columns = [list(column) for column in zip(*(event for event, _ in events), strict=True)]
    seen = [(tenant, n) for n, (_, tenants) in enumerate(events, 1) for tenant in tenants]
    (top, _, count) = db.execute(
        _APPEND_PENDING,
        [
            *columns,
            [tenant for tenant, _ in seen],
            [n for _, n in seen],
            EVENTS_CHANNEL,
            len(events),
            notice(db.audience),
        ],
    ).fetchone()
    assert count == len(events), (count, len(events))
    seqs = list(range(int(top) + 1, int(top) + len(events) + 1))
    db.appended = seqs[-1]
    return seqs


def _insert(db: Database, event: tuple[Any, ...], tenants: frozenset[str]) -> int:
    (seq,) = db.execute(
        "INSERT INTO events (seq, id, type, at, pool_id, data) "
        "SELECT coalesce(max(seq), 0) + 1, ?, ?, ?, ?, ? FROM events RETURNING seq",
        event,
    ).fetchone()
    db.executemany(
        "INSERT INTO event_audience (tenant_id, seq) VALUES (?, ?) ON CONFLICT DO NOTHING",
        [(tenant, seq) for tenant in tenants],
    )
    return int(seq)


def latest_seq(db: Database) -> int:
    """The seq of the last event appended (0 when none)."""
    return int(db.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()[0])


def list_events(
    db: Database,
    *,
    tenant_id: str | None,
    after: int,
    limit: int,
    types: Sequence[str] | None,
) -> list[EventRow]:
    """Events after ``after`` in seq order; ``tenant_id=None`` is the fleet's view (all of them).

    A tenant's page walks its audience rows' primary key (tenant_id, seq) from the cursor and
    stops after ``limit``: O(page) from any cursor, never a sort of the tenant's history.
    """
    params: list[Any]
    if tenant_id is None:
        source, seq, params = "events e", "e.seq", [after]
    else:
        source = "event_audience a JOIN events e ON e.seq = a.seq"
        seq, params = "a.seq", [tenant_id, after]
    where = [f"{seq} > ?"] if tenant_id is None else ["a.tenant_id = ?", f"{seq} > ?"]
    if types:
        where.append(f"e.type IN ({', '.join('?' * len(types))})")
        params.extend(types)
    params.append(limit)
    sql = (
        f"SELECT e.seq, e.id, e.type, e.at, e.pool_id, e.data FROM {source} "
        f"WHERE {' AND '.join(where)} ORDER BY {seq} LIMIT ?"
    )
    return [EventRow.of(row) for row in db.execute(sql, params)]
