"""Counting the SQL statements a call executes on the store's writer, on either backend."""

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from controlplane.storage.db import Store

NODE_READ = re.compile(r"^SELECT .* FROM nodes\b", re.DOTALL)  # a read of the nodes table first
# What the store runs around every mutation: BEGIN, PostgreSQL's writer lock and NOTIFY, COMMIT.
FRAMING = re.compile(r"^(BEGIN|COMMIT|SELECT pg_advisory_xact_lock|SELECT pg_notify)\b")


@contextmanager
def _watched(store: Store, saw: Callable[[int, str], None]) -> Iterator[None]:
    """``saw(connection, sql)`` for each statement the store's writer connections execute
    (an ``executemany`` once) while the block runs; ``connection`` tells them apart. The
    connections are the real ones (on PostgreSQL the own-row writers' too)."""

    def watched(n: int, run: Callable[..., Any]) -> Callable[..., Any]:
        def call(sql: str, *args: Any) -> Any:
            saw(n, sql)
            return run(sql, *args)

        return call

    dbs = store.writer_dbs
    for n, db in enumerate(dbs):
        db.execute, db.executemany = watched(n, db.execute), watched(n, db.executemany)  # type: ignore[method-assign]
    try:
        yield
    finally:
        for db in dbs:
            del db.execute, db.executemany  # the class's own again


@contextmanager
def writer_statements(store: Store) -> Iterator[list[str]]:
    """The statements (their text) the store's writer connections execute while the block
    runs: transaction control, savepoints and every statement of the mutation, an
    ``executemany`` counted once."""
    seen: list[str] = []
    with _watched(store, lambda _, sql: seen.append(sql)):
        yield seen


def node_reads(statements: list[str]) -> list[str]:
    """The statements that read ``nodes`` (a row of it, or it joined with its pool)."""
    return [sql for sql in statements if NODE_READ.match(sql)]


def mutation(statements: list[str]) -> list[str]:
    """The statements of the mutation itself, without the store's framing of it (the same
    on both backends)."""
    return [sql for sql in statements if not FRAMING.match(sql)]


@contextmanager
def writer_transactions(store: Store) -> Iterator[list[list[str]]]:
    """As ``writer_statements``, the statements split into the transactions they ran in (a
    ``BEGIN`` starts one), each connection's apart, in the order the transactions began."""
    transactions: list[list[str]] = []
    running: dict[int, list[str]] = {}  # by connection: the transaction it runs

    def saw(connection: int, sql: str) -> None:
        if sql.startswith("BEGIN") or connection not in running:
            running[connection] = []
            transactions.append(running[connection])
        running[connection].append(sql)

    with _watched(store, saw):
        yield transactions
