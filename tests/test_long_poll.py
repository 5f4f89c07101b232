"""B2: events/list long-polls, woken by the commit of an event the caller may see."""

import asyncio
import time

from tests.conftest import Api


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
