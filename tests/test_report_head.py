"""F9: a small heartbeat is decided on its node's head (the small columns its credential
resolves to), never on the large ones; a credential that ends is refused at its next report."""

import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from controlplane.api.keys import RUNTIME
from controlplane.storage import nodes as node_sql
from controlplane.storage.db import Store, now
from controlplane.storage.nodes import mark_lost, update_node
from controlplane.storage.sql import PostgresDatabase
from tests.conftest import Api
from tests.nodes import joined, pool_with_token, recorded
from tests.statements import writer_statements

LARGE_COLUMNS = re.compile(r"\b(inventory|spec|topology|bookings)\b")


@contextmanager
def reader_statements(store: Store) -> Iterator[list[str]]:
    """The statements a write's first step executes while the block runs: on SQLite on the
    loop's reader, on PostgreSQL on the short readers' threads."""
    seen: list[str] = []
    if store.postgres:
        run = PostgresDatabase.execute

        def on_short_reader(db: PostgresDatabase, sql: str, *args: Any) -> Any:
            if threading.current_thread().name.startswith("short-reader"):
                seen.append(sql)
            return run(db, sql, *args)

        PostgresDatabase.execute = on_short_reader  # type: ignore[method-assign]
        try:
            yield seen
        finally:
            PostgresDatabase.execute = run  # type: ignore[method-assign]
        return
    db = store.reader
    run_here = db.execute

    def counted(sql: str, *args: Any) -> Any:
        seen.append(sql)
        return run_here(sql, *args)

    db.execute = counted  # type: ignore[method-assign]
    try:
        yield seen
    finally:
        del db.execute


async def digest_report(api: Api, node: dict[str, Any], digest: str) -> tuple[int, Any]:
    response = await api.client.post(
        "/api/compute/nodes/report",
        json={"nodeId": node["nodeId"], "inventoryDigest": digest},
        headers={"Authorization": f"Bearer {node['token']}"},
    )
    return response.status, await response.json()


async def test_f9_a_heartbeat_reads_no_large_column_and_an_ended_credential_is_refused_at_once(
    api: Api,
) -> None:
    """F9: a digest report that brings nothing new reads its node's small columns only (no
    inventory, spec, topology or bookings) and writes nothing; a credential replaced by a
    re-join, then the node's removal, refuse the very next report (401), changing nothing."""
    _, token = await pool_with_token(api, max_uses=2)
    inventory = recorded("dgx-h100-01")
    first = await joined(api, token, inventory)
    digest = first["inventoryDigest"]
    store = api.client.app[RUNTIME].db
    with reader_statements(store) as reads, writer_statements(store) as writes:
        status, answer = await digest_report(api, first, digest)
    assert status == 200, answer
    assert answer["inventoryDigest"] == digest and answer["inventoryWanted"] is False
    assert writes == []  # nothing new: no transaction at all
    node_reads = [sql for sql in reads if re.search(r"\bFROM nodes\b", sql)]
    assert len(node_reads) == 1, reads
    # Outside a transaction on both backends: one statement, one round trip on PostgreSQL.
    assert not [sql for sql in reads if sql.startswith(("BEGIN", "COMMIT"))], reads
    assert not [sql for sql in node_reads if LARGE_COLUMNS.search(sql.split("FROM")[0])], reads

    again = await joined(api, token, inventory)  # a new credential for the same node
    assert again["nodeId"] == first["nodeId"] and again["token"] != first["token"]
    status, answer = await digest_report(api, first, digest)
    assert (status, answer["error"]["code"]) == (401, "UNAUTHENTICATED")
    status, answer = await digest_report(api, again, again["inventoryDigest"])
    assert status == 200, answer

    await api.ok(
        "compute/nodes/remove", {"tenantId": "root", "nodeId": again["nodeId"], "force": True}
    )
    with writer_statements(store) as writes:
        status, answer = await digest_report(api, again, again["inventoryDigest"])
    assert (status, answer["error"]["code"]) == (401, "UNAUTHENTICATED")
    assert writes == []


async def test_f9_a_kept_head_answers_heartbeats_until_a_write_of_its_columns_drops_it(
    api: Api,
) -> None:
    """F9: on SQLite a heartbeat's head is kept, so the next one reads no database at all;
    any write of the head's columns drops it, in that very transaction: a node marked lost
    is brought back by its next heartbeat, and a spec version moved is the one answered."""
    _, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    digest = node["inventoryDigest"]
    store = api.client.app[RUNTIME].db
    status, answer = await digest_report(api, node, digest)
    assert status == 200, answer
    with reader_statements(store) as reads, writer_statements(store) as writes:
        status, answer = await digest_report(api, node, digest)
    assert status == 200 and answer["inventoryWanted"] is False, answer
    assert writes == []
    # PostgreSQL reads its heads every time (other replicas write them), in one statement.
    assert len(reads) == (1 if store.postgres else 0), reads

    store.transact(lambda db: mark_lost(db, [node["nodeId"]], now()))
    with writer_statements(store) as writes:
        status, answer = await digest_report(api, node, digest)
    assert status == 200, answer
    assert writes, "a lost node's heartbeat is written: it is back"
    view = await api.ok("compute/nodes/get", {"tenantId": "root", "nodeId": node["nodeId"]})
    assert view["state"] != "lost"

    moved = "9" * 16
    store.transact(lambda db: update_node(db, node["nodeId"], {"spec_version": moved}))
    status, answer = await digest_report(api, node, digest)
    assert (status, answer["specVersion"]) == (200, moved)


async def test_f9_a_head_read_while_a_write_of_it_commits_is_not_kept(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """F9: a head read on the loop while the writer commits a change to it may be the row from
    before that commit: it answers that heartbeat but is not kept, so the next one reads
    the committed row (here the commit lands between the read and its keeping)."""
    store = api.client.app[RUNTIME].db
    _, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    moved = "8" * 16
    read = node_sql.head_for_token

    def read_then_commit(db: Any, hashed: bytes) -> Any:
        found = read(db, hashed)
        store.transact(lambda w: update_node(w, node["nodeId"], {"spec_version": moved}))
        return found

    monkeypatch.setattr(node_sql, "head_for_token", read_then_commit)
    status, before = await digest_report(api, node, node["inventoryDigest"])
    assert status == 200 and before["specVersion"] != moved, before
    monkeypatch.setattr(node_sql, "head_for_token", read)
    status, after = await digest_report(api, node, node["inventoryDigest"])
    assert (status, after["specVersion"]) == (200, moved)
