"""End to end: the real daemon as a subprocess on loopback, driven over HTTP, stopped by SIGTERM."""

import asyncio
import json
import os
import sqlite3

import aiohttp

from tests.daemons import Daemon, call, root_pool


async def test_daemon_serves_the_readme_walkthrough_and_survives_restart(daemon: Daemon) -> None:
    """A new user's path: tenant, site, pool, offer, list as the tenant; SIGTERM stops it cleanly."""
    root = daemon.token
    token_file = daemon.workdir / "data" / "root.token"
    assert oct(os.stat(token_file).st_mode & 0o777) == "0o600"
    async with aiohttp.ClientSession() as session:
        async with session.get(f"{daemon.url}/readyz") as ready:
            assert ready.status == 200
        await call(session, daemon.url, "iam/tenants/create", root, {"tenantId": "acme"})
        pool = await root_pool(
            session,
            daemon,
            gpuModel="H100",
            policy={"acceptance": [{"kind": "diag.nvml"}], "maxPending": "6h"},
            idempotencyKey="pool-fra1-h100",
        )
        await call(
            session,
            daemon.url,
            "compute/pools/offer",
            root,
            {
                "tenantId": "root",
                "poolId": pool["id"],
                "toTenantId": "acme",
                "quota": {"gpu": 32},
                "priority": 10,
            },
        )
        acme = (
            await call(session, daemon.url, "iam/credentials/create", root, {"tenantId": "acme"})
        )["token"]
        listed = await call(session, daemon.url, "compute/pools/list", acme, {"tenantId": "acme"})
        assert [(p["id"], p["owned"], p["quotas"][0]["max"]) for p in listed["items"]] == [
            (pool["id"], False, 32)
        ]

    assert daemon.stop() == 0
    lines = [json.loads(line) for line in daemon.log.read_text().splitlines()]
    requests = [line for line in lines if line["event"] == "request"]
    assert len(requests) == 7  # one line per request
    assert all(line["request_id"].startswith("req_") for line in requests)
    assert lines[-1]["event"] == "stopped"
    assert root not in daemon.log.read_text() and acme not in daemon.log.read_text()

    daemon.start()
    async with aiohttp.ClientSession() as session:
        again = await call(session, daemon.url, "compute/pools/list", acme, {"tenantId": "acme"})
    assert again == listed
    assert daemon.stop() == 0


async def test_sigkill_mid_load_leaves_the_database_consistent(daemon: Daemon) -> None:
    """A crash at any point leaves rows and events consistent: one transaction per mutation."""
    root = daemon.token
    async with aiohttp.ClientSession() as session:
        tenants = [f"t{i}" for i in range(8)]
        for tenant in tenants:
            await call(session, daemon.url, "iam/tenants/create", root, {"tenantId": tenant})
        pool = await root_pool(session, daemon)

        async def offer(i: int) -> None:
            body = {
                "tenantId": "root",
                "poolId": pool["id"],
                "toTenantId": tenants[i % 8],
                "quota": {"gpu": i},
            }
            try:
                async with session.post(
                    f"{daemon.url}/api/compute/pools/offer",
                    json=body,
                    headers={"Authorization": f"Bearer {root}"},
                ) as response:
                    await response.read()
                    if response.status == 200:
                        answered.set()
            except aiohttp.ClientError:
                pass  # the daemon died under this request

        answered = asyncio.Event()
        load = [asyncio.create_task(offer(i)) for i in range(400)]
        await asyncio.wait_for(answered.wait(), 30)  # mid-load: some offers have landed
        await asyncio.sleep(0.1)
        assert daemon.process is not None
        daemon.process.kill()
        daemon.process.wait()
        daemon.process = None
        await asyncio.gather(*load)

    conn = sqlite3.connect(daemon.workdir / "data" / "bc.db")
    assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    offered = conn.execute(
        "SELECT data FROM events WHERE type = 'pool.offered' ORDER BY seq"
    ).fetchall()
    assert offered, "the load should have landed some offers before the kill"
    last: dict[str, int] = {}
    for (data,) in offered:
        payload = json.loads(data)
        last[payload["toTenantId"]] = payload["quota"]["gpu"]
    rows = dict(
        conn.execute("SELECT tenant_id, max FROM quotas WHERE tenant_id != 'root'").fetchall()
    )
    assert rows == last
    seqs = [s for (s,) in conn.execute("SELECT seq FROM events ORDER BY seq")]
    assert seqs == list(range(1, len(seqs) + 1))
    conn.close()
    daemon.start()
    async with aiohttp.ClientSession() as session:
        got = await call(
            session,
            daemon.url,
            "compute/pools/get",
            root,
            {"tenantId": "root", "poolId": pool["id"]},
        )
    assert {o["toTenantId"]: o["quota"]["gpu"] for o in got["offers"]} == last
