"""B5, R3, F10 on PostgreSQL's group commit: mutations of one node's own rows waiting behind
one another on a replica share one transaction (the event order's lock taken, and the WAL
flushed, once), each in a savepoint holding its node's lock; a mutation that fails takes back
only its own rows and events; one whose node another transaction holds, or that must run
alone, runs on its own after the group; the event order stays gapless."""

import asyncio
from collections.abc import Iterator

import psycopg
import pytest

from controlplane.storage import events
from controlplane.storage.commits import parse_notice
from controlplane.storage.db import (
    EVENTS_CHANNEL,
    NODE_LOCK,
    NOTICE_MAX,
    WRITER_LOCK,
    RunAlone,
    Store,
)
from controlplane.storage.sql import Database
from tests.conftest import execute
from tests.statements import writer_statements
from tests.test_group_commit import mark


@pytest.fixture
def store(postgres_url: str) -> Iterator[Store]:
    opened = Store(postgres_url)
    opened.transact(
        lambda db: db.execute("CREATE TABLE marks (id SERIAL PRIMARY KEY, node TEXT NOT NULL)")
    )
    yield opened
    opened.close()


async def behind_the_event_order(
    postgres_url: str, store: Store, writes: list[tuple[str, object]]
) -> list[object]:
    """Each ``(node, fn)`` written as that node's own rows, all started while another session
    holds WRITER_LOCK (so they queue behind the writers' first transactions); their outcomes."""
    orders = psycopg.connect(postgres_url, autocommit=False)
    try:
        orders.execute("SELECT pg_advisory_xact_lock(%s)", [WRITER_LOCK])
        started = [asyncio.ensure_future(store.write(fn, own_rows=n)) for n, fn in writes]  # type: ignore[arg-type]
        await asyncio.sleep(0.3)  # every one is queued or in a group waiting for the lock
    finally:
        orders.rollback()
        orders.close()
    return list(await asyncio.gather(*started, return_exceptions=True))


async def test_b5_own_row_writes_waiting_together_share_commits_and_keep_a_gapless_order(
    store: Store, postgres_url: str
) -> None:
    """Forty own-row writes at once on one replica commit in far fewer transactions than
    forty, each transaction's events (and their audience rows, and its NOTIFY) appended in one
    statement; every row and event is there, the seqs gapless."""
    nodes = [f"node{i}" for i in range(40)]
    with writer_statements(store) as seen:
        outcomes = await behind_the_event_order(postgres_url, store, [(n, mark(n)) for n in nodes])
    assert outcomes == nodes
    commits = seen.count("COMMIT")
    assert 1 <= commits <= 10, commits  # a few groups, not one per write
    appends = [sql for sql in seen if "INSERT INTO events" in sql]
    assert len(appends) == commits, appends
    assert not [sql for sql in seen if "event_audience" in sql and sql not in appends], seen
    assert not [sql for sql in seen if sql.startswith("SELECT pg_notify")], seen
    audience = execute(postgres_url, "SELECT tenant_id, seq FROM event_audience ORDER BY seq")
    assert audience == [("root", seq) for seq in range(1, 41)]
    assert sorted(n for (n,) in execute(postgres_url, "SELECT node FROM marks")) == sorted(nodes)
    rows = execute(postgres_url, "SELECT seq, data FROM events ORDER BY seq")
    assert [seq for seq, _ in rows] == list(range(1, 41))
    assert sorted(data for _, data in rows) == sorted(f'{{"node":"{n}"}}' for n in nodes)


async def test_r3_a_failing_write_in_a_group_takes_back_only_its_rows_and_events(
    store: Store, postgres_url: str
) -> None:
    """R3: the write that raises gets its error and leaves no row and no event; the others,
    one needing to run alone among them, are committed with a gapless order."""

    def fails(db: Database) -> None:
        mark("bad")(db)
        raise ValueError("refused")

    def alone(db: Database) -> str:
        if db.own_rows is not None:  # as a re-join that writes more than its node's rows
            raise RunAlone
        return mark("alone")(db)

    writes: list[tuple[str, object]] = [(f"n{i}", mark(f"n{i}")) for i in range(12)]
    writes[4] = ("bad", fails)
    writes[7] = ("alone", alone)
    outcomes = await behind_the_event_order(postgres_url, store, writes)
    assert isinstance(outcomes[4], ValueError)
    assert outcomes[7] == "alone"
    assert [o for i, o in enumerate(outcomes) if i not in (4, 7)] == [
        f"n{i}" for i in range(12) if i not in (4, 7)
    ]
    stored = {n for (n,) in execute(postgres_url, "SELECT node FROM marks")}
    assert "bad" not in stored and len(stored) == 11
    seqs = [s for (s,) in execute(postgres_url, "SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, 12))
    assert "bad" not in str(execute(postgres_url, "SELECT data FROM events"))


async def test_f10_a_follower_whose_node_is_held_is_not_waited_for_by_its_group(
    store: Store, postgres_url: str
) -> None:
    """A queued write whose node's lock another session holds does not hold back the group it
    joins: the groups form while the event order's lock is held elsewhere, then every other
    write commits while that node is still held, and it commits once its node is released."""
    holder = psycopg.connect(postgres_url, autocommit=True)
    try:
        holder.execute("SELECT pg_advisory_lock(%s, hashtext(%s))", [NODE_LOCK, "held"])
        holder.execute("SELECT pg_advisory_lock(%s)", [WRITER_LOCK])
        writes = [(f"n{i}", mark(f"n{i}")) for i in range(12)]
        writes.insert(8, ("held", mark("held")))  # behind the writer threads' first ones
        started = [asyncio.ensure_future(store.write(fn, own_rows=n)) for n, fn in writes]
        await asyncio.sleep(0.3)  # the groups formed, each waiting for the event order
        holder.execute("SELECT pg_advisory_unlock(%s)", [WRITER_LOCK])
        others = [task for (n, _), task in zip(writes, started, strict=True) if n != "held"]
        done = await asyncio.wait_for(asyncio.gather(*others), 10)
        assert done == [f"n{i}" for i in range(12)]
        assert not started[8].done()
    finally:
        holder.close()  # its node's lock goes with its session
    assert await asyncio.wait_for(started[8], 10) == "held"
    seqs = [s for (s,) in execute(postgres_url, "SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, 14))


async def test_b5_a_write_that_shares_a_row_with_its_kind_commits_alone(
    store: Store, postgres_url: str
) -> None:
    """A write that also writes a row others of its kind write (a join token's uses) is never
    grouped on PostgreSQL: ten of them queued together commit in ten transactions, so none
    holds that row while a whole group runs."""
    with writer_statements(store) as seen:
        started = [
            asyncio.ensure_future(store.write(mark(f"j{i}"), own_rows=f"j{i}", shares_rows=True))
            for i in range(10)
        ]
        assert await asyncio.gather(*started) == [f"j{i}" for i in range(10)]
    assert seen.count("COMMIT") == 10
    assert seen.count("SAVEPOINT mutation") == 0


def test_b2_a_commit_names_its_events_audience_to_the_long_polls_or_everyone_when_too_many(
    store: Store, postgres_url: str
) -> None:
    """B2: the NOTIFY a commit sends with its events names its last seq and the tenants that
    may see them; past what a payload holds it names the seq alone (news to everyone), and
    the listeners read both."""
    listener = psycopg.connect(postgres_url, autocommit=True)
    try:
        listener.execute(f"LISTEN {EVENTS_CHANNEL}")
        few = ["acme", "root"]
        many = [f"tenant-{n:05d}" for n in range(NOTICE_MAX // 10)]  # 12 bytes a name
        for audience in (few, many):
            store.transact(
                lambda db, audience=audience: events.append(
                    db, "node.marked", pool_id=None, data={}, audience=audience
                )
            )
        payloads = [notify.payload for notify in listener.notifies(timeout=5, stop_after=2)]
    finally:
        listener.close()
    assert payloads == ["1:acme,root", "2"]
    assert [parse_notice(p) for p in payloads] == [(1, frozenset(few)), (2, None)]
    rows = execute(postgres_url, "SELECT count(*) FROM event_audience WHERE seq = 2")
    assert rows == [(len(many),)]
