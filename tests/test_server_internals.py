"""F5: the request-head timeout relies on private aiohttp attributes; the server checks them at
start and, when one is gone or of another kind, serves without the timeout and says so once,
as a warning naming it (the timeout itself: tests/test_http_hardening.py)."""

from typing import Any

import aiohttp
import structlog
from aiohttp import web

from controlplane.server import INTERNALS, Runner, make_runner, missing_internals


class WithoutRequestCount(web.RequestHandler):
    """An aiohttp whose protocol no longer counts request heads where the server reads it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        del self._request_count


class KwargsOfAnotherKind(web.Server):
    """An aiohttp whose server keeps its protocol options as something other than a dict."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._kwargs = tuple(self._kwargs.items())  # type: ignore[assignment]


class WithoutMakeServer(web.AppRunner):
    """An aiohttp whose runner makes its server some other way."""

    _make_server = None  # type: ignore[assignment]


def hello() -> web.Application:
    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", ok)
    return app


async def served(runner: web.AppRunner) -> str:
    """What the runner answers on `/` from a loopback port."""
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/") as response,
        ):
            return await response.text()
    finally:
        await runner.cleanup()


async def test_f5_the_real_aiohttp_has_every_internal_so_the_head_timeout_is_on() -> None:
    """F5: on the aiohttp the product pins nothing is missing: the runner is the hardened one,
    nothing is warned, and it serves."""
    missing = missing_internals()
    assert missing == []
    with structlog.testing.capture_logs() as logs:
        runner = make_runner(hello(), keepalive_timeout=5, header_timeout=1, missing=missing)
    assert isinstance(runner, Runner) and logs == []
    assert await served(runner) == "ok"


async def test_f5_a_missing_internal_disables_the_head_timeout_with_one_warning() -> None:
    """F5: an aiohttp lacking an attribute (or holding one of another kind) is named by the
    check; the server then runs aiohttp's own runner, which serves, and warns once."""
    assert missing_internals(protocol=WithoutRequestCount) == [INTERNALS[0]]
    assert missing_internals(server=KwargsOfAnotherKind) == [INTERNALS[4]]
    assert missing_internals(runner=WithoutMakeServer) == [INTERNALS[5]]
    assert "RequestHandler._request_count" in INTERNALS[0]

    missing = missing_internals(protocol=WithoutRequestCount)
    with structlog.testing.capture_logs() as logs:
        runner = make_runner(hello(), keepalive_timeout=5, header_timeout=1, missing=missing)
        answer = await served(runner)
    assert type(runner) is web.AppRunner and answer == "ok"
    warnings = [line for line in logs if line["log_level"] == "warning"]
    assert len(warnings) == 1, logs
    assert "without the request-head timeout" in warnings[0]["event"]
    assert warnings[0]["missing"] == ["RequestHandler._request_count (int)"]
