"""B5, R3 on SQLite's group commit: node reports and first joins waiting behind one another
share one transaction (one fsync), each in a savepoint of its own; a mutation that fails takes
back only its own writes; every other mutation runs alone; a group that cannot commit is run
again one by one."""

import asyncio
import sqlite3
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from controlplane.storage import events
from controlplane.storage.db import GROUP_MAX, GROUP_SECONDS, Store
from controlplane.storage.sql import Database, SqliteDatabase
from tests.conftest import execute


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = Store(tmp_path / "db.sqlite")

    def tables(db: Database) -> None:
        db.execute("CREATE TABLE marks (id INTEGER PRIMARY KEY, node TEXT NOT NULL)")
        db.execute("CREATE TABLE owners (id INTEGER PRIMARY KEY)")
        db.execute(
            "CREATE TABLE owned (id INTEGER PRIMARY KEY, owner INTEGER NOT NULL"
            " REFERENCES owners(id) DEFERRABLE INITIALLY DEFERRED)"
        )

    opened.transact(tables)
    yield opened
    opened.close()


def statements_of(store: Store) -> list[str]:
    """Every statement the writer's connection runs from now on."""
    writer = store._writer_db
    assert isinstance(writer, SqliteDatabase)
    seen: list[str] = []
    writer.conn.set_trace_callback(seen.append)
    return seen


def mark(node: str) -> Callable[[Database], str]:
    """A node's own write: a row and its event."""

    def fn(db: Database) -> str:
        db.execute("INSERT INTO marks (node) VALUES (?)", [node])
        events.append(db, "node.marked", pool_id=None, data={"node": node}, audience=["root"])
        return node

    return fn


async def behind_a_held_writer(
    store: Store, writes: list[Callable[[], Awaitable[object]]]
) -> list[object]:
    """``writes`` started while the writer thread is held by a mutation that runs alone, so
    they wait one behind the other; then the writer is let go. Their outcomes (or errors)."""
    held, release = threading.Event(), threading.Event()

    def hold(db: Database) -> None:
        held.set()
        release.wait(10)

    holding = asyncio.create_task(store.write(hold))
    await asyncio.to_thread(held.wait, 10)
    started = [asyncio.ensure_future(write()) for write in writes]
    await asyncio.sleep(0.05)  # every one is queued
    release.set()
    await holding
    return list(await asyncio.gather(*started, return_exceptions=True))


async def between_good_writes(
    store: Store, db: Path, middle: Callable[[Database], object]
) -> object:
    """``middle`` as a node's own write queued between two others, behind a held writer, so
    the three share a group: the two others are committed whatever ``middle`` does; its
    outcome (or error)."""
    outcomes = await behind_a_held_writer(
        store,
        [
            lambda: store.write(mark("a"), own_rows="a"),
            lambda: store.write(middle, own_rows="middle"),
            lambda: store.write(mark("b"), own_rows="b"),
        ],
    )
    assert outcomes[0] == "a" and outcomes[2] == "b"
    assert execute(db, "SELECT node FROM marks ORDER BY id") == [("a",), ("b",)]
    return outcomes[1]


async def test_reports_waiting_together_share_one_commit_and_keep_a_gapless_order(
    store: Store, tmp_path: Path
) -> None:
    """Twenty own-row writes queued behind another commit once, together; every row and event
    is there, the seqs gapless in the order they were queued."""
    seen = statements_of(store)
    nodes = [f"node{i}" for i in range(20)]
    outcomes = await behind_a_held_writer(
        store, [lambda n=n: store.write(mark(n), own_rows=n) for n in nodes]
    )
    assert outcomes == nodes
    assert seen.count("COMMIT") == 2  # the holder's, then the group's
    assert seen.count("SAVEPOINT mutation") == 20
    db = tmp_path / "db.sqlite"
    assert [n for (n,) in execute(db, "SELECT node FROM marks ORDER BY id")] == nodes
    rows = execute(db, "SELECT seq, data FROM events WHERE type = 'node.marked' ORDER BY seq")
    assert [seq for seq, _ in rows] == list(range(rows[0][0], rows[0][0] + 20))
    assert [data for _, data in rows] == [f'{{"node":"{n}"}}' for n in nodes]


async def test_a_failing_write_in_a_group_takes_back_only_its_own_rows(
    store: Store, tmp_path: Path
) -> None:
    """R3: the write that raises gets its error and leaves nothing; the others of its group
    are committed."""

    def fails(db: Database) -> None:
        mark("bad")(db)
        raise ValueError("refused")

    db = tmp_path / "db.sqlite"
    assert isinstance(await between_good_writes(store, db, fails), ValueError)
    seqs = [s for (s,) in execute(db, "SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))
    assert "bad" not in str(execute(db, "SELECT data FROM events"))


async def test_a_write_of_more_than_its_node_runs_alone(store: Store) -> None:
    """A mutation without own rows (a reservation, a pass) is never grouped: it ends the
    group before it and starts none."""
    seen = statements_of(store)
    outcomes = await behind_a_held_writer(
        store,
        [
            lambda: store.write(mark("a"), own_rows="a"),
            lambda: store.write(mark("b"), own_rows="b"),
            lambda: store.write(mark("alone")),
            lambda: store.write(mark("c"), own_rows="c"),
        ],
    )
    assert outcomes == ["a", "b", "alone", "c"]
    ends = [i for i, sql in enumerate(seen) if sql == "COMMIT"]
    assert len(ends) == 4  # the holder, a+b, alone, c
    alone = seen[ends[1] + 1 : ends[2] + 1]
    assert alone[0] == "BEGIN IMMEDIATE" and "SAVEPOINT mutation" not in alone


async def test_a_group_that_cannot_commit_runs_again_one_by_one(
    store: Store, tmp_path: Path
) -> None:
    """A deferred constraint fails the group's COMMIT: each mutation then runs alone, so the
    good ones are committed and only the bad one gets the error."""

    def orphan(db: Database) -> None:
        db.execute("INSERT INTO owned (id, owner) VALUES (1, 42)")  # no owner 42: at COMMIT

    db = tmp_path / "db.sqlite"
    assert isinstance(await between_good_writes(store, db, orphan), sqlite3.IntegrityError)
    assert execute(db, "SELECT count(*) FROM owned") == [(0,)]
    assert await store.write(mark("after"), own_rows="after") == "after"  # the writer goes on


async def test_a_group_closes_at_group_max_or_after_group_seconds_of_work(store: Store) -> None:
    """A group takes no more than GROUP_MAX mutations, and none once it has run for
    GROUP_SECONDS: the rest wait for the next group (each waits for its group's commit)."""
    seen = statements_of(store)
    many = [f"n{i}" for i in range(GROUP_MAX + 6)]
    assert (
        await behind_a_held_writer(
            store, [lambda n=n: store.write(mark(n), own_rows=n) for n in many]
        )
        == many
    )
    assert seen.count("COMMIT") == 3  # the holder's, GROUP_MAX of them, the last 6
    seen.clear()

    def slow(db: Database) -> str:
        time.sleep(GROUP_SECONDS * 2)
        return mark("slow")(db)

    outcomes = await behind_a_held_writer(
        store,
        [
            lambda: store.write(slow, own_rows="slow"),
            lambda: store.write(mark("b"), own_rows="b"),
            lambda: store.write(mark("c"), own_rows="c"),
        ],
    )
    assert outcomes == ["slow", "b", "c"]
    ends = [i for i, sql in enumerate(seen) if sql == "COMMIT"]
    assert len(ends) == 3  # the holder's, the slow one's, then b and c together
    assert seen[ends[0] : ends[1]].count("SAVEPOINT mutation") == 1  # slow, alone in its group
    assert seen[ends[1] : ends[2]].count("SAVEPOINT mutation") == 2  # b and c
