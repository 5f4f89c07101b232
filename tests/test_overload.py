"""F10: overload sheds early (503 UNAVAILABLE with Retry-After, never a timeout or a 500), and
the silence it causes, on this replica or another, never makes a healthy node lost."""

import asyncio
import dataclasses
import time
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp

from controlplane.api.keys import RUNTIME
from controlplane.app import make_app
from controlplane.capacity.liveness import STAMPS_PER_GRACE, Liveness
from controlplane.config import Config
from controlplane.metrics import Metrics
from controlplane.overload import SHED_RETRY_AFTER_S, Overload, next_retry_after
from controlplane.reconciler import run_reconciler
from controlplane.runtime import Runtime
from controlplane.storage.db import Store, epoch, is_postgres
from controlplane.storage.leader import Leadership
from controlplane.storage.liveness import LivenessStore
from tests.conftest import Api, execute
from tests.daemons import Daemon
from tests.nodes import joined, pool_with_token, recorded, report, twin

LOST_AFTER = 1.0  # --node-lost-after here: reports every 0.1 s keep a node alive
STORM = 120  # requests at once against --max-inflight 2


async def test_f10_a_storm_is_shed_with_retry_after_never_a_timeout(
    tmp_path: Path, db: Any
) -> None:
    """F10: against --max-inflight 2, a storm of writes at once is answered in full: 200s and
    503 UNAVAILABLE with Retry-After, no 500 and no timeout; /healthz, /readyz and /metrics
    are never shed; what was shed wrote nothing (one pool per 200)."""
    (tmp_path / "data").mkdir()
    daemon = Daemon(tmp_path, "--max-inflight", "2", db=str(db) if is_postgres(db) else None)
    daemon.start()
    try:
        headers = {"Authorization": f"Bearer {daemon.token}"}
        timeout = aiohttp.ClientTimeout(total=60)
        connector = aiohttp.TCPConnector(limit=STORM + 3)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            async with session.post(
                f"{daemon.url}/api/compute/sites/create",
                json={"tenantId": "root", "name": "fra1", "region": "eu", "kind": "shared"},
                headers=headers,
            ) as response:
                site = await response.json()
                assert response.status == 200, site

            async def create(n: int) -> tuple[int, str | None, str]:
                body = {"tenantId": "root", "siteId": site["id"], "class": "metal-host"}
                async with session.post(
                    f"{daemon.url}/api/compute/pools/create", json=body, headers=headers
                ) as answer:
                    found = await answer.json()
                    code = found["error"]["code"] if answer.status != 200 else "OK"
                    return answer.status, answer.headers.get("Retry-After"), code

            async def probe(path: str) -> tuple[int, str | None, str]:
                async with session.get(f"{daemon.url}{path}", headers=headers) as answer:
                    await answer.read()
                    return answer.status, None, path

            storm = [create(n) for n in range(STORM)]
            probes = [probe(p) for p in ("/healthz", "/readyz", "/metrics")]
            outcomes = await asyncio.gather(*storm[:60], *probes, *storm[60:])
        made = [o for o in outcomes if o[2] == "OK"]
        shed = [o for o in outcomes if o[0] == 503]
        assert sorted(o for o in outcomes if o[2].startswith("/")) == [
            (200, None, "/healthz"),
            (200, None, "/metrics"),
            (200, None, "/readyz"),
        ]
        assert len(made) + len(shed) + 3 == len(outcomes), Counter(o[:1] for o in outcomes)
        assert made and shed
        assert {o[2] for o in shed} == {"UNAVAILABLE"}
        # Whole seconds, from the least to the cap at the default 90 s grace and 30 s passes.
        waits = {int(o[1]) for o in shed if o[1] is not None and o[1].isdigit()}
        assert len(waits) == len({o[1] for o in shed}), shed
        assert min(waits) >= SHED_RETRY_AFTER_S and max(waits) <= 22, waits
        location = db if is_postgres(db) else tmp_path / "data" / "bc.db"
        assert execute(location, "SELECT count(*) FROM pools") == [(len(made),)]
    finally:
        daemon.kill()


async def hold_the_only_slot(api: Api) -> asyncio.StreamWriter:
    """A request whose body has not all arrived: it holds its admission slot meanwhile."""
    server = api.client.server
    _, writer = await asyncio.open_connection(server.host, server.port)
    writer.write(
        b"POST /api/compute/pools/list HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"
    )
    await writer.drain()
    return writer


async def lost_events(api: Api) -> list[dict[str, Any]]:
    found = await api.ok("compute/events/list", {"tenantId": "root", "types": ["node.lost"]})
    return list(found["items"])


async def test_f10_a_node_whose_reports_were_shed_is_not_lost(
    config: Config, aiohttp_client: Any
) -> None:
    """F10: while every report of a node is shed for longer than --node-lost-after, and for
    a grace period after, it is not lost; a node silent all along is lost, but no earlier than
    a grace period after the last request the replica shed."""
    fast = dataclasses.replace(
        config, reconcile_interval=0.05, node_lost_after=LOST_AFTER, max_inflight=1
    )
    client = await aiohttp_client(make_app(fast))
    api = Api(client, fast.root_token_file.read_text().strip())
    _, token = await pool_with_token(api)
    shed, silent = twin("dgx-h100-01", 1), twin("dgx-h100-01", 2)
    nodes = [(await joined(api, token, inventory), inventory) for inventory in (shed, silent)]
    for node, inventory in nodes:
        assert (await report(api, node, inventory))[0] == 200

    hog = await hold_the_only_slot(api)
    until = time.monotonic() + 2.5 * LOST_AFTER
    while time.monotonic() < until:
        last_shed = time.time()
        status, answer = await report(api, *nodes[0])
        assert status == 503 and answer["error"]["code"] == "UNAVAILABLE", answer
        await asyncio.sleep(0.1)
    hog.close()
    overload = client.app[RUNTIME].overload
    for _ in range(1000):  # until the server has seen the hog leave
        if not overload.inflight:
            break
        await asyncio.sleep(0.01)
    assert overload.inflight == 0

    assert await lost_events(api) == []
    deadline = time.monotonic() + 10
    while not await lost_events(api):
        assert time.monotonic() < deadline, "the silent node was never marked lost"
        status, _ = await report(api, *nodes[0])
        assert status == 200
        await asyncio.sleep(0.1)
    [event] = await lost_events(api)
    assert event["data"]["nodeId"] == nodes[1][0]["nodeId"]
    assert epoch(event["at"]) - last_shed >= LOST_AFTER - 0.01
    states = dict(execute(fast.db_path, "SELECT id, state FROM nodes"))
    assert states == {nodes[0][0]["nodeId"]: "ready", nodes[1][0]["nodeId"]: "lost"}


class Follows(Leadership):
    """A replica that never leads."""

    def holds(self) -> bool:
        return False


async def test_f10_a_follower_that_sheds_holds_the_leaders_lost_check_back(
    api: Api, db: Path | str
) -> None:
    """F10, B4: a follower that shed a request records it in the database; the leader marks
    no node lost until a grace period after that, though the node's stamps are long stale and
    the leader itself was never behind; then the node is lost."""
    _, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    execute(db, "UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z'")
    follower, leader = Overload(max_inflight=0), Overload()
    follower.behind_at = leader.behind_at = 0.0  # long running, never behind so far
    assert not follower.admit()  # shed: behind from now on
    shed_at = follower.behind_at
    stores = [Store(db), Store(db)]
    stamps = LivenessStore(db)

    def reconciler(store: Store, leadership: Leadership, overload: Overload) -> Any:
        started = time.monotonic() - 100  # both started long ago
        return run_reconciler(
            store, Liveness(), 0.05, LOST_AFTER, started, Metrics.create(), leadership, overload
        )

    tasks = [asyncio.create_task(reconciler(stores[0], Follows(db), follower))]
    try:
        deadline = time.monotonic() + 10
        while await stamps.run(stamps.last_behind, 0) is None:
            assert time.monotonic() < deadline, "the follower never recorded it was behind"
            await asyncio.sleep(0.02)
        tasks.append(asyncio.create_task(reconciler(stores[1], Leadership(db), leader)))
        while not await lost_events(api):
            assert time.monotonic() < deadline, "the silent node was never marked lost"
            await asyncio.sleep(0.05)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        stamps.close()
        for store in stores:
            store.close()
    [event] = await lost_events(api)
    assert event["data"]["nodeId"] == node["nodeId"]
    assert epoch(event["at"]) - shed_at >= LOST_AFTER - 0.01


async def test_f10_mutations_are_shed_while_the_writer_is_behind_reads_are_not(
    config: Config, aiohttp_client: Any
) -> None:
    """F10: while the oldest mutation waiting for the writer has waited past --max-write-wait,
    a new mutation is answered 503 UNAVAILABLE with Retry-After at once (not queued behind it),
    a read is answered; once the writer catches up, the waiting one commits and mutations are
    taken again."""
    app = make_app(dataclasses.replace(config, max_write_wait=0.2))
    client = await aiohttp_client(app)
    api = Api(client, config.root_token_file.read_text().strip())
    store = app[RUNTIME].db
    release = asyncio.Event()
    loop = asyncio.get_running_loop()

    def held(_: Any) -> None:  # the writer busy with a long transaction
        asyncio.run_coroutine_threadsafe(release.wait(), loop).result(timeout=30)

    holding = asyncio.create_task(store.write(held))
    site = {"tenantId": "root", "name": "fra1", "region": "eu", "kind": "shared"}
    waiting = asyncio.create_task(api.call("compute/sites/create", site))
    await asyncio.sleep(0.4)
    assert store.write_wait() > 0.2  # the site's create queued behind it, that long
    shed = await asyncio.wait_for(  # queued instead, it would wait for the release
        client.post(
            "/api/compute/sites/create",
            json={**site, "name": "ams1"},
            headers={"Authorization": f"Bearer {api.token}"},
        ),
        timeout=10,
    )
    assert shed.status == 503
    assert shed.headers["Retry-After"] == str(SHED_RETRY_AFTER_S)
    assert (await shed.json())["error"]["code"] == "UNAVAILABLE"
    assert (await api.ok("compute/sites/list", {"tenantId": "root"}))["items"] == []
    assert not waiting.done()
    release.set()
    await holding
    status, created = await waiting
    assert status == 200, created
    assert store.write_wait() == 0.0
    await api.ok("compute/sites/create", {**site, "name": "ams1"})
    names = [s["name"] for s in (await api.ok("compute/sites/list", {"tenantId": "root"}))["items"]]
    assert sorted(names) == ["ams1", "fra1"]


def test_f10_retry_after_follows_a_storm_up_to_its_cap_and_back_down(monkeypatch: Any) -> None:
    """F10: while a replica sheds most of what it is asked, the Retry-After it tells grows with
    what it is asked over what it serves (so the storm's agents come back about as fast as it
    serves them), never past its cap (a third of the lost-node grace at the daemon); once a
    window sheds nothing it is the least again."""
    clock = [1000.0]
    monkeypatch.setattr("controlplane.overload.time.monotonic", lambda: clock[0])
    overload = Overload(max_inflight=10, max_retry_after=30)
    told = []
    for asked in (250, 250, 90, 4000):  # windows, each serving 10 at once
        clock[0] += 1.0
        admitted = [overload.admit() for _ in range(asked)]
        assert admitted.count(True) == 10
        told.append(overload.retry_after)
        for _ in range(10):
            overload.leave()
    # Each window is told what the one before it saw: the first, the least.
    assert told == [SHED_RETRY_AFTER_S, 10, 10, 6], told
    clock[0] += 1.0
    assert overload.admit()  # ends the window asked 4000 of 10: capped
    assert overload.retry_after == 30
    overload.leave()
    clock[0] += 1.0
    assert overload.admit()  # after a window that shed nothing: the least
    assert overload.retry_after == SHED_RETRY_AFTER_S


def test_f10_retry_after_grows_with_what_was_asked_over_what_was_served() -> None:
    """F10: the next Retry-After is the least times the square root of asked over served,
    within its bounds."""
    assert next_retry_after(admitted=10, shed=30, cap=60) == 2 * SHED_RETRY_AFTER_S
    assert next_retry_after(admitted=100, shed=0, cap=60) == SHED_RETRY_AFTER_S
    assert next_retry_after(admitted=0, shed=500, cap=60) == 60  # nothing served
    assert next_retry_after(admitted=10, shed=99_990, cap=60) == 60
    assert round(next_retry_after(admitted=1000, shed=1, cap=60)) == SHED_RETRY_AFTER_S


def test_f10_a_node_told_the_longest_retry_after_is_heard_within_the_grace(
    config: Config,
) -> None:
    """F10: the daemon caps Retry-After so that a node told the most, which reports within
    twice as long, still has its stamp reach the database (within a pass interval and a
    stamp period) inside the lost-node grace that follows the replica's last shedding."""
    for lost_after, interval in ((90.0, 30.0), (30.0, 10.0), (90.0, 60.0), (20.0, 15.0)):
        runtime = Runtime(
            dataclasses.replace(config, node_lost_after=lost_after, reconcile_interval=interval)
        )
        cap = runtime.overload.max_retry_after
        heard_by = 2 * cap + interval + lost_after / STAMPS_PER_GRACE
        assert heard_by <= lost_after or cap == SHED_RETRY_AFTER_S, (lost_after, interval, cap)
        assert cap >= SHED_RETRY_AFTER_S
    defaults = Runtime(dataclasses.replace(config, node_lost_after=90.0, reconcile_interval=30.0))
    assert defaults.overload.max_retry_after == 22.5
