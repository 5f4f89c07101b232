"""Node liveness off the writer (DESIGN §9 lost nodes, B4, B5): stamps are
flushed to a liveness store whose writes never take the writer, and neither a restart nor a
takeover of the lead marks a node lost that reports."""

import asyncio
import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

from controlplane.app import make_app
from controlplane.capacity.liveness import Liveness
from controlplane.config import Config
from controlplane.metrics import Metrics
from controlplane.reconciler import run_reconciler
from controlplane.storage.db import Store, epoch, is_postgres
from controlplane.storage.leader import Leadership
from controlplane.storage.liveness import LivenessStore, liveness_file
from controlplane.storage.sql import Database
from tests.conftest import Api, execute
from tests.nodes import joined, pool_with_token, recorded, report, twin

LOST_AFTER = 1.0  # --node-lost-after in these tests: reports every 0.1 s keep a node alive


async def test_b5_a_flush_of_many_stamps_never_takes_the_writer(db: Path | str) -> None:
    """B5, §9: the writer is the one serial order of mutations (SQLite's write lock on the
    database file, PostgreSQL's writer lock). While a mutation holds it, a flush of 20,000
    stamps completes and reads back; a stamp never moves back (B4: a node that moved to
    another replica). On SQLite the stamps live in their own file, 0600 (R7)."""
    store, stamps = Store(db), LivenessStore(db)
    holding, release = threading.Event(), threading.Event()

    def mutation(d: Database) -> None:
        d.execute("UPDATE generations SET n = n + 1")
        holding.set()
        release.wait(10)

    try:
        writing = asyncio.ensure_future(store.write(mutation))
        assert await asyncio.to_thread(holding.wait, 10)
        batch = {f"node_{n:05d}": 1_700_000_000 + n % 3 for n in range(20_000)}
        await asyncio.wait_for(stamps.run(stamps.write, batch), 10)
        assert not writing.done()  # the mutation still holds the writer
        assert stamps.stamp("node_19999") == batch["node_19999"]
        await asyncio.wait_for(stamps.run(stamps.write, {"node_19999": 1_600_000_000}), 10)
        assert stamps.stamp("node_19999") == batch["node_19999"]
        release.set()
        await writing
    finally:
        release.set()
        stamps.close()
        store.close()
    if not is_postgres(db):
        assert liveness_file(Path(db)).stat().st_mode & 0o777 == 0o600


async def keep_reporting(api: Api, nodes: list[tuple[dict[str, Any], Any]], seconds: float) -> None:
    """Each node reports its unchanged inventory every 0.1 s (memory only, then flushes)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for node, inventory in nodes:
            status, _ = await report(api, node, inventory)
            assert status == 200
        await asyncio.sleep(0.1)


async def lost_events(api: Api) -> list[dict[str, Any]]:
    found = await api.ok("compute/events/list", {"tenantId": "root", "types": ["node.lost"]})
    return list(found["items"])


async def test_a_restart_never_marks_a_reporting_node_lost(
    config: Config, aiohttp_client: Any
) -> None:
    """§9: a node that keeps reporting across a control-plane restart is never lost (stamps
    flushed before it, and a grace period after it, while memory fills again); one that
    stopped reporting is lost, no earlier than a grace period after the restart."""
    fast = dataclasses.replace(config, reconcile_interval=0.05, node_lost_after=LOST_AFTER)
    client = await aiohttp_client(make_app(fast))
    api = Api(client, fast.root_token_file.read_text().strip())
    _, token = await pool_with_token(api)
    alive, silent = twin("dgx-h100-01", 1), twin("dgx-h100-01", 2)
    nodes = [(await joined(api, token, inventory), inventory) for inventory in (alive, silent)]
    # Long enough for flushes; by the time the restarted one may mark nodes lost, the joins'
    # stamps are older than a grace period: only reports keep the nodes alive.
    await keep_reporting(api, nodes, LOST_AFTER / 2)
    assert await lost_events(api) == []
    await client.close()

    restarted = time.time()
    api = Api(await aiohttp_client(make_app(fast)), api.token)
    deadline = time.monotonic() + 10
    while not await lost_events(api):
        assert time.monotonic() < deadline, "the silent node was never marked lost"
        await keep_reporting(api, nodes[:1], 0.2)
    [event] = await lost_events(api)
    assert event["data"]["nodeId"] == nodes[1][0]["nodeId"]
    assert epoch(event["at"]) - restarted >= LOST_AFTER - 0.01  # a grace period after start
    states = dict(execute(fast.db_path, "SELECT id, state FROM nodes"))
    assert states == {nodes[0][0]["nodeId"]: "ready", nodes[1][0]["nodeId"]: "lost"}


class TakesOver(Leadership):
    """A replica that follows for its first passes, then leads (its leader died, B4)."""

    def __init__(self, location: Path | str, follows: int) -> None:
        super().__init__(location)
        self.follows = follows
        self.took = 0.0  # when it took the lead (epoch seconds)

    def holds(self) -> bool:
        if self.follows:
            self.follows -= 1
            return False
        self.took = self.took or time.time()
        return super().holds()  # takes the lease (F2): the passes are fenced by it


async def test_b4_taking_the_lead_waits_a_grace_period(api: Api, db: Path | str) -> None:
    """B4: a replica that takes the lead marks nothing lost for a grace period (the nodes
    of the replica that died report to others, whose flushes are on their way), though it
    started long ago; then a node silent all along is lost."""
    _, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    execute(db, "UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z'")
    store, leadership = Store(db), TakesOver(db, follows=3)
    task = asyncio.create_task(
        run_reconciler(
            store,
            Liveness(),
            0.05,
            LOST_AFTER,
            time.monotonic() - 100,
            Metrics.create(),
            leadership,
        )
    )
    try:
        deadline = time.monotonic() + 10
        while not await lost_events(api):
            assert time.monotonic() < deadline, "the silent node was never marked lost"
            await asyncio.sleep(0.05)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        store.close()
    [event] = await lost_events(api)
    assert event["data"]["nodeId"] == node["nodeId"]
    assert epoch(event["at"]) - leadership.took >= LOST_AFTER - 0.01
