"""The real agent never wedges (R9), keeps its state private (R7) and joins again after a 401 (H8).

Each test runs `better-compute-agent run` as a subprocess against the real
control plane on loopback, with a recorded host and a temporary --root.
"""

import asyncio
import json
import os
import signal
import socket
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import execute
from tests.daemons import Daemon, call
from tests.test_agent_e2e import agent_command, demo_pool, nodes_of, wait_for
from tests.test_sdnotify import FakeSystemd

DAMAGED = "damaged state file moved aside"
REJOIN_REFUSED = "cannot join this host again"


@pytest.fixture
def fake_systemd() -> Iterator[FakeSystemd]:
    """NOTIFY_SOCKET as an abstract socket: no path-length limit whatever tmp_path is."""
    name = f"better-compute-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        yield FakeSystemd(sock, "@" + name)


def command(daemon: Daemon, token_file: Path, *extra: str) -> list[str]:
    root = str(daemon.workdir / "host-root")
    return agent_command(daemon, token_file, "dgx-h100-01", "--root", root, *extra)


def once(daemon: Daemon, token_file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command(daemon, token_file, "--once"),
        capture_output=True,
        text=True,
        timeout=60,
        umask=0o022,
    )


def lines(text: str) -> list[dict[str, Any]]:
    """The JSON log lines of an agent's output."""
    found = []
    for line in text.splitlines():
        try:
            found.append(json.loads(line))
        except ValueError:
            continue
    return found


def events(path: Path, event: str) -> list[dict[str, Any]]:
    """The log lines of one event so far in a log file."""
    return [line for line in lines(path.read_text()) if line.get("event", "").startswith(event)]


async def new_join_token(daemon: Daemon, pool: str) -> str:
    async with aiohttp.ClientSession() as session:
        created = await call(
            session,
            daemon.url,
            "compute/joinTokens/create",
            daemon.token,
            {"tenantId": "root", "poolId": pool, "maxUses": 3},
        )
    return str(created["token"])


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


async def test_r9_a_damaged_credential_is_moved_aside_and_the_host_joins_again(
    daemon: Daemon,
) -> None:
    """R9: a torn node.json is moved aside with one log line naming it; the agent joins again."""
    pool, token_file = await demo_pool(daemon)
    assert once(daemon, token_file).returncode == 0
    [node] = await nodes_of(daemon, pool)
    state = daemon.workdir / "agent"
    (state / "node.json").write_text('{"nodeId": "node_')  # torn mid-write
    done = once(daemon, token_file)
    assert done.returncode == 0, done.stdout + done.stderr
    [aside] = state.glob("node.json.damaged-*")
    assert aside.read_text() == '{"nodeId": "node_'
    assert mode(aside) == 0o600  # it may hold a token
    [said] = [line for line in lines(done.stdout) if line["event"] == DAMAGED]
    assert said["path"] == str(state / "node.json") and said["moved_to"] == str(aside)
    assert json.loads((state / "node.json").read_text())["nodeId"] == node["id"]
    assert [n["id"] for n in await nodes_of(daemon, pool)] == [node["id"]]


async def test_r9_no_watchdog_pings_while_the_agent_cannot_join(
    daemon: Daemon, fake_systemd: FakeSystemd
) -> None:
    """R9: damaged credential and a refused join: no WATCHDOG=1 while it retries; pings once joined."""
    pool, token_file = await demo_pool(daemon)
    good_token = token_file.read_text()
    token_file.write_text("bcj_not-a-token")
    state = daemon.workdir / "agent"
    state.mkdir()
    (state / "node.json").write_bytes(b"\xff\xfe not json")
    env = {**os.environ, "NOTIFY_SOCKET": fake_systemd.address, "WATCHDOG_USEC": "200000"}
    env.pop("WATCHDOG_PID", None)  # a ping every 0.1 s when healthy
    log = daemon.workdir / "agent.log"
    argv = command(daemon, token_file, "--interval", "0.2", "--rejoin-backoff-max", "0.2")
    with log.open("wb") as out:
        agent = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        fake_systemd.until("READY")
        await wait_for(lambda: len(events(log, REJOIN_REFUSED)) >= 3)
        assert agent.poll() is None
        assert [m for m in fake_systemd.drain() if "WATCHDOG" in m] == []
        assert len(events(log, DAMAGED)) == 1
        token_file.write_text(good_token)
        assert "WATCHDOG" in fake_systemd.until("WATCHDOG", timeout=10)[0]
        assert len(await nodes_of(daemon, pool)) == 1
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()


async def test_r9_a_damaged_kept_spec_while_the_control_plane_is_away_is_moved_aside(
    daemon: Daemon,
) -> None:
    """R9: an unparseable spec.json with the control plane away: moved aside once, no exit; refetched."""
    _, token_file = await demo_pool(daemon)
    assert once(daemon, token_file).returncode == 0
    assert daemon.stop() == 0
    spec = daemon.workdir / "agent" / "spec.json"
    spec.write_text('{\n  "version": ')
    log = daemon.workdir / "agent.log"
    argv = command(daemon, token_file, "--interval", "0.2", "--backoff-max", "0.2")
    with log.open("wb") as out:
        agent = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        await wait_for(lambda: len(events(log, "control plane unreachable")) >= 3)
        assert agent.poll() is None
        [said] = events(log, DAMAGED)
        assert said["path"] == str(spec)
        assert not spec.exists()  # no spec to apply until it can fetch one
        daemon.start()
        await wait_for(spec.exists)
        assert json.loads(spec.read_text())["version"]
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert len(events(log, DAMAGED)) == 1


async def test_r7_an_existing_state_directory_is_tightened_and_its_secrets_are_0600(
    daemon: Daemon,
) -> None:
    """R7: under umask 022 a state directory made 0755 becomes 0700; node.json and spec.json 0600."""
    _, token_file = await demo_pool(daemon)
    state = daemon.workdir / "agent"
    state.mkdir()
    state.chmod(0o755)
    done = once(daemon, token_file)
    assert done.returncode == 0, done.stdout + done.stderr
    assert mode(state) == 0o700
    assert mode(state / "node.json") == 0o600
    assert mode(state / "spec.json") == 0o600


async def test_h8_a_refused_credential_joins_again_and_a_refused_join_is_retried(
    daemon: Daemon,
) -> None:
    """H8: a 401 on the credential with a spent join token: the agent retries, never exits; joins with a new one."""
    pool, token_file = await demo_pool(daemon)
    log = daemon.workdir / "agent.log"
    argv = command(daemon, token_file, "--interval", "0.2", "--rejoin-backoff-max", "0.3")
    with log.open("wb") as out:
        agent = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        await wait_for(lambda: len(events(log, "joined")) == 1)
        [node] = await nodes_of(daemon, pool)
        db = daemon.workdir / "data" / "bc.db"
        # The join token expired, then the node's credential revoked, as a removal does (in
        # this order: a report refused in between would join again with the token).
        execute(db, "UPDATE join_tokens SET expires_at = '2000-01-01T00:00:00.000Z'")
        execute(db, "UPDATE nodes SET token_hash = randomblob(32)")
        await wait_for(lambda: len(events(log, REJOIN_REFUSED)) >= 3)
        await asyncio.sleep(0.5)
        assert agent.poll() is None, "the agent exited"
        retries = events(log, REJOIN_REFUSED)
        assert all(0 <= line["retry_in"] <= 0.3 for line in retries)
        assert "join token" in retries[0]["error"]
        assert len(events(log, "node credential refused")) == 1  # said once, not per retry
        token_file.write_text(await new_join_token(daemon, pool))
        await wait_for(lambda: len(events(log, "joined")) == 2)
        assert events(log, "joined")[1]["rejoined"] is True
        assert [n["id"] for n in await nodes_of(daemon, pool)] == [node["id"]]
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=20) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
