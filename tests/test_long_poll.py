"""B2: events/list long-polls, woken by the commit of an event the caller may see."""

import asyncio
import contextlib
import json
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from controlplane.storage import events as storage_events
from controlplane.storage.commits import parse_notice
from controlplane.storage.db import Store, savepoint
from tests.conftest import Api
from tests.daemons import Daemon
from tests.test_paging import A100_ONLY


async def tail(api: Api, token: str | None = None, tenant: str = "root") -> int:
    answer = await api.ok("compute/events/list", {"tenantId": tenant, "limit": 1000}, token)
    while answer["items"]:
        answer = await api.ok(
            "compute/events/list", {"tenantId": tenant, "after": answer["next"]}, token
        )
    return int(answer["next"])


async def test_b2_a_long_poll_answers_with_the_event_committed_while_it_waits(api: Api) -> None:
    site = await api.site()
    after = await tail(api)
    waiting = asyncio.create_task(
        api.ok("compute/events/list", {"tenantId": "root", "after": after, "waitSeconds": 30})
    )
    await asyncio.sleep(0.2)
    assert not waiting.done()  # nothing new yet: it waits rather than answering empty
    started = time.monotonic()
    pool = await api.pool(site)
    answer = await asyncio.wait_for(waiting, 10)
    assert time.monotonic() - started < 10  # woken by the commit, not by its deadline
    assert [e["type"] for e in answer["items"]] == ["pool.created"]
    assert answer["items"][0]["poolId"] == pool["id"]
    assert answer["next"] == answer["items"][0]["seq"]


async def test_b2_an_event_the_caller_may_not_see_does_not_end_its_wait(api: Api) -> None:
    """acme waits; root's pool events are not acme's: acme's call answers empty at its
    deadline, with a cursor past what it could not see, then sees its own offer's event."""
    await api.tenant("acme")
    acme = await api.token_for("acme")
    site = await api.site()
    after = await tail(api, acme, "acme")
    body = {"tenantId": "acme", "after": after, "waitSeconds": 1.0}
    waiting = asyncio.create_task(api.ok("compute/events/list", body, acme))
    await asyncio.sleep(0.1)
    pool = await api.pool(site)  # root's event, not shown to acme
    started = time.monotonic()
    answer = await asyncio.wait_for(waiting, 10)
    assert answer["items"] == []
    assert time.monotonic() - started > 0.5  # it waited on past root's commit
    body = {"tenantId": "acme", "after": answer["next"], "waitSeconds": 30}
    waiting = asyncio.create_task(api.ok("compute/events/list", body, acme))
    await asyncio.sleep(0.1)
    await api.offer(pool["id"], "acme")
    answer = await asyncio.wait_for(waiting, 10)
    assert [e["type"] for e in answer["items"]] == ["pool.offered"]


async def test_b2_an_event_already_there_is_answered_at_once_and_zero_never_waits(
    api: Api,
) -> None:
    await api.site()
    answer = await api.ok("compute/events/list", {"tenantId": "root", "waitSeconds": 60})
    assert answer["items"]  # site.created was there: no wait
    after = answer["next"]
    started = time.monotonic()
    empty = await api.ok("compute/events/list", {"tenantId": "root", "after": after})
    assert empty == {"items": [], "next": after}
    assert time.monotonic() - started < 5


async def test_b2_wait_seconds_outside_0_to_60_is_invalid(api: Api) -> None:
    for wait in (-1, 61, "5", True):
        body = {"tenantId": "root", "waitSeconds": wait}
        await api.err("compute/events/list", body, "INVALID_INPUT", field="waitSeconds")


async def test_b2_a_long_poll_reads_past_events_it_may_not_see_to_the_one_it_may(
    api: Api,
) -> None:
    """A credential that may read only A100 pools long-polls two events a page: three H100
    events it may not see come before an A100 one it may; the call answers with that one at
    once (it reads on past the hidden pages) instead of waiting out its time."""
    await api.tenant("acme")
    narrow = await api.token_for("acme", A100_ONLY)
    site = await api.site()
    after = await tail(api, narrow, "acme")
    h100 = [await api.pool(site, gpuModel="H100") for _ in range(3)]
    for pool in h100:
        await api.offer(pool["id"], "acme")  # acme's events, of pools it may not read
    a100 = await api.pool(site, gpuModel="A100")
    await api.offer(a100["id"], "acme")
    body = {"tenantId": "acme", "after": after, "limit": 2, "waitSeconds": 30}
    started = time.monotonic()
    answer = await asyncio.wait_for(api.ok("compute/events/list", body, narrow), 10)
    assert time.monotonic() - started < 10
    assert [(e["type"], e["poolId"]) for e in answer["items"]] == [("pool.offered", a100["id"])]


def test_b2_a_stopping_daemon_answers_its_long_polls_at_once(tmp_path: Path) -> None:
    """SIGTERM with a long-poll waiting: the call gets its (empty) page and the daemon is gone
    well before the wait would have ended."""
    daemon = Daemon(tmp_path)
    daemon.start()
    try:
        headers = {"Authorization": f"Bearer {daemon.token}", "Content-Type": "application/json"}
        first = json.dumps({"tenantId": "root", "limit": 1000}).encode()
        request = urllib.request.Request(f"{daemon.url}/api/compute/events/list", first, headers)
        after = json.load(urllib.request.urlopen(request, timeout=10))["next"]
        body = json.dumps({"tenantId": "root", "after": after, "waitSeconds": 60}).encode()
        request = urllib.request.Request(f"{daemon.url}/api/compute/events/list", body, headers)
        answers: list[object] = []
        waiter = threading.Thread(
            target=lambda: answers.append(json.load(urllib.request.urlopen(request, timeout=90)))
        )
        waiter.start()
        time.sleep(0.5)
        started = time.monotonic()
        assert daemon.stop() == 0
        waiter.join(10)
        assert time.monotonic() - started < 10
        assert answers == [{"items": [], "next": after}]
    finally:
        daemon.kill()


async def test_b2_b6_other_tenants_commits_cost_a_waiting_call_no_read(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """acme waits; five commits of root's own events wake no read of acme's page (a commit
    says whose events it holds, also across replicas in its NOTIFY); acme's own event does."""
    await api.tenant("acme")
    acme = await api.token_for("acme")
    site = await api.site()
    after = await tail(api, acme, "acme")
    reads: list[str | None] = []
    list_events = storage_events.list_events

    def counted(db: Any, *, tenant_id: str | None, **kwargs: Any) -> Any:
        reads.append(tenant_id)
        return list_events(db, tenant_id=tenant_id, **kwargs)

    monkeypatch.setattr(storage_events, "list_events", counted)
    body = {"tenantId": "acme", "after": after, "waitSeconds": 30}
    waiting = asyncio.create_task(api.ok("compute/events/list", body, acme))
    await asyncio.sleep(0.2)
    pools = [await api.pool(site) for _ in range(5)]
    await asyncio.sleep(0.2)
    assert reads == ["acme"]  # the first read only
    await api.offer(pools[0]["id"], "acme")
    answer = await asyncio.wait_for(waiting, 10)
    assert [e["type"] for e in answer["items"]] == ["pool.offered"]
    assert reads == ["acme", "acme"]


def test_b2_a_commit_notice_names_its_tenants_or_stands_for_everyone() -> None:
    assert parse_notice("42:acme,root") == (42, frozenset({"acme", "root"}))
    assert parse_notice("42:") == (42, frozenset())
    assert parse_notice("42") == (42, None)  # too many to name, or an older replica
    assert parse_notice("not ours") == (0, None)


def test_b2_an_event_undone_in_a_savepoint_is_not_told_of(db: Any) -> None:
    """R5's savepoints undo a failed node's or reservation's step, its events included: the
    commit then tells long-polls of no event (an undone seq is the next event's)."""
    store = Store(db)
    try:

        def step_fails(d: Any) -> None:
            with contextlib.suppress(RuntimeError), savepoint(d):
                storage_events.append(d, "site.created", pool_id=None, data={}, audience=["root"])
                raise RuntimeError("this step fails")

        assert store._transact(step_fails)[1:] == (0, frozenset())
    finally:
        store.close()
