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
def writer_statements(store: Store) -> Iterator[list[str]]:
    """The statements (their text) the store's writer connections execute while the block
    runs: transaction control, savepoints and every statement of the mutation, an
    ``executemany`` counted once. The connections are the real ones (on PostgreSQL the
    own-row writers' too); only their calls are seen."""
    seen: list[str] = []

    def counted(run: Callable[..., Any]) -> Callable[..., Any]:
        def call(sql: str, *args: Any) -> Any:
            seen.append(sql)
            return run(sql, *args)

        return call

    dbs = store.writer_dbs
    for db in dbs:
        db.execute, db.executemany = counted(db.execute), counted(db.executemany)  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        for db in dbs:
            del db.execute, db.executemany  # the class's own again


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

    def split(run: Callable[..., Any]) -> Callable[..., Any]:
        current: list[list[str]] = [[]]

        def call(sql: str, *args: Any) -> Any:
            if sql.startswith("BEGIN"):
                current[0] = []
                transactions.append(current[0])
            current[0].append(sql)
            return run(sql, *args)

        return call

    dbs = store.writer_dbs
    for db in dbs:
        db.execute, db.executemany = split(db.execute), split(db.executemany)  # type: ignore[method-assign]
    try:
        yield transactions
    finally:
        for db in dbs:
            del db.execute, db.executemany
