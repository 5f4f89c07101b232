"""H1 and H8 end to end: the real daemon and the real agent on recorded hosts."""

import asyncio
import json
import subprocess
from pathlib import Path
from typing import Any

import aiohttp

from tests.daemons import Daemon, call
from tests.nodes import DGX_POLICY
from tests.test_agent_e2e import agent_command, demo_pool, nodes_of


async def reserve(daemon: Daemon, pool: str) -> Any:
    async with aiohttp.ClientSession() as session:
        return await call(
            session,
            daemon.url,
            "compute/reservations/create",
            daemon.token,
            {"tenantId": "root", "poolId": pool, "resources": {"gpu": 1}},
        )


async def test_h1_a_dry_run_agent_leaves_its_node_configuring_and_unplaced(
    daemon: Daemon, tmp_path: Path
) -> None:
    """H1, H2: a node whose agent runs with --dry-run applied nothing: configuring, and a
    gpu: 1 reservation is not placed on it; the same host's agent applying into a directory
    root makes it ready and the next reservation is placed."""
    pool, token_file = await demo_pool(daemon)
    dry = agent_command(daemon, token_file, "dgx-h100-01", "--once", "--dry-run")
    done = subprocess.run(dry, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [node] = await nodes_of(daemon, pool)
    assert (node["state"], node["schedulable"], node["appliedVersion"]) == (
        "configuring",
        False,
        None,
    )
    assert (await reserve(daemon, pool))["state"] == "pending"
    real = agent_command(daemon, token_file, "dgx-h100-01", "--once", "--root", str(tmp_path))
    done = subprocess.run(real, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [node] = await nodes_of(daemon, pool)
    assert (node["state"], node["appliedVersion"]) == ("ready", node["specVersion"])
    assert (await reserve(daemon, pool))["state"] == "placed"


async def test_h8_a_removed_nodes_agent_joins_the_pool_of_its_new_token(
    daemon: Daemon, tmp_path: Path
) -> None:
    """H8, H3: the agent of a removed node gets 401, joins again with its join token file;
    with a token of another pool written there, the host becomes a ready node of that pool."""
    pool, token_file = await demo_pool(daemon)
    log = daemon.workdir / "agent.log"
    command = agent_command(
        daemon, token_file, "dgx-h100-01", "--interval", "0.2", "--root", str(tmp_path)
    )
    with log.open("wb") as out:
        agent = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        for _ in range(100):  # bounded: 10 s
            nodes = await nodes_of(daemon, pool)
            if nodes and nodes[0]["state"] == "ready":
                break
            await asyncio.sleep(0.1)
        [node] = nodes
        async with aiohttp.ClientSession() as session:
            site = (
                await call(
                    session, daemon.url, "compute/sites/list", daemon.token, {"tenantId": "root"}
                )
            )["items"][0]
            other = await call(
                session,
                daemon.url,
                "compute/pools/create",
                daemon.token,
                {
                    "tenantId": "root",
                    "siteId": site["id"],
                    "class": "metal-host",
                    "gpuModel": "H100",
                    "policy": DGX_POLICY,
                },
            )
            token = await call(
                session,
                daemon.url,
                "compute/joinTokens/create",
                daemon.token,
                {"tenantId": "root", "poolId": other["id"]},
            )
            token_file.write_text(token["token"])
            removed = await call(
                session,
                daemon.url,
                "compute/nodes/remove",
                daemon.token,
                {"tenantId": "root", "nodeId": node["id"]},
            )
        assert removed == {"removed": True}
        moved: list[Any] = []
        for _ in range(150):  # bounded: 15 s
            moved = await nodes_of(daemon, other["id"])
            if moved and moved[0]["state"] == "ready":
                break
            await asyncio.sleep(0.1)
        assert moved and moved[0]["state"] == "ready", moved
        assert moved[0]["id"] != node["id"] and moved[0]["hostname"] == "dgx-h100-01"
        assert await nodes_of(daemon, pool) == []
        assert agent.poll() is None
    finally:
        agent.terminate()
        agent.wait(timeout=20)
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    assert any(line.get("event") == "node credential refused; joining again" for line in lines)
