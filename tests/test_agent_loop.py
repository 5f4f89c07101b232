"""The agent's loop against a stand-in control plane: applying while it is away, surviving bad specs."""

import json
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import pytest
import structlog

from agent.client import Refused, Unreachable
from agent.loop import Agent, JoinRefused, Settings
from agent.main import run
from agent.state import NodeCredential, State
from shared.sdnotify import Notifier
from tests.nodes import recorded
from tests.specs import HUGEPAGES_FILE, HUGEPAGES_TEXT, host_apply, served

SPEC = served("s1")


class AwayControlPlane:
    """A control plane that does not answer."""

    def report(self, *args: Any) -> Any:
        raise Unreachable("away")

    def spec(self, *args: Any) -> Any:
        raise Unreachable("away")


class OddControlPlane:
    """A control plane whose spec has a unit kind this agent does not know."""

    def report(self, *args: Any) -> Any:
        return {"specVersion": "s2"}

    def spec(self, *args: Any) -> Any:
        return {"version": "s2", "reboot": False, "units": [{"id": "u", "kind": "teleport"}]}


class WorkingControlPlane:
    """A control plane that lets the host join and serves SPEC."""

    def join(self, *args: Any) -> Any:
        return {"nodeId": "node_x", "token": "bcn_x", "poolId": "pool_x", "rejoined": False}

    def report(self, *args: Any) -> Any:
        return {"specVersion": SPEC["version"]}

    def spec(self, *args: Any) -> Any:
        return SPEC


class RemovedControlPlane:
    """A control plane that no longer knows the node's credential and refuses every join token."""

    def __init__(self) -> None:
        self.joins = 0

    def report(self, *args: Any) -> Any:
        raise Refused(401, "UNAUTHENTICATED", "unknown node credential", {})

    def join(self, *args: Any) -> Any:
        self.joins += 1
        raise Refused(401, "UNAUTHENTICATED", "the join token is used up", {})


def agent(
    tmp_path: Path, client: Any, notifier: Notifier | None = None, joined: bool = True
) -> tuple[Agent, State]:
    state = State(tmp_path / "state")
    if joined:
        state.save_credential(NodeCredential("node_x", "bcn_x", "pool_x", "http://127.0.0.1:9"))
    root = tmp_path / "root"
    settings = Settings(
        controlplane="http://127.0.0.1:9",
        join_token_file=tmp_path / "t",
        interval=0.01,
        backoff_cap=0.01,
        rejoin_backoff_cap=0.01,
    )
    host = recorded("dgx-h100-01")
    gate = host_apply(root, tmp_path / "state")
    return Agent(settings, state, lambda: host, client, gate, notifier), state


def run_for(loop: Agent, seconds: float = 0.3) -> None:
    """Run the loop until stopped after ``seconds``; whatever it raises escapes."""
    stop = threading.Event()
    timer = threading.Timer(seconds, stop.set)
    timer.start()
    try:
        loop.run(stop)
    finally:
        timer.cancel()


@contextmanager
def listening_systemd() -> Iterator[tuple[list[str], str]]:
    """systemd's end of NOTIFY_SOCKET at an @abstract address: every datagram, read as it lands.

    Read by a thread, because a datagram socket queues only a few (10 on Linux) before the
    sender's send times out.
    """
    name = f"better-compute-test-{uuid.uuid4().hex}"
    messages: list[str] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(0.05)
        done = threading.Event()

        def read() -> None:
            while not done.is_set():
                with suppress(TimeoutError):
                    messages.append(sock.recv(4096).decode())

        reader = threading.Thread(target=read)
        reader.start()
        try:
            yield messages, "@" + name
        finally:
            done.set()
            reader.join()
            sock.setblocking(False)
            with suppress(BlockingIOError):
                while True:  # what landed after the reader's last read
                    messages.append(sock.recv(4096).decode())


def test_the_last_spec_is_applied_while_the_control_plane_is_away(tmp_path: Path) -> None:
    """DESIGN §6: while the control plane is away the agent keeps applying the last NodeSpec it has."""
    loop, state = agent(tmp_path, AwayControlPlane())
    state.save_spec(SPEC)
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    loop.run(stop)
    assert (tmp_path / "root" / HUGEPAGES_FILE).read_text() == HUGEPAGES_TEXT


def test_a_spec_it_cannot_read_does_not_stop_the_agent(tmp_path: Path) -> None:
    """A unit kind this agent does not know is logged and retried; the loop goes on until stopped."""
    loop, _ = agent(tmp_path, OddControlPlane())
    stop = threading.Event()
    threading.Timer(0.3, stop.set).start()
    loop.run(stop)  # returns when stopped: nothing escaped
    assert stop.is_set()


def test_a_kept_spec_it_cannot_read_is_moved_aside_and_fetched_again(tmp_path: Path) -> None:
    """R9: a kept spec whose units this agent cannot read (a unit kind it does not know, units
    that are no list) is moved aside once, even while its version is current, and fetched
    again; a spec it cannot read from the control plane is never kept."""
    for damaged in (
        {"version": SPEC["version"], "units": [{"id": "u", "kind": "teleport"}]},
        {"version": SPEC["version"], "units": "garbage"},
    ):
        loop, state = agent(tmp_path, WorkingControlPlane())
        state.save_spec(damaged)
        with structlog.testing.capture_logs() as logs:
            run_for(loop)  # returns when stopped: nothing escaped
        moved = [e for e in logs if e["event"] == "damaged state file moved aside"]
        assert len(moved) == 1, logs
        assert state.spec() == SPEC
        assert (tmp_path / "root" / HUGEPAGES_FILE).read_text() == HUGEPAGES_TEXT
        for aside in (tmp_path / "state").glob("spec.json.damaged-*"):
            aside.unlink()
    loop, state = agent(tmp_path / "odd", OddControlPlane())
    with structlog.testing.capture_logs() as logs:
        run_for(loop)
    assert state.spec() is None
    assert not list((tmp_path / "odd" / "state").glob("spec.json.damaged-*"))


def test_a_kept_spec_that_is_not_a_spec_is_moved_aside_while_away(tmp_path: Path) -> None:
    """R9: JSON that is no NodeSpec in spec.json: moved aside with one log line, the loop goes on."""
    loop, _ = agent(tmp_path, AwayControlPlane())
    (tmp_path / "state/spec.json").write_text("[1, 2]")
    with structlog.testing.capture_logs() as logs:
        run_for(loop)
    moved = [entry for entry in logs if entry["event"] == "damaged state file moved aside"]
    assert [entry["path"] for entry in moved] == [str(tmp_path / "state/spec.json")]
    [aside] = (tmp_path / "state").glob("spec.json.damaged-*")
    assert aside.read_text() == "[1, 2]"


def test_a_damaged_apply_record_is_moved_aside_and_applying_goes_on(tmp_path: Path) -> None:
    """R9: an unparseable applied.json is moved aside; the kept spec is applied and recorded anew."""
    loop, state = agent(tmp_path, AwayControlPlane())
    state.save_spec(SPEC)
    (tmp_path / "state/applied.json").write_text('{"f": {"kind": "fi')
    run_for(loop)
    assert (tmp_path / "root" / HUGEPAGES_FILE).read_text() == HUGEPAGES_TEXT
    assert len(list((tmp_path / "state").glob("applied.json.damaged-*"))) == 1
    record = json.loads((tmp_path / "state/applied.json").read_text())
    assert record["hugepages/sysctl-file"]["kind"] == "file"


@pytest.mark.parametrize(
    ("client", "pings"), [(OddControlPlane(), False), (WorkingControlPlane(), True)]
)
def test_the_watchdog_is_pinged_only_after_a_cycle_that_worked(
    tmp_path: Path, client: Any, pings: bool
) -> None:
    """R9: cycles that fail (a spec it cannot apply) send no WATCHDOG=1; cycles that work do."""
    with listening_systemd() as (messages, address):
        loop, _ = agent(tmp_path, client, Notifier(address, watchdog_usec=20_000))
        run_for(loop)
    assert messages[0].startswith("READY=1") and messages[-1] == "STOPPING=1"
    assert ("WATCHDOG=1" in messages) is pings


def test_a_refused_join_again_is_retried_not_final(tmp_path: Path) -> None:
    """H8: 401 on the credential, then the join token refused: the loop retries with backoff, no raise."""
    (tmp_path / "t").write_text("bcj_spent")
    client = RemovedControlPlane()
    loop, state = agent(tmp_path, client)
    with structlog.testing.capture_logs() as logs:
        run_for(loop)
    assert client.joins >= 2
    said = [entry["event"] for entry in logs]
    assert said.count("node credential refused; joining again") == 1
    assert state.credential() is not None  # kept: a restarted agent still knows it had joined


def test_a_refused_first_join_is_still_final(tmp_path: Path) -> None:
    """H8 keeps N1: the first join of a fresh state directory, refused, raises JoinRefused."""
    (tmp_path / "t").write_text("bcj_spent")
    loop, _ = agent(tmp_path, RemovedControlPlane(), joined=False)
    with pytest.raises(JoinRefused, match="used up"):
        run_for(loop)


def test_a_host_that_joined_waits_for_a_new_join_token_file(tmp_path: Path) -> None:
    """H8: 401 on the credential and the join token file deleted since: it says so and retries."""
    loop, _ = agent(tmp_path, RemovedControlPlane())
    with structlog.testing.capture_logs() as logs:
        run_for(loop)
    refused = [e for e in logs if e["event"].startswith("cannot join this host again")]
    assert len(refused) >= 2
    assert "cannot read the join token file" in refused[0]["error"]


def test_the_wait_between_refused_joins_doubles_up_to_five_minutes(tmp_path: Path) -> None:
    """H8: the backoff after a refused join again grows ×2 from 1 s and is capped at 300 s by default."""
    [option] = [p for p in run.params if p.name == "rejoin_backoff_max"]
    assert option.default == 300.0 == Settings("http://x", Path("t")).rejoin_backoff_cap
    loop, _ = agent(tmp_path, AwayControlPlane())
    for failures, ceiling in [(0, 1), (3, 8), (8, 256), (9, 300), (30, 300)]:
        waits = [loop.backoff(failures, 300.0) for _ in range(200)]
        assert ceiling / 2 < max(waits) <= ceiling


def test_the_state_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """R7: under umask 022 the state directory is made 0700 and every file in it 0600."""
    previous = os.umask(0o022)
    try:
        loop, _ = agent(tmp_path, WorkingControlPlane(), joined=False)
        (tmp_path / "t").write_text("bcj_x")
        loop.run(threading.Event(), once=True)
    finally:
        os.umask(previous)
    state = tmp_path / "state"
    assert state.stat().st_mode & 0o777 == 0o700
    modes = {path.name: path.stat().st_mode & 0o777 for path in state.iterdir()}
    assert modes == {"node.json": 0o600, "spec.json": 0o600, "applied.json": 0o600}
