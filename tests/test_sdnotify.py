"""sd_notify: datagrams on a real AF_UNIX socket, and the control-plane daemon under a fake systemd.

systemd is faked the way it talks to services: a datagram socket named by
NOTIFY_SOCKET and a WATCHDOG_USEC in the environment. Nothing else is mocked.
"""

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from shared.sdnotify import Notifier
from tests.daemons import DAEMON, Daemon, free_port
from tests.test_agent_e2e import agent_command, demo_pool


class FakeSystemd:
    """The receiving end of NOTIFY_SOCKET: a bound datagram socket and the messages on it."""

    def __init__(self, sock: socket.socket, address: str) -> None:
        self.sock = sock
        self.address = address  # as it goes into NOTIFY_SOCKET

    def receive(self, timeout: float = 5.0) -> dict[str, str]:
        """The next datagram as its KEY=value fields."""
        self.sock.settimeout(timeout)
        data = self.sock.recv(4096).decode()
        return dict(line.split("=", 1) for line in data.splitlines())

    def drain(self) -> list[dict[str, str]]:
        """Every datagram already queued."""
        found: list[dict[str, str]] = []
        self.sock.setblocking(False)
        try:
            while True:
                data = self.sock.recv(4096).decode()
                found.append(dict(line.split("=", 1) for line in data.splitlines()))
        except BlockingIOError:
            return found

    def until(self, key: str, timeout: float = 20.0) -> tuple[dict[str, str], list[dict[str, str]]]:
        """Receive until a message with ``key`` arrives; that message and the ones before it."""
        before: list[dict[str, str]] = []
        deadline = time.monotonic() + timeout
        while True:
            message = self.receive(max(0.01, deadline - time.monotonic()))
            if key in message:
                return message, before
            before.append(message)


@pytest.fixture
def systemd(tmp_path: Path) -> Iterator[FakeSystemd]:
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind(str(path))
        yield FakeSystemd(sock, str(path))


def test_ready_carries_status(systemd: FakeSystemd) -> None:
    """READY=1 and the STATUS line arrive in one datagram."""
    Notifier(systemd.address).ready(status="serving on http://127.0.0.1:8080")
    assert systemd.receive() == {"READY": "1", "STATUS": "serving on http://127.0.0.1:8080"}


def test_status_stopping_and_watchdog(systemd: FakeSystemd) -> None:
    """STATUS, STOPPING=1 and WATCHDOG=1 each arrive as sent."""
    notifier = Notifier(systemd.address, watchdog_usec=30_000_000)
    notifier.status("applying spec 3")
    notifier.watchdog()
    notifier.stopping()
    assert systemd.receive() == {"STATUS": "applying spec 3"}
    assert systemd.receive() == {"WATCHDOG": "1"}
    assert systemd.receive() == {"STOPPING": "1"}


def test_status_is_one_line(systemd: FakeSystemd) -> None:
    """A newline in a status would start a new field; it becomes a space."""
    Notifier(systemd.address).status("a\nb")
    assert systemd.receive() == {"STATUS": "a b"}


def test_extend_timeout_in_microseconds(systemd: FakeSystemd) -> None:
    """extend_timeout(seconds) sends EXTEND_TIMEOUT_USEC in microseconds."""
    Notifier(systemd.address).extend_timeout(600)
    assert systemd.receive() == {"EXTEND_TIMEOUT_USEC": "600000000"}


def test_abstract_socket() -> None:
    """An @name NOTIFY_SOCKET is the abstract socket of that name."""
    name = f"better-compute-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        notifier = Notifier.from_environment({"NOTIFY_SOCKET": "@" + name})
        notifier.ready()
        sock.settimeout(5)
        assert sock.recv(4096) == b"READY=1"


def test_from_environment_reads_socket_and_watchdog(systemd: FakeSystemd) -> None:
    """NOTIFY_SOCKET and WATCHDOG_USEC give the socket and half the period as the interval."""
    notifier = Notifier.from_environment(
        {"NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": "30000000"}
    )
    assert notifier.enabled
    assert notifier.watchdog_interval() == 15.0
    notifier.watchdog()
    assert systemd.receive() == {"WATCHDOG": "1"}


def test_no_notify_socket_is_a_no_op() -> None:
    """Without NOTIFY_SOCKET every call does nothing and there is no watchdog."""
    notifier = Notifier.from_environment({"WATCHDOG_USEC": "30000000"})
    assert not notifier.enabled
    assert notifier.watchdog_interval() is None
    notifier.ready(status="x")
    notifier.status("x")
    notifier.watchdog()
    notifier.extend_timeout(5)
    notifier.stopping()
    assert notifier.notify("READY=1") is False


def test_watchdog_pid_of_another_process(systemd: FakeSystemd) -> None:
    """WATCHDOG_PID naming another process means the watchdog is not ours to feed."""
    env = {"NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"}
    assert Notifier.from_environment(env, pid=4242).watchdog_interval() is None
    assert Notifier.from_environment(env, pid=1).watchdog_interval() == 15.0


@pytest.mark.parametrize("value", ["", "0", "-5", "soon"])
def test_unusable_watchdog_usec(systemd: FakeSystemd, value: str) -> None:
    """A WATCHDOG_USEC that is not a positive integer is no watchdog."""
    env = {"NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": value}
    notifier = Notifier.from_environment(env)
    assert notifier.watchdog_interval() is None
    notifier.watchdog()
    assert systemd.drain() == []


def test_unsupported_socket_address() -> None:
    """A NOTIFY_SOCKET neither a path nor @abstract (vsock:…) disables notifying."""
    assert not Notifier.from_environment({"NOTIFY_SOCKET": "vsock:2:1234"}).enabled


def test_send_failure_is_logged_once(tmp_path: Path) -> None:
    """A socket that is gone makes sends fail quietly: no exception, one warning."""
    notifier = Notifier(str(tmp_path / "gone.sock"), watchdog_usec=1_000_000)
    with structlog.testing.capture_logs() as logs:
        notifier.ready()
        notifier.watchdog()
        assert notifier.notify("STATUS=x") is False
    assert [entry["event"] for entry in logs] == ["cannot notify systemd; carrying on without it"]


def test_wait_pings_while_waiting(systemd: FakeSystemd) -> None:
    """wait() pings on entry and every half period until the time is up, then returns False."""
    notifier = Notifier(systemd.address, watchdog_usec=200_000)  # a ping every 0.1 s
    started = time.monotonic()
    assert notifier.wait(threading.Event(), 0.45) is False
    assert time.monotonic() - started >= 0.45
    pings = systemd.drain()
    assert len(pings) >= 5, pings
    assert all(ping == {"WATCHDOG": "1"} for ping in pings)


def test_wait_returns_when_stopped(systemd: FakeSystemd) -> None:
    """wait() returns True as soon as stop is set, however long it was asked to wait."""
    notifier = Notifier(systemd.address, watchdog_usec=60_000_000)
    stop = threading.Event()
    threading.Timer(0.1, stop.set).start()
    started = time.monotonic()
    assert notifier.wait(stop, 3600) is True
    assert time.monotonic() - started < 5


def test_wait_without_systemd_is_a_plain_wait() -> None:
    """Not under systemd, wait() is stop.wait()."""
    stop = threading.Event()
    assert Notifier().wait(stop, 0.01) is False
    stop.set()
    assert Notifier().wait(stop, 3600) is True


async def test_watchdog_loop_pings_only_while_the_loop_turns(systemd: FakeSystemd) -> None:
    """The asyncio pinger pings every interval, and not at all while the event loop is blocked."""
    notifier = Notifier(systemd.address, watchdog_usec=100_000)  # a ping every 0.05 s
    task = asyncio.create_task(notifier.watchdog_loop())
    await asyncio.sleep(0.3)
    assert len(systemd.drain()) >= 3
    time.sleep(0.5)  # noqa: ASYNC251 (the point: a stuck event loop)
    task.cancel()  # before the loop turns again: the task never ran during the stall
    with pytest.raises(asyncio.CancelledError):
        await task
    assert systemd.drain() == []


async def test_watchdog_loop_without_watchdog_returns() -> None:
    """Without a watchdog the pinger has nothing to do and returns."""
    await asyncio.wait_for(Notifier("/nonexistent").watchdog_loop(), timeout=1)


def test_controlplane_daemon_notifies_systemd(systemd: FakeSystemd, tmp_path: Path) -> None:
    """The real daemon says READY=1 once it listens, pings the watchdog, and says STOPPING=1."""
    port = free_port()
    env = {
        **os.environ,
        "NOTIFY_SOCKET": systemd.address,
        "WATCHDOG_USEC": "1000000",  # a ping every 0.5 s
    }
    env.pop("WATCHDOG_PID", None)
    log = tmp_path / "daemon.log"
    argv = [str(DAEMON), "serve", "--db", str(tmp_path / "bc.db")]
    argv += ["--listen", f"127.0.0.1:{port}", "--log-format", "json"]
    with log.open("wb") as out:
        process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        try:
            ready, _ = systemd.until("READY")
        except TimeoutError:
            raise AssertionError(f"no READY=1; daemon log:\n{log.read_text()}") from None
        assert ready["STATUS"] == f"serving on http://127.0.0.1:{port}"
        # Ready means listening: a connection is taken at once.
        with socket.create_connection(("127.0.0.1", port), timeout=2):
            pass
        started = time.monotonic()
        for _ in range(3):
            assert systemd.until("WATCHDOG", timeout=5)[0] == {"WATCHDOG": "1"}
        assert time.monotonic() - started < 5
        process.send_signal(signal.SIGTERM)
        stopping, _ = systemd.until("STOPPING", timeout=20)
        assert stopping["STOPPING"] == "1"
        assert process.wait(timeout=20) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


async def test_agent_notifies_systemd(systemd: FakeSystemd, tmp_path: Path) -> None:
    """The real agent says READY=1 after its first cycle, pings the watchdog between cycles, says STOPPING=1."""
    daemon = Daemon(tmp_path)
    daemon.start()
    try:
        _, token_file = await demo_pool(daemon)
        env = {**os.environ, "NOTIFY_SOCKET": systemd.address, "WATCHDOG_USEC": "1000000"}
        env.pop("WATCHDOG_PID", None)
        argv = agent_command(
            daemon, token_file, "dgx-h100-01", "--interval", "30", "--root", str(tmp_path / "root")
        )
        with (tmp_path / "agent.log").open("wb") as out:
            process = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            ready, _ = systemd.until("READY")
            assert daemon.url in ready["STATUS"]
            for _ in range(2):
                assert "WATCHDOG" in systemd.until("WATCHDOG", timeout=5)[0]
            process.send_signal(signal.SIGTERM)
            assert systemd.until("STOPPING", timeout=20)[0]["STOPPING"] == "1"
            assert process.wait(timeout=20) == 0
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    finally:
        daemon.kill()
