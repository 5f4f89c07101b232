"""What a changed nodes/report costs the writer, and rows whose JSON no longer decodes."""

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import psycopg

from controlplane.api.keys import RUNTIME
from controlplane.storage.db import WRITER_LOCK, Store, savepoint
from controlplane.storage.sql import Database, writes
from tests.conftest import Api, execute
from tests.nodes import DGX_POLICY, apply_spec, joined, pool_with_token, recorded, report, twin
from tests.statements import mutation, node_reads, writer_statements, writer_transactions

# The statements of a changed report's transaction, without the store's BEGIN and COMMIT:
# the node's row (the credential's check), its pool, the GPU's event and its audience; then in
# its reconcile's savepoint the atoms and rows, the atom's flag, the bookings' flags, and the
# node's new inventory with the rows' revision in one statement.
CHANGED_REPORT_STATEMENTS = 11
# A first report that follows another into a PostgreSQL group commit: the try of its node's
# lock, its savepoint, the credential's check, its atoms, its node's row, the release.
GROUP_FOLLOWER_STATEMENTS = 6


async def test_f8_a_changed_report_reads_its_node_once(api: Api) -> None:
    """F8: a report whose inventory changed reads its node row once in its transaction (the
    credential's check) and runs a bounded number of statements; the change is stored and
    reconciled in that same transaction (H5)."""
    _, token = await pool_with_token(api, policy=DGX_POLICY)
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    sick = msgspec.structs.replace(
        inventory,
        gpus=[
            msgspec.structs.replace(gpu, health="unhealthy", health_reasons=["xid 79"])
            if gpu.index == 0
            else gpu
            for gpu in inventory.gpus
        ],
    )
    with writer_statements(api.client.app[RUNTIME].db) as statements:
        status, answer = await report(api, node, sick)
    assert status == 200, answer
    assert len(node_reads(statements)) == 1, node_reads(statements)
    assert len(mutation(statements)) <= CHANGED_REPORT_STATEMENTS, statements
    view = await api.ok("compute/nodes/get", {"tenantId": "root", "nodeId": node["nodeId"]})
    assert [g["health"] for g in view["gpus"]][:2] == ["unhealthy", "healthy"]
    assert sum(d["unhealthy"] for d in view["devices"]) == 1


# A first join's statements without the store's framing: its token, pool, any node of the
# host's identity, the site, the new node and its row read back; its reconcile's savepoint and
# in it the rows in one statement, the atoms in one statement and the node's columns (a new
# node has no rows nor atoms to read first), and the savepoint's release; the token's use,
# the event and its audience (one statement on PostgreSQL).
FIRST_JOIN_STATEMENTS = 14


async def test_f10_a_first_join_writes_its_rows_and_atoms_in_one_statement_each(api: Api) -> None:
    """F10: a first join's cost does not grow with the host's GPUs: its node_resources rows
    and its GPU atoms (8 on a DGX) are written in one statement each, and a new node reads no
    rows, atoms nor bookings (it has none)."""
    _, token = await pool_with_token(api, policy=DGX_POLICY)
    with writer_statements(api.client.app[RUNTIME].db) as statements:
        node = await joined(api, token, recorded("dgx-h100-01"), applied=False)
    done = mutation(statements)
    assert len([sql for sql in done if sql.startswith("INSERT INTO node_devices")]) == 1, done
    assert len([sql for sql in done if sql.startswith("INSERT INTO node_resources")]) == 1, done
    assert not [sql for sql in done if "FROM reservations" in sql], done
    assert not [sql for sql in done if "FROM node_devices" in sql], done
    assert not [sql for sql in done if "FROM node_resources" in sql], done
    assert len(done) <= FIRST_JOIN_STATEMENTS, done
    view = await api.ok("compute/nodes/get", {"tenantId": "root", "nodeId": node["nodeId"]})
    assert sorted(d["resource"] for d in view["devices"]) == ["gpu"] * 8, view["devices"]


# A first report's statements without the store's framing: the node's row (the credential's
# check), its pool; in its reconcile's savepoint the atoms, then the report's and the
# reconcile's columns of the node in one statement; the node's event and its audience.
FIRST_REPORT_STATEMENTS = 8


async def test_f10_a_first_report_writes_its_node_once_and_reads_no_rows_that_cannot_move(
    api: Api,
) -> None:
    """F10, N5: the report that follows a join (its units applied, its inventory the join's)
    writes the node's row in one statement, the report's columns and its reconcile's
    together, and does not read the node_resources rows its join wrote from the same
    inventory and policy; the node is ready."""
    _, token = await pool_with_token(api, policy=DGX_POLICY)
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory, applied=False)
    ask = {"tenantId": "root", "nodeId": node["nodeId"]}
    joined_view = await api.ok("compute/nodes/get", ask)
    with writer_statements(api.client.app[RUNTIME].db) as statements:
        await apply_spec(api, node, inventory)
    done = mutation(statements)
    assert len([sql for sql in done if sql.startswith("UPDATE nodes")]) == 1, done
    assert not [sql for sql in done if "FROM node_resources" in sql], done
    assert len(done) <= FIRST_REPORT_STATEMENTS, done
    view = await api.ok("compute/nodes/get", ask)
    assert (joined_view["state"], view["state"]) == ("configuring", "ready"), view
    assert view["resources"] == joined_view["resources"], view["resources"]
    assert {r["resource"]: r["capacity"] for r in view["resources"]}["vcpu"] > 0, view


# A report's credential check in its transaction, and the pool its reconcile reads.
REPORT_GATE = "SELECT id, pool_id, hostname"
POOL_READ = "SELECT id, version, class"


@contextlib.asynccontextmanager
async def writer_held(store: Store, db_path: Any) -> AsyncIterator[None]:
    """The writer held up while the block runs, so that the mutations sent meanwhile queue:
    on SQLite its thread busy in a transaction; on PostgreSQL the event order's lock held by
    another session (own-row groups wait for it at their end)."""
    if store.postgres:
        orders = psycopg.connect(str(db_path), autocommit=False)
        try:
            orders.execute("SELECT pg_advisory_xact_lock(%s)", [WRITER_LOCK])
            yield
        finally:
            orders.rollback()
            orders.close()
        return
    entered, release = threading.Event(), threading.Event()

    def held(_: Any) -> None:
        entered.set()
        release.wait(30)

    holding = asyncio.ensure_future(store.write(held))
    try:
        assert await asyncio.to_thread(entered.wait, 10)
        yield
    finally:
        release.set()
        await holding


async def first_reports_in_groups(
    api: Api, count: int, damaged: bool = False
) -> tuple[list[Any], list[list[str]]]:
    """``count`` nodes joined to one pool, their first reports (units applied) sent while the
    writer is held until four of them queue, so that they commit in groups: the nodes, and
    the writer connections' transactions meanwhile (``writer_transactions``). ``damaged``:
    every node's stored inventory no longer decodes when the reports come."""
    _, token = await pool_with_token(api, max_uses=count, policy=DGX_POLICY)
    hosts = [twin("dgx-h100-01", n) for n in range(count)]
    nodes = [await joined(api, token, host, applied=False) for host in hosts]
    if damaged:
        execute(
            api.client.app[RUNTIME].config.db_path, "UPDATE nodes SET inventory = '{\"gpus\": ['"
        )
    store = api.client.app[RUNTIME].db
    waiting = store._own_waiting if store.postgres else store._waiting  # what queues reports
    with writer_transactions(store) as transactions:
        async with writer_held(store, api.client.app[RUNTIME].config.db_path):
            reports = [
                asyncio.ensure_future(apply_spec(api, node, host))
                for node, host in zip(nodes, hosts, strict=True)
            ]
            # Four queued: however two own-row writers take them, one commits two or more.
            for _ in range(500):  # bounded: 10 s
                if len(waiting) >= 4:
                    break
                await asyncio.sleep(0.02)
        await asyncio.gather(*reports)
    return nodes, transactions


async def test_f10_first_reports_committed_together_read_their_pool_once(api: Api) -> None:
    """F10: the first reports of one pool's nodes that wait behind the writer share group
    commits, and each transaction reads the pool once, not once a report; every node is
    ready."""
    nodes, transactions = await first_reports_in_groups(api, 12)
    reporting = [
        t for t in transactions if any(sql.startswith(REPORT_GATE) for sql in t)
    ]  # the transactions that took a report, each a group of one or more
    assert sum(sum(sql.startswith(REPORT_GATE) for sql in t) for t in reporting) == len(nodes)
    assert max(sum(sql.startswith(REPORT_GATE) for sql in t) for t in reporting) >= 2
    for t in reporting:
        assert sum(sql.startswith(POOL_READ) for sql in t) == 1, t
    for node in nodes:
        view = await api.ok("compute/nodes/get", {"tenantId": "root", "nodeId": node["nodeId"]})
        assert view["state"] == "ready", view


def test_r5_a_savepoint_right_inside_an_untouched_one_is_that_one(db: Any) -> None:
    """R5, F10: a step's savepoint taken right inside a group member's, with only reads
    between (the member's gate), is the member's: a failure rolls back to it, undoing the
    same, and no SAVEPOINT or RELEASE of its own runs. Once anything was written there, the
    step takes a savepoint of its own, and its failure keeps what came before it."""
    store = Store(db)

    def tenant(d: Database, name: str) -> None:
        d.execute("INSERT INTO tenants (id, created_at) VALUES (?, 'now')", [name])

    def member(d: Database) -> None:
        d.execute("SAVEPOINT mutation")
        d.clean_savepoint = "mutation"  # as the store sets it for each member of a group
        d.execute("SELECT count(*) FROM tenants")  # a read: still untouched
        with contextlib.suppress(RuntimeError), savepoint(d):
            tenant(d, "undone")
            raise RuntimeError("this step fails")
        with savepoint(d):  # untouched again: the same savepoint, kept
            tenant(d, "kept")
        with contextlib.suppress(RuntimeError), savepoint(d):  # a savepoint of its own
            tenant(d, "undone too")
            raise RuntimeError("this step fails")
        d.execute("RELEASE mutation")

    try:
        with writer_statements(store) as statements:
            store._transact(member)
    finally:
        store.close()
    assert execute(db, "SELECT id FROM tenants") == [("kept",)]
    controls = [sql for sql in statements if sql.split()[0] in ("SAVEPOINT", "ROLLBACK", "RELEASE")]
    assert controls == [
        "SAVEPOINT mutation",
        "ROLLBACK TO mutation",
        "SAVEPOINT unit",
        "ROLLBACK TO unit",
        "RELEASE unit",
        "RELEASE mutation",
    ], controls


async def test_f10_a_first_report_in_a_group_takes_no_savepoint_of_its_own(api: Api) -> None:
    """F10: in a group commit, a first report's reconcile runs in its member's savepoint:
    on PostgreSQL each report after the group's first costs its node's lock, its savepoint,
    its credential's check, its atoms, its node's write and the savepoint's release."""
    _, transactions = await first_reports_in_groups(api, 8)
    store = api.client.app[RUNTIME].db
    groups = [t for t in transactions if sum(sql.startswith(REPORT_GATE) for sql in t) >= 2]
    assert groups, transactions
    for group in groups:
        assert "SAVEPOINT unit" not in group, group
        if store.postgres:
            reports_in = sum(sql.startswith(REPORT_GATE) for sql in group)
            # the first: BEGIN, its locks, savepoint, gate, pool, atoms, write, release;
            # the group's end: the writer lock, the events, COMMIT
            assert len(group) == 8 + GROUP_FOLLOWER_STATEMENTS * (reports_in - 1) + 3, group


async def test_r5_group_members_whose_reconcile_fails_are_quarantined_with_their_reports(
    api: Api,
) -> None:
    """R5: in a group commit, a first report whose reconcile fails (its stored inventory no
    longer decodes) is rolled back to its member's savepoint, which its reconcile shares;
    then its report's columns are written and its node is quarantined with the reason, in
    the group's one transaction with the other members'."""
    nodes, transactions = await first_reports_in_groups(api, 8, damaged=True)
    groups = [t for t in transactions if sum(sql.startswith(REPORT_GATE) for sql in t) >= 2]
    assert groups, transactions
    for group in groups:
        reports_in = sum(sql.startswith(REPORT_GATE) for sql in group)
        assert group.count("ROLLBACK TO mutation") == reports_in, group
    db_path = api.client.app[RUNTIME].config.db_path
    rows = execute(db_path, "SELECT state, state_reason, applied FROM nodes")
    assert len(rows) == len(nodes)
    for state, reason, applied in rows:
        assert state == "quarantined" and reason.startswith("cannot be reconciled"), reason
        assert applied, "the report's columns are written"


def test_r5_only_a_plain_read_leaves_a_savepoint_untouched() -> None:
    """R5: what may change what a rollback to a savepoint undoes: any statement but a plain
    SELECT, a SELECT of PostgreSQL's functions (a lock taken, a notice sent), and one that
    locks rows."""
    assert not writes("SELECT id, version FROM pools WHERE id = ?")
    for sql in (
        "UPDATE nodes SET state = ?",
        "INSERT INTO events (seq) VALUES (?)",
        "DELETE FROM node_devices WHERE node_id = ?",
        "SAVEPOINT unit",
        "SELECT pg_try_advisory_xact_lock(?, hashtext(?))",
        "SELECT id FROM pools WHERE id = ? FOR UPDATE",
        "SELECT id FROM pools WHERE id = ?\nFOR  NO KEY UPDATE",
        "SELECT id FROM nodes WHERE id = ? for share",
        "SELECT set_config('bc.x', 'y', true)",
        "WITH top AS (SELECT 1) INSERT INTO events SELECT * FROM top",
    ):
        assert writes(sql), sql
