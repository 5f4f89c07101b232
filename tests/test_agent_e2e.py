"""The real daemon and real agent subprocesses on recorded hosts."""

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from tests.daemons import Daemon, call, root_pool
from tests.nodes import DGX_POLICY, FIXTURES

AGENT = Path(sys.executable).parent / "better-compute-agent"


async def demo_pool(daemon: Daemon, gpu_model: str = "H100") -> tuple[str, Path]:
    """A pool with the DGX policy and a join token written to a 0600 file."""
    root = daemon.token
    async with aiohttp.ClientSession() as session:
        pool = await root_pool(session, daemon, gpuModel=gpu_model, policy=DGX_POLICY)
        token = await call(
            session,
            daemon.url,
            "compute/joinTokens/create",
            root,
            {"tenantId": "root", "poolId": pool["id"], "maxUses": 3},
        )
    token_file = daemon.workdir / "join.token"
    token_file.write_text(token["token"])
    token_file.chmod(0o600)
    return pool["id"], token_file


def agent_command(daemon: Daemon, token_file: Path, host: str, *extra: str) -> list[str]:
    return [
        str(AGENT),
        "run",
        "--controlplane",
        daemon.url,
        "--join-token-file",
        str(token_file),
        "--state-dir",
        str(daemon.workdir / "agent"),
        "--fixture",
        str(FIXTURES),
        "--fixture-host",
        host,
        "--log-format",
        "json",
        *extra,
    ]


async def nodes_of(daemon: Daemon, pool: str) -> list[Any]:
    async with aiohttp.ClientSession() as session:
        listed = await call(
            session,
            daemon.url,
            "compute/nodes/list",
            daemon.token,
            {"tenantId": "root", "poolId": pool},
        )
    return list(listed["items"])


async def test_agent_once_joins_reports_and_keeps_its_credential_and_spec(daemon: Daemon) -> None:
    """After one cycle of the real agent on the DGX H100 recording, rows equal hand-computed values."""
    pool, token_file = await demo_pool(daemon)
    command = agent_command(daemon, token_file, "dgx-h100-01", "--once")
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    [node] = await nodes_of(daemon, pool)
    assert {r["resource"]: r["capacity"] for r in node["resources"]}["vcpu"] == (224 - 8) * 2
    assert len(node["devices"]) == 8
    state = daemon.workdir / "agent"
    assert oct(os.stat(state / "node.json").st_mode & 0o777) == "0o600"
    assert (state / "spec.json").exists()
    again = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    assert [n["id"] for n in await nodes_of(daemon, pool)] == [node["id"]]


async def test_agent_exits_non_zero_with_the_reason_when_the_join_is_refused(
    daemon: Daemon,
) -> None:
    """N1 through the agent: an H200 host refused by an H100 pool exits 2 with the reason."""
    _, token_file = await demo_pool(daemon)
    done = subprocess.run(
        agent_command(daemon, token_file, "hgx-h200-01", "--once"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert (
        "refused this host" in done.stderr
        and "INVALID_INPUT" in done.stderr
        and "H200" in done.stderr
    )


async def test_agent_recovers_when_the_control_plane_goes_away_and_comes_back(
    daemon: Daemon,
) -> None:
    """The agent backs off while the control plane is away, then carries on: one node, no duplicate."""
    pool, token_file = await demo_pool(daemon)
    assert daemon.stop() == 0
    log = (daemon.workdir / "agent.log").open("w")
    agent = subprocess.Popen(
        agent_command(
            daemon, token_file, "dgx-h100-01", "--interval", "0.2", "--backoff-max", "0.5"
        ),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        await asyncio.sleep(1.5)  # unreachable: backing off
        assert agent.poll() is None
        daemon.start()
        await wait_for(lambda: (daemon.workdir / "agent" / "node.json").exists())
        first = await nodes_of(daemon, pool)
        assert daemon.stop() == 0
        await asyncio.sleep(1.0)
        daemon.start()
        await asyncio.sleep(1.0)
        assert agent.poll() is None
        after = await nodes_of(daemon, pool)
        assert [n["id"] for n in after] == [n["id"] for n in first]
        assert after[0]["state"] == "ready"
    finally:
        agent.send_signal(signal.SIGTERM)
        code = agent.wait(timeout=20)
        log.close()
    assert code == 0
    text = (daemon.workdir / "agent.log").read_text()
    assert "control plane unreachable" in text and text.count('"joined"') == 1


async def wait_for(condition: Any, seconds: float = 20) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_agent_says_clearly_what_is_missing(daemon: Daemon) -> None:
    """A missing join token file exits 2 with the path; an unreachable control plane with --once exits 1."""
    missing = daemon.workdir / "no-such.token"
    done = subprocess.run(
        agent_command(daemon, missing, "dgx-h100-01", "--once"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and str(missing) in done.stderr and "Traceback" not in done.stderr
    _, token_file = await demo_pool(daemon)
    assert daemon.stop() == 0
    done = subprocess.run(
        agent_command(daemon, token_file, "dgx-h100-01", "--once"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr
