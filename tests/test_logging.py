"""M5: request ids from X-Request-Id on every log line and answer; no log line lost at exit."""

import asyncio
import http.client
import json
import socket
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from aiohttp.test_utils import TestClient

from controlplane.api.keys import METRICS
from controlplane.api.middleware import request_middleware
from controlplane.metrics import Metrics
from shared.log import LogLines
from tests.conftest import Api
from tests.daemons import Daemon

JSON_TYPE = {"Content-Type": "application/json"}


def log_lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_m5_the_last_request_before_a_sigkill_is_in_the_log(tmp_path: Path) -> None:
    """M5: the request line of the last answered request is in the log file after a SIGKILL."""
    daemon = Daemon(tmp_path)
    daemon.start()
    try:
        connection = http.client.HTTPConnection("127.0.0.1", daemon.port, timeout=10)
        headers = {**JSON_TYPE, "Authorization": f"Bearer {daemon.token}"}
        for n in range(20):
            headers["X-Request-Id"] = f"before-kill-{n}"
            connection.request("POST", "/api/compute/pools/list", b'{"tenantId":"root"}', headers)
            response = connection.getresponse()
            response.read()
            assert response.status == 200
            assert response.getheader("X-Request-Id") == f"before-kill-{n}"
        assert daemon.process is not None
        daemon.process.kill()  # at once: no exit handler, no flush thread gets to run
        daemon.process.wait()
        connection.close()
    finally:
        daemon.kill()
    lines = log_lines(daemon.log)
    ids = [line.get("request_id") for line in lines if line["event"] == "request"]
    assert ids == [f"before-kill-{n}" for n in range(20)]


def test_m5_requests_answered_together_are_each_in_the_log_before_their_answer(
    tmp_path: Path,
) -> None:
    """M5: requests that end in one pass of the daemon's loop have their lines written
    together, and no answer goes out before its line is in the log: 32 requests sent at
    once on 32 connections, each answer read, then the log read at once."""
    daemon = Daemon(tmp_path)
    daemon.start()
    try:
        body = b'{"tenantId":"root"}'
        sockets = [
            socket.create_connection(("127.0.0.1", daemon.port), timeout=10) for _ in range(32)
        ]
        for n, sock in enumerate(sockets):
            head = (
                f"POST /api/compute/pools/list HTTP/1.1\r\nHost: x\r\n"
                f"Content-Type: application/json\r\nAuthorization: Bearer {daemon.token}\r\n"
                f"X-Request-Id: together-{n}\r\nContent-Length: {len(body)}\r\n\r\n"
            )
            sock.sendall(head.encode() + body)
        for n, sock in enumerate(sockets):
            answer = sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:80]
            logged = {line.get("request_id") for line in log_lines(daemon.log)}
            assert f"together-{n}" in logged, f"together-{n} answered before its line was written"
            sock.close()
    finally:
        daemon.kill()


def test_m5_lines_waiting_for_the_loop_go_first_and_whole(tmp_path: Path) -> None:
    """M5: request lines added in one pass of the loop are written in one write at the start
    of the next; a line written meanwhile from elsewhere goes after them, in that write."""
    writes: list[bytes] = []
    lines = LogLines(writes.append)

    async def one_pass() -> None:
        loop = asyncio.get_running_loop()
        lines.add_soon(b"a\n", loop)
        lines.add_soon(b"b\n", loop)
        assert writes == []  # not yet: at the start of the next pass
        await asyncio.sleep(0)
        assert writes == [b"a\nb\n"]
        lines.add_soon(b"c\n", loop)
        lines.write(b"from a thread\n")
        assert writes[-1] == b"c\nfrom a thread\n"
        await asyncio.sleep(0)  # the pass's own flush finds nothing waiting
        assert b"".join(writes) == b"a\nb\nc\nfrom a thread\n"

    asyncio.run(one_pass())


async def test_m5_an_incoming_request_id_is_kept_and_echoed(api: Api) -> None:
    """M5: a valid X-Request-Id is the request's id: in the answer header and the error body."""
    for given in ("abc", "trace-01HX.Z:9_a", "a" * 128):
        response = await api.client.post(
            "/api/compute/pools/list", json={}, headers={"X-Request-Id": given}
        )
        assert response.headers["X-Request-Id"] == given
        assert (await response.json())["error"]["requestId"] == given
        response = await api.client.get("/healthz", headers={"X-Request-Id": given})
        assert response.headers["X-Request-Id"] == given


async def test_m5_an_invalid_request_id_is_replaced(api: Api) -> None:
    """M5: an X-Request-Id that is not ^[A-Za-z0-9._:-]{1,128}$ gets a new id instead."""
    for given in ("", "a" * 129, "has space", "a/b", "x\ty", "semi;colon", '"quoted"'):
        response = await api.client.post(
            "/api/compute/pools/list", json={}, headers={"X-Request-Id": given}
        )
        echoed = response.headers["X-Request-Id"]
        assert echoed.startswith("req_") and echoed != given
        assert (await response.json())["error"]["requestId"] == echoed


async def test_m5_every_log_line_of_a_request_carries_its_id(aiohttp_client: Any) -> None:
    """M5: a handler's own lines, the unhandled-error line and the request line share the id."""
    handler_log = structlog.get_logger("test")

    async def chatty(request: web.Request) -> web.Response:
        handler_log.info("working on it")
        raise RuntimeError("boom")

    app = web.Application(middlewares=[request_middleware])
    app[METRICS] = Metrics.create()
    app.router.add_post("/api/chatty", chatty)
    client: TestClient = await aiohttp_client(app)
    with structlog.testing.capture_logs(
        processors=[structlog.contextvars.merge_contextvars]
    ) as entries:
        response = await client.post("/api/chatty", json={}, headers={"X-Request-Id": "r-42"})
    assert response.status == 500
    assert [e["event"] for e in entries] == ["working on it", "unhandled error", "request"]
    assert all(e["request_id"] == "r-42" for e in entries)


def test_m5_every_daemon_log_line_is_one_json_object(tmp_path: Path) -> None:
    """M5: aiohttp's own lines (a request that is not HTTP) are JSON lines like ours, no traceback."""
    daemon = Daemon(tmp_path)
    daemon.start()
    try:
        for raw in (b"NOT HTTP AT ALL\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header\r\n\r\n"):
            with socket.create_connection(("127.0.0.1", daemon.port), timeout=10) as sock:
                sock.sendall(raw)
                assert sock.recv(65536).split(b"\r\n")[0].endswith(b" 400 Bad Request")
        assert daemon.stop() == 0
    finally:
        daemon.kill()
    lines = log_lines(daemon.log)  # each one parses
    assert "Traceback" not in daemon.log.read_text()
    assert lines[-1]["event"] == "stopped"
