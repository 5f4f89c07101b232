"""F4: a request's whole body must arrive within --body-timeout of its headers, or the answer is
408 (INVALID_INPUT) and the connection closes; a body in time is served. On a real daemon,
over raw sockets."""

import http.client
import json
import select
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from controlplane.config import Config
from controlplane.main import cli
from tests.daemons import Daemon

TIMEOUT_S = 0.5
BODY = b'{"tenantId":"root"}'


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    running = Daemon(tmp_path_factory.mktemp("body"), "--body-timeout", str(TIMEOUT_S))
    running.start()
    yield running
    running.kill()


def head(daemon: Daemon, framing: bytes, path: str = "/api/compute/pools/list") -> bytes:
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Authorization: Bearer {daemon.token}\r\n".encode()
        + framing
        + b"\r\n"
    )


def answer(sock: socket.socket) -> http.client.HTTPResponse:
    response = http.client.HTTPResponse(sock)
    response.begin()
    response.read()
    return response


def trickle_until_answered(sock: socket.socket, pieces: list[bytes], every: float) -> float:
    """Sends one piece every ``every`` seconds until the server answers (or all are sent);
    the seconds from the first piece to the answer's first byte."""
    started = time.monotonic()
    for piece in pieces:
        if select.select([sock], [], [], every)[0]:
            break
        sock.sendall(piece)
    select.select([sock], [], [], 10)
    return time.monotonic() - started


def closed(sock: socket.socket) -> bool:
    """Whether the server closed the connection (an end of file within 2 s)."""
    sock.settimeout(2)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@pytest.mark.parametrize(
    ("framing", "pieces"),
    [
        (f"Content-Length: {len(BODY)}\r\n".encode(), [BODY[i : i + 1] for i in range(len(BODY))]),
        (b"Transfer-Encoding: chunked\r\n", [b"1\r\n%s\r\n" % BODY[i : i + 1] for i in range(8)]),
    ],
    ids=["content-length", "chunked"],
)
def test_f4_a_body_slower_than_the_timeout_is_408_and_the_connection_closes(
    daemon: Daemon, framing: bytes, pieces: list[bytes]
) -> None:
    """F4: headers, then a body trickled a byte every 0.2 s (its whole would take seconds):
    408 with the usual INVALID_INPUT body about half a second after the headers, and the
    daemon closes the connection."""
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(head(daemon, framing))
        waited = trickle_until_answered(sock, pieces, every=0.2)
        response = answer(sock)
        assert response.status == 408
        assert TIMEOUT_S - 0.1 < waited < TIMEOUT_S + 1.0, waited
        assert response.getheader("Connection") == "close"
        assert closed(sock)
    log = daemon.log.read_text()
    assert '"status":408' in log and "Traceback" not in log


def test_f4_the_408_body_is_the_usual_error(daemon: Daemon) -> None:
    """F4: the 408 answer is INVALID_INPUT with a message naming the timeout, and its request
    id as every error body has."""
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(head(daemon, f"Content-Length: {len(BODY)}\r\n".encode()) + BODY[:3])
        response = http.client.HTTPResponse(sock)
        response.begin()
        error = json.loads(response.read())["error"]
    assert response.status == 408
    assert error["code"] == "INVALID_INPUT" and f"{TIMEOUT_S:g} s" in error["message"], error
    assert error["requestId"] == response.getheader("X-Request-Id")


def test_f4_a_body_in_time_is_served_and_the_connection_kept(daemon: Daemon) -> None:
    """F4: a body sent in pieces that arrives whole within the timeout is answered 200, and
    the kept-alive connection serves the next request."""
    framing = f"Content-Length: {len(BODY)}\r\n".encode()
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(head(daemon, framing))
        trickle_until_answered(sock, [BODY[:6], BODY[6:12], BODY[12:]], every=0.1)
        assert answer(sock).status == 200
        sock.sendall(head(daemon, framing) + BODY)
        assert answer(sock).status == 200


def test_f4_a_body_nobody_reads_holds_its_connection_no_longer(daemon: Daemon) -> None:
    """F4: a body sent where no handler reads one (a GET's) is drained after the answer for
    at most the body timeout, then the connection closes."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nx"
    with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
        sock.sendall(request)
        assert answer(sock).status == 200
        started = time.monotonic()
        assert closed(sock)
        assert time.monotonic() - started < TIMEOUT_S + 1.0


def test_f4_the_body_timeout_is_30_seconds_unless_given(tmp_path: Path) -> None:
    """F4: serve --body-timeout defaults to 30 s, as the app's settings do."""
    shown = CliRunner().invoke(cli, ["serve", "--help"], terminal_width=200).output
    assert "--body-timeout FLOAT RANGE" in shown and "[default: 30.0; x>=0.1]" in shown, shown
    assert Config(db_path=tmp_path / "bc.db", root_token_file=tmp_path / "t").body_timeout == 30
