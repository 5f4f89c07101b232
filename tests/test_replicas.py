"""B4, B5: several `serve` processes on one PostgreSQL database: any replica answers any
method, one leader runs the passes and another takes over, every rule holds across them."""

import asyncio
import functools
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import msgspec
import psycopg
import pytest

from controlplane.api.keys import RUNTIME
from controlplane.app import make_app
from controlplane.config import Config
from controlplane.storage.db import WRITER_LOCK, Store
from controlplane.storage.leader import Leadership, NotLeading
from shared import cpulist
from tests.conftest import Api, execute
from tests.daemons import Daemon, call, root_pool
from tests.nodes import joined, pool_with_token, recorded, twin, wire
from tests.tcp_proxy import TcpProxy

INTERVAL = 0.3  # --reconcile-interval: a takeover is due within two of them


@pytest.fixture
def replicas(tmp_path: Path, postgres_url: str) -> Iterator[list[Daemon]]:
    """Two replicas on one fresh PostgreSQL database; the first bootstraps root's token."""
    yield from serving(tmp_path, postgres_url, 2)


@pytest.fixture
def three_replicas(tmp_path: Path, postgres_url: str) -> Iterator[list[Daemon]]:
    yield from serving(tmp_path, postgres_url, 3)


def serving(tmp_path: Path, postgres_url: str, count: int) -> Iterator[list[Daemon]]:
    running = []
    for n in range(count):
        workdir = tmp_path / f"replica{n}"
        (workdir / "data").mkdir(parents=True)
        daemon = Daemon(workdir, "--reconcile-interval", str(INTERVAL), db=postgres_url)
        daemon.start()
        running.append(daemon)
    for daemon in running[1:]:  # the database was not empty for them: root's token is shared
        (daemon.workdir / "data" / "root.token").write_text(running[0].token)
    yield running
    for daemon in running:
        daemon.kill()


async def ready(session: aiohttp.ClientSession, daemon: Daemon) -> Any:
    async with session.get(f"{daemon.url}/readyz") as response:
        assert response.status == 200
        return await response.json()


async def leaders(session: aiohttp.ClientSession, daemons: list[Daemon]) -> list[bool]:
    return [(await ready(session, d))["leader"] for d in daemons]


async def test_b4_one_leader_and_a_takeover_within_two_intervals(replicas: list[Daemon]) -> None:
    """B4: /readyz says backend postgresql; exactly one replica leads; when it dies another
    leads within two reconcile intervals, and a write on either replica is read on the other."""
    first, second = replicas
    async with aiohttp.ClientSession() as session:
        deadline = time.monotonic() + 10
        led: list[bool] = []
        while time.monotonic() < deadline:
            led = await leaders(session, replicas)
            if sum(led) == 1:
                break
            await asyncio.sleep(0.05)
        assert sum(led) == 1, led
        assert {(await ready(session, d))["backend"] for d in replicas} == {"postgresql"}
        site = await call(
            session,
            first.url,
            "compute/sites/create",
            first.token,
            {"tenantId": "root", "name": "fra1", "region": "eu", "kind": "shared"},
        )
        listed = await call(
            session, second.url, "compute/sites/list", second.token, {"tenantId": "root"}
        )
        assert [s["id"] for s in listed["items"]] == [site["id"]]
        leader, follower = (first, second) if led[0] else (second, first)
        leader.kill()
        died = time.monotonic()
        while not (await ready(session, follower))["leader"]:
            assert time.monotonic() - died < 2 * INTERVAL + 1.0, "no takeover"
            await asyncio.sleep(0.02)
        assert time.monotonic() - died < 2 * INTERVAL + 1.0


async def test_b5_rules_hold_across_replicas(replicas: list[Daemon], postgres_url: str) -> None:
    """B5: concurrent creates on both replicas never over-admit a quota, one idempotency key
    makes one pool, the event seq is gapless, a revocation on one replica is refused by the
    other within 1 s."""
    first, second = replicas
    async with aiohttp.ClientSession() as session:
        pool = await root_pool(session, first, gpuModel="H100", ownerQuota={"gpu": 16})
        body = {"tenantId": "root", "poolId": pool["id"], "resources": {"gpu": 1}}

        async def create(daemon: Daemon) -> str:
            answer = await call(
                session, daemon.url, "compute/reservations/create", daemon.token, body
            )
            return f"{answer['state']}:{answer['reason']}"

        outcomes = Counter(await asyncio.gather(*(create(replicas[n % 2]) for n in range(60))))
        assert outcomes == {"pending:None": 16, "failed:QuotaExceeded": 44}, outcomes
        assert execute(postgres_url, "SELECT used FROM quotas WHERE resource = 'gpu'") == [(16,)]
        site = (
            await call(session, first.url, "compute/sites/list", first.token, {"tenantId": "root"})
        )["items"][0]
        keyed = {
            "tenantId": "root",
            "siteId": site["id"],
            "class": "metal-host",
            "idempotencyKey": "one",
        }
        made = await asyncio.gather(
            *(
                call(session, replicas[n % 2].url, "compute/pools/create", first.token, keyed)
                for n in range(12)
            )
        )
        assert len({p["id"] for p in made}) == 1
        created = execute(postgres_url, "SELECT count(*) FROM events WHERE type = 'pool.created'")
        assert created == [(2,)]  # the first pool and the keyed one, once
        seqs = [seq for (seq,) in execute(postgres_url, "SELECT seq FROM events ORDER BY seq")]
        assert seqs == list(range(1, len(seqs) + 1))
        await call(session, first.url, "iam/tenants/create", first.token, {"tenantId": "acme"})
        acme = await call(
            session, first.url, "iam/credentials/create", first.token, {"tenantId": "acme"}
        )
        headers = {"Authorization": f"Bearer {acme['token']}"}
        listing = {"tenantId": "acme"}
        async with session.post(
            f"{second.url}/api/compute/pools/list", json=listing, headers=headers
        ) as r:
            assert r.status == 200  # cached by the second replica now
        await call(
            session,
            first.url,
            "iam/credentials/revoke",
            first.token,
            {"tenantId": "acme", "credentialId": acme["credentialId"]},
        )
        revoked = time.monotonic()
        await asyncio.sleep(1.0)
        async with session.post(
            f"{second.url}/api/compute/pools/list", json=listing, headers=headers
        ) as r:
            assert r.status == 401
        assert time.monotonic() - revoked < 2.0


async def test_b2_b6_a_commit_on_one_replica_wakes_and_refreshes_the_other(
    replicas: list[Daemon],
) -> None:
    """B2: a long-poll on one replica is woken by an event committed on the other (NOTIFY);
    B6: the other's cached pools/get is dropped by that commit (the shared generation)."""
    first, second = replicas
    async with aiohttp.ClientSession() as session:
        pool = await root_pool(session, first, gpuModel="H100")
        get = {"tenantId": "root", "poolId": pool["id"]}
        for _ in range(2):  # the second answer comes from the second replica's cache
            shown = await call(session, second.url, "compute/pools/get", second.token, get)
            assert shown["version"] == 1
        listing = {"tenantId": "root", "limit": 1000}
        after = (await call(session, second.url, "compute/events/list", second.token, listing))[
            "next"
        ]
        body = {"tenantId": "root", "after": after, "waitSeconds": 30}
        waiting = asyncio.create_task(
            call(session, second.url, "compute/events/list", second.token, body)
        )
        await asyncio.sleep(0.3)
        assert not waiting.done()
        update = {**get, "gpuModel": "H200"}
        await call(session, first.url, "compute/pools/update", first.token, update)
        answer = await asyncio.wait_for(waiting, 10)
        assert [e["type"] for e in answer["items"]] == ["pool.updated"]
        shown = await call(session, second.url, "compute/pools/get", second.token, get)
        assert shown["version"] == 2


def test_b3_a_password_on_the_command_line_is_refused(tmp_path: Path) -> None:
    """B3: a postgresql:// URL with a password in it is refused before anything connects
    (it would show in ps and in logs); PGPASSWORD or ~/.pgpass carry it."""
    import subprocess

    from tests.daemons import DAEMON

    done = subprocess.run(
        [str(DAEMON), "serve", "--db", "postgresql://bc:hunter2@127.0.0.1:1/bc"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "PGPASSWORD" in done.stderr and "hunter2" not in done.stderr


async def node_call(
    session: aiohttp.ClientSession, daemon: Daemon, path: str, token: str, body: Any
) -> Any:
    return await call(session, daemon.url, path, token, body)


async def test_d8_no_gpu_or_pinned_cpu_is_booked_twice_across_replicas(
    replicas: list[Daemon], postgres_url: str
) -> None:
    """D8, B5: creates racing on both replicas for a host's GPUs and pinned cores book each
    GPU and each CPU once; the host's releases, told to one replica, let the other's pending
    ones in, still once each."""
    first, second = replicas
    inventory = msgspec.to_builtins(recorded("dgx-h100-01"))
    async with aiohttp.ClientSession() as session:
        pool = await root_pool(
            session,
            first,
            gpuModel="H100",
            policy={"hostReserve": {"vcpu": 8, "memoryGiB": 64}},
            ownerQuota={"gpu": 100, "vcpu": 10_000},
        )
        join_token = await call(
            session,
            first.url,
            "compute/joinTokens/create",
            first.token,
            {"tenantId": "root", "poolId": pool["id"]},
        )
        node = await call(
            session,
            second.url,
            "compute/nodes/join",
            "none",
            {
                "joinToken": join_token["token"],
                "attestor": "join-token",
                "hostname": "dgx",
                "inventory": inventory,
            },
        )
        spec = await node_call(
            session, first, "compute/nodes/spec", node["token"], {"nodeId": node["nodeId"]}
        )
        applied = {
            "version": spec["version"],
            "units": [{"id": u["id"], "status": "applied"} for u in spec["units"]],
        }
        await node_call(
            session,
            first,
            "compute/nodes/report",
            node["token"],
            {"nodeId": node["nodeId"], "inventory": inventory, "applied": applied},
        )
        body = {"tenantId": "root", "poolId": pool["id"], "resources": {"gpu": 1, "vcpu": 8}}
        made = await asyncio.gather(
            *(
                call(session, replicas[n % 2].url, "compute/reservations/create", first.token, body)
                for n in range(16)
            )
        )
        assert Counter(r["state"] for r in made) == {"placed": 8, "pending": 8}

        def exclusive() -> int:
            held = execute(
                postgres_url,
                "SELECT placement FROM reservations WHERE state IN ('placed', 'active') "
                "OR delivery_state IN ('releasing', 'release-blocked')",
            )
            gpus: list[str] = []
            cpus: list[int] = []
            for (text,) in held:
                placement = msgspec.json.decode(text)
                gpus += [g["uuid"] for g in placement["gpus"]]
                cpus += cpulist.parse(placement["cpus"])
            assert len(gpus) == len(set(gpus)) and len(cpus) == len(set(cpus)), (gpus, cpus)
            assert execute(postgres_url, "SELECT count(*) FROM node_cpus") == [(len(cpus),)]
            return len(gpus)

        assert exclusive() == 8
        placed = [r["id"] for r in made if r["state"] == "placed"]
        await asyncio.gather(
            *(
                call(
                    session,
                    replicas[n % 2].url,
                    "compute/reservations/end",
                    first.token,
                    {"tenantId": "root", "reservationId": rid},
                )
                for n, rid in enumerate(placed)
            )
        )
        assert exclusive() == 8  # ended, releasing: still held
        released = [{"reservationId": rid, "state": "released"} for rid in placed]
        await node_call(
            session,
            second,
            "compute/nodes/report",
            node["token"],
            {"nodeId": node["nodeId"], "inventory": inventory, "bookings": released},
        )
        for _ in range(100):  # bounded: the leader's passes place the pending ones
            states = Counter(s for (s,) in execute(postgres_url, "SELECT state FROM reservations"))
            if states["placed"] == 8:
                break
            await asyncio.sleep(0.1)
        assert states == {"placed": 8, "ended": 8}, states
        assert exclusive() == 8


async def test_f2_a_leader_cut_off_from_the_database_is_replaced_within_two_intervals(
    tmp_path: Path, postgres_server: Any, postgres_url: str
) -> None:
    """F2: the leader reaches the database through a proxy; the proxy cuts it off (a
    partition): it stops leading, another replica leads within two intervals; restored, the
    cut-off one follows (the lease is the other's)."""
    proxy = TcpProxy("127.0.0.1", postgres_server.port)
    await proxy.start()
    proxied = postgres_url.replace(f":{postgres_server.port}/", f":{proxy.port}/")
    daemons: list[Daemon] = []
    try:
        for n, url in enumerate((proxied, postgres_url)):
            workdir = tmp_path / f"replica{n}"
            (workdir / "data").mkdir(parents=True)
            daemon = Daemon(workdir, "--reconcile-interval", str(INTERVAL), db=url)
            await asyncio.to_thread(daemon.start)  # the proxy serves on this loop meanwhile
            if daemons:
                (workdir / "data" / "root.token").write_text(daemons[0].token)
            daemons.append(daemon)
            async with aiohttp.ClientSession() as session:
                for _ in range(100):  # bounded: the first leads before the second starts
                    if (await ready(session, daemons[0]))["leader"]:
                        break
                    await asyncio.sleep(0.05)
        cut_off, other = daemons
        async with aiohttp.ClientSession() as session:
            assert await leaders(session, daemons) == [True, False]
            proxy.cut()
            at = time.monotonic()
            while not (await ready(session, other))["leader"]:
                assert time.monotonic() - at < 2 * INTERVAL + 1.0, "no new leader"
                await asyncio.sleep(0.02)
            assert not (await ready(session, cut_off))["leader"]
            proxy.restore()
            await asyncio.sleep(4 * INTERVAL)
            assert await leaders(session, daemons) == [False, True]
    finally:
        for daemon in daemons:
            daemon.kill()
        await proxy.stop()


def test_f2_a_pass_of_a_stale_term_writes_nothing(postgres_url: str) -> None:
    """F2: a leader whose lease another replica took (it was cut off past the lease) has its
    next pass refused inside the pass's own transaction: nothing of it is written."""
    store = Store(postgres_url)
    try:
        first, second = Leadership(postgres_url, 0.3), Leadership(postgres_url, 0.3)
        assert first.holds() and not second.holds()
        execute(postgres_url, "UPDATE leader_lease SET expires_at = 0")  # its lease ran out
        assert second.holds() and second.term == first.term + 1

        def pass_writing(db: Any) -> None:
            db.execute(
                "INSERT INTO tenants (id, name, created_at) VALUES ('stale', 'stale', 'now')"
            )

        with pytest.raises(NotLeading):
            store.transact(functools.partial(fenced_write, first, pass_writing))
        assert not first.leader
        assert execute(postgres_url, "SELECT count(*) FROM tenants WHERE id = 'stale'") == [(0,)]
        store.transact(functools.partial(fenced_write, second, pass_writing))  # the leader's
        assert execute(postgres_url, "SELECT count(*) FROM tenants WHERE id = 'stale'") == [(1,)]
        first.close()
        second.close()
    finally:
        store.close()


def fenced_write(leadership: Leadership, write: Any, db: Any) -> None:
    leadership.fence(db)
    write(db)


async def follow(session: aiohttp.ClientSession, daemon: Daemon, until: asyncio.Event) -> list[int]:
    """B2, B5: every seq a long-polling reader sees, in order, until ``until`` is set and no
    event is left; each page must go on from the last seq seen with no gap."""
    seen: list[int] = []
    while True:
        body = {"tenantId": "root", "after": seen[-1] if seen else 0, "limit": 1000}
        done = until.is_set()
        page = await call(
            session, daemon.url, "compute/events/list", daemon.token, {**body, "waitSeconds": 1}
        )
        seqs = [event["seq"] for event in page["items"]]
        assert seqs == list(range(len(seen) + 1, len(seen) + 1 + len(seqs))), (seen[-1:], seqs)
        seen += seqs
        if done and not seqs:
            return seen


async def test_b5_joins_and_reports_on_three_replicas_keep_one_gapless_order(
    three_replicas: list[Daemon], postgres_url: str
) -> None:
    """B5 on three replicas: joins side by side spend a join token's uses exactly once each
    (never over its limit), while reservations on every replica never over-admit the quota and
    one idempotency key makes one pool; the nodes' first reports turn them ready, and one
    reader long-polling a replica sees every event's seq once, in order, never one before the
    seq before it has committed: the log in the database is gapless."""
    async with aiohttp.ClientSession() as session:
        first = three_replicas[0]
        pool = await root_pool(session, first, gpuModel="H100", ownerQuota={"gpu": 16})
        token = await call(
            session,
            first.url,
            "compute/joinTokens/create",
            first.token,
            {"tenantId": "root", "poolId": pool["id"], "maxUses": 20},
        )
        stop = asyncio.Event()
        reader = asyncio.create_task(follow(session, three_replicas[2], stop))

        async def join(n: int) -> tuple[int, Any]:
            inventory = twin("dgx-h100-01", n)
            body = {
                "joinToken": token["token"],
                "attestor": "join-token",
                "hostname": inventory.hostname,
                "inventory": wire(inventory),
            }
            url = f"{three_replicas[n % 3].url}/api/compute/nodes/join"
            async with session.post(url, json=body) as response:
                return response.status, await response.json()

        async def reserve(n: int) -> str:
            body = {"tenantId": "root", "poolId": pool["id"], "resources": {"gpu": 1}}
            daemon = three_replicas[n % 3]
            url = f"{daemon.url}/api/compute/reservations/create"
            headers = {"Authorization": f"Bearer {daemon.token}"}
            async with session.post(url, json=body, headers=headers) as response:
                answer = await response.json()
                assert response.status == 200, answer
                return "admitted" if answer["reason"] != "QuotaExceeded" else "refused"

        async def keyed(n: int) -> str:
            body = {
                "tenantId": "root",
                "siteId": pool["siteId"],
                "class": "metal-host",
                "idempotencyKey": "one",
            }
            daemon = three_replicas[n % 3]
            made = await call(session, daemon.url, "compute/pools/create", daemon.token, body)
            return str(made["id"])

        joins, reserved, pools = await asyncio.gather(
            asyncio.gather(*(join(n) for n in range(24))),
            asyncio.gather(*(reserve(n) for n in range(30))),
            asyncio.gather(*(keyed(n) for n in range(9))),
        )
        assert Counter(status for status, _ in joins) == {200: 20, 401: 4}, joins
        assert Counter(reserved) == {"admitted": 16, "refused": 14}
        assert len(set(pools)) == 1

        async def ready(n: int, node: Any) -> None:
            daemon = three_replicas[n % 3]
            headers = {"Authorization": f"Bearer {node['token']}"}
            base = f"{daemon.url}/api/compute/nodes"
            async with session.post(
                f"{base}/spec", json={"nodeId": node["nodeId"]}, headers=headers
            ) as response:
                spec = await response.json()
            units = [{"id": unit["id"], "status": "applied"} for unit in spec["units"]]
            applied = {"version": spec["version"], "units": units}
            body = {
                "nodeId": node["nodeId"],
                "inventoryDigest": node["inventoryDigest"],
                "applied": applied,
            }
            async with session.post(f"{base}/report", json=body, headers=headers) as response:
                assert response.status == 200, await response.json()

        joined_nodes = [answer for status, answer in joins if status == 200]
        await asyncio.gather(*(ready(n + 1, node) for n, node in enumerate(joined_nodes)))
        stop.set()
        seen = await asyncio.wait_for(reader, 30)
    seqs = [seq for (seq,) in execute(postgres_url, "SELECT seq FROM events ORDER BY seq")]
    assert seen == seqs == list(range(1, len(seqs) + 1))
    assert execute(postgres_url, "SELECT uses FROM join_tokens") == [(20,)]
    used = "SELECT used FROM quotas WHERE resource = 'gpu' AND pool_id = ?"
    assert execute(postgres_url, used, [pool["id"]]) == [(16,)]
    kinds = Counter(kind for (kind,) in execute(postgres_url, "SELECT type FROM events"))
    assert kinds["node.joined"] == kinds["node.ready"] == 20, kinds
    assert execute(postgres_url, "SELECT state, count(*) FROM nodes GROUP BY state") == [
        ("ready", 20)
    ]


async def report_committed_meanwhile(
    api: Api,
    postgres_url: str,
    node: dict[str, Any],
    held: "asyncio.Future[None]",
    note: str,
    seconds: float,
) -> None:
    """``node`` reports an ``applied`` of its own within ``seconds``: answered 200 and
    committed while the transaction ``held`` still waits open."""
    applied = {"version": "v", "units": [], "note": note}
    response = await asyncio.wait_for(
        api.client.post(
            "/api/compute/nodes/report",
            json={
                "nodeId": node["nodeId"],
                "inventoryDigest": node["inventoryDigest"],
                "applied": applied,
            },
            headers={"Authorization": f"Bearer {node['token']}"},
        ),
        seconds,
    )
    assert response.status == 200, await response.json()
    assert not held.done()
    stored = execute(postgres_url, "SELECT applied FROM nodes WHERE id = ?", [node["nodeId"]])
    assert msgspec.json.decode(stored[0][0]) == applied


async def test_b5_a_report_takes_no_lock_another_replica_holds(
    tmp_path: Path, postgres_url: str, aiohttp_client: Any
) -> None:
    """B5, F10: writes scale across replicas: a report that writes only its own node's rows
    and emits no event completes while another session holds the event order's lock
    (WRITER_LOCK) and another replica is inside a report transaction of its own."""
    # No reconciler pass meanwhile: one would wait for the open report's shared SERIAL_LOCK,
    # and PostgreSQL queues the next shared request behind that exclusive one.
    config = Config(
        db_path=postgres_url, root_token_file=tmp_path / "root.token", reconcile_interval=3600
    )
    api = Api(await aiohttp_client(make_app(config)), config.root_token_file.read_text().strip())
    _, token = await pool_with_token(api, gpuModel="H100")
    nodes = [await joined(api, token, twin("dgx-h100-01", n)) for n in (1, 2)]
    other = Store(postgres_url)  # another replica's store
    holding, release = asyncio.Event(), threading.Event()
    loop = asyncio.get_running_loop()

    def open_report(db: Any) -> None:  # another replica's report, its transaction open
        db.execute("UPDATE nodes SET updated_at = updated_at WHERE id = ?", [nodes[0]["nodeId"]])
        loop.call_soon_threadsafe(holding.set)
        release.wait(30)

    held = asyncio.ensure_future(other.write(open_report, own_rows=nodes[0]["nodeId"]))
    orders = psycopg.connect(postgres_url, autocommit=False)
    try:
        await asyncio.wait_for(holding.wait(), 10)
        orders.execute("SELECT pg_advisory_xact_lock(%s)", [WRITER_LOCK])
        await report_committed_meanwhile(api, postgres_url, nodes[1], held, "moved", 20)
    finally:
        orders.rollback()
        orders.close()
        release.set()
        await held
        other.close()


async def test_f10_reports_of_two_nodes_run_beside_each_other_on_one_replica(
    tmp_path: Path, postgres_url: str, aiohttp_client: Any
) -> None:
    """F10: on one replica too, mutations of one node's own rows run beside each other, each
    on a connection of its own: a report of another node completes (committed) while this
    replica's own transaction for the first node is still open."""
    config = Config(
        db_path=postgres_url, root_token_file=tmp_path / "root.token", reconcile_interval=3600
    )
    api = Api(await aiohttp_client(make_app(config)), config.root_token_file.read_text().strip())
    _, token = await pool_with_token(api, gpuModel="H100")
    nodes = [await joined(api, token, twin("dgx-h100-01", n)) for n in (1, 2)]
    store = api.client.app[RUNTIME].db
    holding, release = asyncio.Event(), threading.Event()
    loop = asyncio.get_running_loop()

    def open_report(db: Any) -> None:  # this replica's report of the first node, held open
        db.execute("UPDATE nodes SET updated_at = updated_at WHERE id = ?", [nodes[0]["nodeId"]])
        loop.call_soon_threadsafe(holding.set)
        release.wait(30)

    held = asyncio.ensure_future(store.write(open_report, own_rows=nodes[0]["nodeId"]))
    try:
        await asyncio.wait_for(holding.wait(), 10)
        await report_committed_meanwhile(api, postgres_url, nodes[1], held, "beside", 10)
    finally:
        release.set()
        await held
