"""B6: a long read never holds the event loop; cached answers last exactly as long as the
state they were made from."""

import asyncio
import dataclasses
import multiprocessing
import threading
from concurrent.futures import Future
from typing import Any

import msgspec
import pytest

from controlplane.api.keys import RUNTIME
from controlplane.app import make_app
from controlplane.config import Config
from controlplane.reads import workers
from controlplane.services import pools as pool_service
from controlplane.storage.db import Store, generation
from tests.conftest import Api


async def test_b6_a_list_blocked_in_its_read_does_not_delay_other_requests(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pools/list stuck inside its SQL (here: held on an event) runs on a reader thread:
    pools/get, a write and another list are answered meanwhile; then the list ends."""
    site = await api.site()
    pool = await api.pool(site)
    inside, release = threading.Event(), threading.Event()
    visible_pools = pool_service.pool_sql.visible_pool_rows

    def slow_visible_pools(db: Any, tenant_id: str, *args: Any, **kwargs: Any) -> Any:
        if tenant_id == "root" and not release.is_set():
            inside.set()
            assert release.wait(20), "the test never released the read"
        return visible_pools(db, tenant_id, *args, **kwargs)

    monkeypatch.setattr(pool_service.pool_sql, "visible_pool_rows", slow_visible_pools)
    listing = asyncio.create_task(api.ok("compute/pools/list", {"tenantId": "root"}))
    assert await asyncio.to_thread(inside.wait, 10)
    try:
        got = await asyncio.wait_for(
            api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool["id"]}), 5
        )
        assert got["id"] == pool["id"]
        await asyncio.wait_for(api.site(name="ams1"), 5)  # a write is not held either
        await api.tenant("acme")
        acme = await asyncio.wait_for(
            api.ok("compute/pools/list", {"tenantId": "acme"}, await api.token_for("acme")), 5
        )
        assert acme["items"] == []
        assert not listing.done()
    finally:
        release.set()
    assert [p["id"] for p in (await asyncio.wait_for(listing, 10))["items"]] == [pool["id"]]


async def test_b6_a_cached_answer_is_dropped_by_the_next_write_that_changes_anything(
    api: Api,
) -> None:
    """pools/list and pools/get answer from the cache until any write commits: an offer's
    quota, an update's version and a new pool are seen at once, by the owner and the
    tenant offered (every cached read is keyed by credential and body)."""
    await api.tenant("acme")
    acme = await api.token_for("acme")
    site = await api.site()
    pool = await api.pool(site)
    get = {"tenantId": "root", "poolId": pool["id"]}
    answers = api.client.app[RUNTIME].answers

    async def read_both() -> None:
        assert (await api.ok("compute/pools/get", get))["version"] == 1
        listed = await api.ok("compute/pools/list", {"tenantId": "acme"}, acme)
        assert listed == {"items": [], "next": None}

    await read_both()
    assert answers.hits == 0
    await read_both()  # the same credentials and bodies, nothing written since: cached
    assert answers.hits == 2
    await api.offer(pool["id"], "acme", {"gpu": 3})
    shown = await api.ok("compute/pools/list", {"tenantId": "acme"}, acme)
    assert [q["max"] for q in shown["items"][0]["quotas"]] == [3]
    await api.ok("compute/pools/update", {**get, "gpuModel": "H200"})
    assert (await api.ok("compute/pools/get", get))["version"] == 2
    await api.offer(pool["id"], "acme", {"gpu": 5})
    shown = await api.ok("compute/pools/list", {"tenantId": "acme"}, acme)
    assert [q["max"] for q in shown["items"][0]["quotas"]] == [5]
    assert shown["items"][0]["gpuModel"] == "H200"
    assert answers.hits == 2  # every read after a write was made afresh


def test_b6_the_generation_moves_with_each_write_and_only_then(db: Any) -> None:
    """A transaction that writes nothing (an idle reconcile pass) keeps cached answers; one
    that writes anything, or rolls back, is told apart."""
    store = Store(db)
    try:
        with store.snapshot() as reader:
            before = generation(reader)
        store.transact(lambda d: d.execute("SELECT count(*) FROM pools").fetchone())
        with store.snapshot() as reader:
            assert generation(reader) == before
        store.transact(
            lambda d: d.execute(
                "INSERT INTO tenants (id, created_at) VALUES ('acme', '2026-12-01T00:00:00Z')"
            )
        )
        with store.snapshot() as reader:
            assert generation(reader) == before + 1

        def refused(d: Any) -> None:
            d.execute("INSERT INTO tenants (id, created_at) VALUES ('beta', 'x')")
            raise RuntimeError("refused")

        with pytest.raises(RuntimeError):
            store.transact(refused)
        with store.snapshot() as reader:
            assert generation(reader) == before + 1
    finally:
        store.close()


def test_b6_a_long_list_is_encoded_in_slices_to_the_same_bytes() -> None:
    """The sliced encoding (so the loop can run between slices) is the one-call encoding."""
    from controlplane.api.answer import ENCODE_SLICE, encode_answer
    from shared.schemas import SiteList, SiteView

    sites = [
        SiteView(
            id=f"site_{n:026d}",
            owner_tenant_id="root",
            name=f'a "quoted" ,"items":[] name {n}',
            region="eu",
            kind="shared",
            created_at="2026-12-01T00:00:00.000Z",
        )
        for n in range(ENCODE_SLICE * 2 + 7)
    ]
    for answer in (SiteList(items=sites, next="site_x"), SiteList(items=sites[:3], next=None)):
        assert encode_answer(answer) == msgspec.json.encode(answer)


async def test_b6_a_slow_cached_list_starts_worker_processes_that_answer_the_same(
    config: Config, aiohttp_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a cached list is seen slow, worker processes start and answer those lists: the
    same answers, the same refusals (IAM decided in the worker), the caller in the log line."""
    monkeypatch.setattr(workers, "SLOW_READ_S", 0.0)  # every list is "slow" here
    app = make_app(dataclasses.replace(config, read_workers=1))
    client = await aiohttp_client(app)
    api = Api(client, config.root_token_file.read_text().strip())
    site = await api.site()
    pools = [await api.pool(site) for _ in range(3)]
    await api.tenant("acme")
    acme = await api.token_for("acme")
    await api.offer(pools[0]["id"], "acme", {"gpu": 2})
    by_thread = await api.ok("compute/pools/list", {"tenantId": "acme"}, acme)
    runtime = app[RUNTIME]
    for _ in range(200):  # the worker starts in the background (spawn: a fresh interpreter)
        if runtime.workers.ready:
            break
        await asyncio.sleep(0.1)
    assert runtime.workers.ready
    # Another body (a page): not in the cache, so the worker reads it.
    by_worker = await api.ok("compute/pools/list", {"tenantId": "acme", "limit": 10}, acme)
    assert runtime.workers.answered == 1
    assert by_worker["items"] == by_thread["items"]
    everything = await api.ok("compute/pools/list", {"tenantId": "root", "limit": 2})
    assert [p["id"] for p in everything["items"]] == sorted(p["id"] for p in pools)[:2]
    refused = {"tenantId": "root", "limit": 3}
    await api.err("compute/pools/list", refused, "PERMISSION_DENIED", token=acme, status=403)
    await api.err(
        "compute/sites/list",
        {"tenantId": "acme", "cursor": "bad cursor"},
        "INVALID_INPUT",
        "cursor",
        acme,
    )
    assert runtime.workers.answered == 3
    # A worker that dies (out of memory, killed) costs no answer: reader threads take over
    # (and no read is slow enough to start a new pool within this test).
    monkeypatch.setattr(workers, "SLOW_READ_S", 3600.0)
    for child in multiprocessing.active_children():
        child.kill()
        child.join(10)
    again = await api.ok("compute/pools/list", {"tenantId": "acme", "limit": 5}, acme)
    assert again["items"] == by_thread["items"]
    assert not runtime.workers.ready


async def test_b6_b5_a_cached_answer_is_never_served_to_a_revoked_credential(api: Api) -> None:
    """The credential is checked before the cache is: revoked, its cached list is refused."""
    await api.tenant("acme")
    made = await api.ok("iam/credentials/create", {"tenantId": "acme"})
    body = {"tenantId": "acme"}
    for _ in range(2):
        await api.ok("compute/pools/list", body, made["token"])
    assert api.client.app[RUNTIME].answers.hits == 1
    revoke = {"tenantId": "acme", "credentialId": made["credentialId"]}
    await api.ok("iam/credentials/revoke", revoke)
    await api.err("compute/pools/list", body, "UNAUTHENTICATED", token=made["token"], status=401)


def test_b6_a_control_plane_stopping_while_its_read_workers_start_stops_them_cleanly(
    config: Config, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B6: a stop (``close``) that comes while the first slow read's thread starts the worker
    pool waits for that start, then shuts the pool down: the starting thread never has its
    tasks refused by a pool already shut down."""
    submitting, proceed = threading.Event(), threading.Event()

    class Pool:  # a ProcessPoolExecutor that refuses tasks once shut down, as the real one
        def __init__(self, **_: Any) -> None:
            self.shut = False
            self.submitted = 0

        def submit(self, fn: Any) -> Any:
            if self.shut:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self.submitted += 1
            if self.submitted == 1:
                submitting.set()
                proceed.wait(5)
            done: Future[bool] = Future()
            done.set_result(True)
            return done

        def shutdown(self, **_: Any) -> None:
            self.shut = True

    monkeypatch.setattr(workers, "ProcessPoolExecutor", Pool)
    entry = workers.WorkerEntry(start=lambda _: None, answer=_unanswered, ready=lambda: True)
    pool = workers.ReadWorkers(config, 2, entry)
    failed: list[BaseException] = []
    starting = threading.Thread(target=lambda: _caught(pool._start, failed))
    starting.start()
    assert submitting.wait(5)
    closing = threading.Thread(target=pool.close)
    closing.start()
    closing.join(0.2)  # the stop waits for the start's turn
    proceed.set()
    starting.join(5)
    closing.join(5)
    assert failed == []
    assert pool._pool is not None and pool._pool.shut  # type: ignore[attr-defined]
    assert pool._pool.submitted == 2  # type: ignore[attr-defined]


def _unanswered(path: str, token: str | None, raw: bytes) -> Any:
    raise AssertionError("no read reaches a worker here")


def _caught(fn: Any, failed: list[BaseException]) -> None:
    try:
        fn()
    except BaseException as exc:
        failed.append(exc)
