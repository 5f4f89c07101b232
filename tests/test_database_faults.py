"""F1: the database comes and goes. A real control plane on its own real PostgreSQL server,
restarted under a steady load of writes and reads (``pg_ctl restart -m fast`` and
``-m immediate``): the answers are 200 or 503 ``UNAVAILABLE`` with ``Retry-After``, never
500; no request waits on the database past ``--db-timeout`` by much; the daemon serves
again without a restart; every acknowledged write is in the database."""

import asyncio
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest

from controlplane.reads.answers import AnswerCache
from controlplane.storage.db import SHORT_READER_THREADS, Store
from controlplane.storage.db import generation as generation_of
from shared.errors import Unavailable
from tests.daemons import Daemon, call
from tests.postgres import SERVER_SETTINGS, PostgresServer
from tests.tcp_proxy import TcpProxy

DEFAULT_DB_TIMEOUT = 5.0
DB_TIMEOUT = 1.0  # the daemons' --db-timeout here (5 s by default): a short wait keeps tests short
DURABLE = tuple(
    s for s in SERVER_SETTINGS if s.split("=")[0] in ("listen_addresses", "max_connections")
)
SLACK = 3.0  # a request's own work and the 2-core machine's scheduling beside the timeout


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test's own, durable as in production (the session's trades
    durability for speed): it is restarted, and a crash must lose no acknowledged commit."""
    server = PostgresServer(settings=DURABLE)
    server.start()
    yield server
    server.stop()


class Load:
    """Writes (sites/create, each its own name) and reads (sites/list) one after the other
    until stopped; what each answered and how long it took."""

    def __init__(self, daemon: Daemon, session: aiohttp.ClientSession) -> None:
        self.daemon, self.session = daemon, session
        self.statuses: Counter[int] = Counter()
        self.slowest = 0.0
        self.acknowledged: list[str] = []
        self.missing_retry_after = 0
        self.stop = asyncio.Event()

    async def one(self, path: str, body: dict[str, Any]) -> Any:
        started = time.monotonic()
        async with self.session.post(
            f"{self.daemon.url}/api/{path}",
            json=body,
            headers={"Authorization": f"Bearer {self.daemon.token}"},
            timeout=aiohttp.ClientTimeout(total=DEFAULT_DB_TIMEOUT * 4),
        ) as response:
            answer = await response.json()
            self.slowest = max(self.slowest, time.monotonic() - started)
            self.statuses[response.status] += 1
            if response.status == 503:
                assert answer["error"]["code"] == "UNAVAILABLE", answer
                self.missing_retry_after += "Retry-After" not in response.headers
            return answer if response.status == 200 else None

    async def run(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            body = {"tenantId": "root", "name": f"s{n}", "region": "eu", "kind": "shared"}
            made = await self.one("compute/sites/create", body)
            if made is not None:
                self.acknowledged.append(made["id"])
            await self.one("compute/sites/list", {"tenantId": "root", "limit": 5})
            await asyncio.sleep(0.02)


@pytest.mark.parametrize("mode", ["fast", "immediate"])
async def test_f1_a_database_restart_answers_503_then_serves_again_losing_nothing(
    tmp_path: Path, own_server: PostgresServer, mode: str
) -> None:
    """F1: under load, the database restarted (down past --db-timeout): 503 with Retry-After while it
    is away, never 500 nor a wait past --db-timeout; served again with no daemon restart;
    every acknowledged write present."""
    url = own_server.new_database()
    (tmp_path / "data").mkdir()
    daemon = Daemon(
        tmp_path, "--reconcile-interval", "0.5", "--db-timeout", str(DB_TIMEOUT), db=url
    )
    daemon.start()
    try:
        async with aiohttp.ClientSession() as session:
            load = Load(daemon, session)
            running = asyncio.create_task(load.run())
            await asyncio.sleep(1.0)
            # down longer than --db-timeout: what waits for it gives up, answering 503
            await asyncio.to_thread(own_server.restart, mode, DB_TIMEOUT + 1)
            before = sum(load.statuses.values())
            for _ in range(200):  # bounded: served again within 20 s
                await asyncio.sleep(0.1)
                if load.acknowledged and sum(load.statuses.values()) > before + 20:
                    break
            await asyncio.sleep(1.0)
            load.stop.set()
            await running
            assert set(load.statuses) <= {200, 503}, load.statuses
            assert load.statuses[503] > 0 and load.missing_retry_after == 0, load.statuses
            assert load.slowest < DB_TIMEOUT + SLACK, load.slowest
            served = await call(
                session, daemon.url, "compute/sites/list", daemon.token, {"tenantId": "root"}
            )
            assert served["items"], served
        with psycopg.connect(url) as conn:
            stored = {row[0] for row in conn.execute("SELECT id FROM sites")}
        assert set(load.acknowledged) <= stored, set(load.acknowledged) - stored
    finally:
        daemon.kill()


async def test_f1_no_database_call_runs_on_the_event_loop(
    tmp_path: Path, own_server: PostgresServer
) -> None:
    """F1, F2: with the database cut off (a proxy between them drops every connection), the
    requests that need it wait for it off the event loop and answer 503 within
    --db-timeout; meanwhile the daemon's event loop answers /healthz at once."""
    url = own_server.new_database()
    proxy = TcpProxy("127.0.0.1", own_server.port)
    await proxy.start()
    (tmp_path / "data").mkdir()
    daemon = Daemon(
        tmp_path,
        "--reconcile-interval",
        "0.3",
        "--db-timeout",
        str(DB_TIMEOUT),
        db=url.replace(f":{own_server.port}/", f":{proxy.port}/"),
    )
    await asyncio.to_thread(daemon.start)  # the proxy serves on this loop meanwhile
    try:
        async with aiohttp.ClientSession() as session:
            load = Load(daemon, session)
            await load.one("compute/sites/list", {"tenantId": "root"})
            proxy.cut()
            waiting = [
                asyncio.create_task(load.one(path, {"tenantId": "root"}))
                for path in ("compute/sites/list", "compute/pools/list", "compute/events/list") * 3
            ]
            await asyncio.sleep(0.2)
            slowest_health = 0.0
            while not all(task.done() for task in waiting):
                started = time.monotonic()
                async with session.get(f"{daemon.url}/healthz") as response:
                    assert response.status == 200
                slowest_health = max(slowest_health, time.monotonic() - started)
                await asyncio.sleep(0.1)
            await asyncio.gather(*waiting)
            assert slowest_health < 0.5, slowest_health
            assert set(load.statuses) == {200, 503} and load.slowest < DB_TIMEOUT + SLACK
            proxy.restore()
            for _ in range(100):  # bounded: served again within 10 s
                if await load.one("compute/sites/list", {"tenantId": "root"}) is not None:
                    break
                await asyncio.sleep(0.1)
            else:
                raise AssertionError("not served again after the database came back")
    finally:
        daemon.kill()
        await proxy.stop()


def test_f1_cached_answers_go_when_the_database_connection_is_replaced(
    own_server: PostgresServer,
) -> None:
    """F1: after a reconnect (a restart, or a failover to a standby whose generations need not
    be the primary's) no answer cached before it is served again."""
    store = Store(own_server.new_database(), db_timeout=DB_TIMEOUT)
    try:
        cache = AnswerCache()
        key = ("/api/compute/pools/list", "cred", b"{}")
        generation = store.transact(lambda db: generation_of(db))
        cache.put(key, generation, b"answer")
        assert cache.get(key, generation) == b"answer"
        own_server.restart("fast")
        for _ in range(50):  # bounded: the pool reconnects within the timeout
            try:
                store.transact(lambda db: generation_of(db))
                break
            except Unavailable:
                time.sleep(0.1)
        assert cache.get(key, generation) is None
    finally:
        store.close()


async def test_f1_a_first_step_after_a_restart_is_served_on_a_fresh_connection(
    own_server: PostgresServer,
) -> None:
    """F1: a write's first step reads outside a transaction; after the database restarted it
    is answered at once on a fresh connection (as a transaction's BEGIN is), not refused on
    the connection the restart broke, on every short reader."""
    store = Store(own_server.new_database(), db_timeout=DB_TIMEOUT)
    try:

        def one(db: Any) -> int:
            time.sleep(0.05)  # each reader thread takes one: all of them hold a connection
            return int(db.execute("SELECT 1").fetchone()[0])

        readers = SHORT_READER_THREADS
        assert (
            await asyncio.gather(*(store.read_latest(one) for _ in range(readers))) == [1] * readers
        )
        own_server.restart("fast")
        answers = await asyncio.gather(
            *(store.read_latest(one) for _ in range(readers)), return_exceptions=True
        )
        assert answers == [1] * readers, answers
    finally:
        store.close()
