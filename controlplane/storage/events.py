"""The event log: appended in the writer's transaction, with a gapless ``seq`` (E1)."""

from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from controlplane.storage.db import WRITER_LOCK, now
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


def write_pending(db: Database) -> list[int]:
    """PostgreSQL, at the end of a transaction: take the event order's lock (the last lock it
    takes; the commit releases it) and insert the transaction's events, seq after seq; their
    seqs, in order."""
    db.execute("SELECT pg_advisory_xact_lock(?)", [WRITER_LOCK])
    seqs = [_insert(db, event, tenants) for event, tenants in db.pending_events]
    db.appended = seqs[-1] if seqs else db.appended
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
