"""The daemon's HTTP server: aiohttp's connection protocol hardened (a deadline on each
request's head), TLS, the signals that stop it, and the runner that serves the app until then
(with, on ``--metrics-listen``, a second listener for ``/metrics``).

F5: the head deadline relies on private attributes of aiohttp (``INTERNALS``). At start the
server checks that they are there and of the kind it expects; when one is not, it serves
without the deadline and says so once, as a warning naming what it missed, rather than
crashing or timing nothing in silence.
"""

import asyncio
import contextlib
import inspect
import ipaddress
import signal
import ssl
from pathlib import Path
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from controlplane.app import make_app, make_metrics_app
from controlplane.config import BODY_TIMEOUT_S, Config
from controlplane.storage.db import is_postgres
from shared.sdnotify import Notifier

log = structlog.get_logger("controlplane")

KEEPALIVE_TIMEOUT_S = 75.0  # an idle kept-alive connection is closed after this long
HEADER_TIMEOUT_S = 10.0  # a request's line and headers must arrive whole within this long
LINGERING_S = 10.0  # aiohttp's own bound on draining a body no handler read

# The private aiohttp attributes the head deadline uses, each with what it must be.
INTERNALS = (
    "RequestHandler._request_count (int)",
    "RequestHandler._waiter (None or a future)",
    "RequestHandler._loop (an event loop)",
    "Server._loop (an event loop)",
    "Server._kwargs (a dict)",
    "AppRunner._make_server (a coroutine function)",
)


class HardenedProtocol(web.RequestHandler):
    """aiohttp's connection protocol with a deadline on each request's head, and one log line
    without a traceback for a request that is not valid HTTP (the client's error, a 400).

    aiohttp (3.14) has a keep-alive timeout but no header-read timeout: a client that
    sends half a request line and stops holds its connection until the keep-alive timer
    (an hour by default). Here the head of a request (its line and headers) must arrive
    whole within ``head_timeout`` of the connection opening, or of the request's first
    byte on a kept-alive connection; else the connection is closed. The body is not
    timed here (the handler reads it), nor is an idle kept-alive connection (that is
    ``keepalive_timeout``). It costs one integer compare per chunk received.
    """

    __slots__ = ("_head_timeout", "_head_timer")

    def __init__(self, manager: web.Server, *, head_timeout: float, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._head_timeout = head_timeout
        self._head_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._start_head_timer()

    def data_received(self, data: bytes) -> None:
        heads = self._request_count  # aiohttp counts each request head it parses
        super().data_received(data)
        if self._request_count != heads:
            self._stop_head_timer()
        elif self._head_timer is None and self._waiter is not None and not self._waiter.done():
            self._start_head_timer()  # the first bytes of the next request on an idle connection

    def connection_lost(self, exc: BaseException | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def _start_head_timer(self) -> None:
        self._head_timer = self._loop.call_later(self._head_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def log_exception(self, *args: Any, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info")
        if isinstance(exc, HttpProcessingError):
            log.info(
                "refused a request that is not valid HTTP", status=exc.code, reason=exc.message
            )
            return
        super().log_exception(*args, **kwargs)

    def _head_timed_out(self) -> None:
        self._head_timer = None
        log.info("closing a connection: no whole request head in time", seconds=self._head_timeout)
        self.force_close()


class _HeadTimeoutServer(web.Server):
    """aiohttp's low-level server, making HardenedProtocol connections."""

    def __init__(self, base: web.Server, head_timeout: float) -> None:
        super().__init__(
            base.request_handler,
            request_factory=base.request_factory,
            handler_cancellation=base.handler_cancellation,
            loop=base._loop,
            **base._kwargs,
        )
        self._head_timeout = head_timeout

    def __call__(self) -> web.RequestHandler:
        return HardenedProtocol(
            self, loop=self._loop, head_timeout=self._head_timeout, **self._kwargs
        )


class Runner(web.AppRunner):
    """``web.AppRunner`` whose connections time out a half-sent request head."""

    __slots__ = ("_head_timeout",)

    def __init__(self, app: web.Application, *, header_timeout: float, **kwargs: Any) -> None:
        super().__init__(app, **kwargs)
        self._head_timeout = header_timeout

    async def _make_server(self) -> web.Server:
        return _HeadTimeoutServer(await super()._make_server(), self._head_timeout)


def missing_internals(
    protocol: type[web.RequestHandler] = web.RequestHandler,
    server: type[web.Server] = web.Server,
    runner: type[web.AppRunner] = web.AppRunner,
) -> list[str]:
    """F5: which of ``INTERNALS`` this aiohttp lacks or holds as something else, read off a
    server and a connection protocol made (never connected) on the running loop."""

    async def handler(request: web.BaseRequest) -> web.StreamResponse:
        raise NotImplementedError  # never called: no connection is made

    loop = asyncio.get_running_loop()
    made = server(handler, loop=loop)
    connection = protocol(made, loop=loop)
    waiter = getattr(connection, "_waiter", 0)
    checks = (
        isinstance(getattr(connection, "_request_count", None), int),
        waiter is None or isinstance(waiter, asyncio.Future),
        isinstance(getattr(connection, "_loop", None), asyncio.AbstractEventLoop),
        isinstance(getattr(made, "_loop", None), asyncio.AbstractEventLoop),
        isinstance(getattr(made, "_kwargs", None), dict),
        inspect.iscoroutinefunction(getattr(runner, "_make_server", None)),
    )
    return [name for name, ok in zip(INTERNALS, checks, strict=True) if not ok]


def make_runner(
    app: web.Application,
    *,
    keepalive_timeout: float,
    header_timeout: float,
    missing: list[str],
    body_timeout: float = BODY_TIMEOUT_S,
) -> web.AppRunner:
    """The app's runner: with the head deadline (``Runner``) when aiohttp has every internal it
    uses, else aiohttp's own, and one warning naming the ``missing`` ones (F5).

    A body no handler reads (a GET's, or one after an early refusal) is drained after the
    answer for at most ``body_timeout`` too (F4), then the connection closes.
    """
    options: dict[str, Any] = {
        "access_log": None,
        "handle_signals": False,
        "shutdown_timeout": 10,
        "keepalive_timeout": keepalive_timeout,
        "lingering_time": min(LINGERING_S, body_timeout),
    }
    if not missing:
        return Runner(app, header_timeout=header_timeout, **options)
    log.warning(
        "serving without the request-head timeout: this aiohttp lacks what it relies on; "
        "a half-sent request holds its connection until the keep-alive timeout",
        missing=missing,
        keepalive_timeout=keepalive_timeout,
    )
    return web.AppRunner(app, **options)


def redacted(location: Path | str) -> str:
    """A database location for the log: a URL without any password in it."""
    text = str(location)
    if not is_postgres(text):
        return text
    scheme, _, rest = text.partition("://")
    who, at, where = rest.rpartition("@")
    return f"{scheme}://{who.split(':', 1)[0]}{at}{where}" if at else text


def is_loopback(host: str) -> bool:
    """Whether `host` is reachable from this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def tls_context(cert: Path, key: Path) -> ssl.SSLContext:
    """M3: the server's TLS settings (TLS 1.2 or later, the ssl module's default ciphers) with
    its certificate chain and key; a file that does not load is a ValueError naming it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"cannot load {cert} with {key}: {exc}") from None
    return context


async def run_server(
    config: Config,
    notifier: Notifier | None = None,
    *,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT_S,
    header_timeout: float = HEADER_TIMEOUT_S,
    tls: ssl.SSLContext | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT, then stop taking requests and finish the ones in flight.

    Under systemd (``Type=notify``) it says READY=1 once the store is open and the
    socket listens, pings the watchdog from a task on the event loop (a stuck loop
    stops the pings, and systemd restarts the service), and says STOPPING=1 on the
    way out. ``notifier`` defaults to the one the environment describes.

    A connection idle between requests is closed after ``keepalive_timeout`` seconds;
    one whose request line and headers do not arrive whole within ``header_timeout``
    seconds (from its opening, or from a request's first byte) is closed too (F5: unless
    this aiohttp lacks what that relies on, which it says at start).

    With ``tls`` it serves HTTPS (M3); without, on an address other than loopback it says
    once, as a warning, that requests and tokens cross the network in clear.

    With ``config.metrics_listen`` it serves ``/metrics`` there too, in plain HTTP and without
    a token (F4: an address only the scraper reaches), and no longer on the API's address.
    """
    if notifier is None:
        notifier = Notifier.from_environment()
    app = make_app(config)
    timeouts: dict[str, Any] = {
        "keepalive_timeout": keepalive_timeout,
        "header_timeout": header_timeout,
        "body_timeout": config.body_timeout,
        "missing": missing_internals(),
    }
    runner = make_runner(app, **timeouts)
    await runner.setup()  # opens the store and runs its migrations (cleanup_ctx)
    metrics_runner = None
    if config.metrics_listen is not None:  # first: once the API answers, /metrics does too
        metrics_runner = make_runner(make_metrics_app(app), **timeouts)
        await metrics_runner.setup()
        host, metrics_port = config.metrics_listen
        await web.TCPSite(metrics_runner, host, metrics_port).start()
        metrics_port = metrics_runner.addresses[0][1]
        log.info("serving /metrics without a token", url=f"http://{host}:{metrics_port}/metrics")
    site = web.TCPSite(runner, config.host, config.port, ssl_context=tls)
    await site.start()
    port = runner.addresses[0][1]  # the bound port, also when --listen asked for port 0
    url = f"{'https' if tls else 'http'}://{config.host}:{port}"
    log.info("serving", url=url, db=redacted(config.db_path))
    if tls is None and not is_loopback(config.host):
        log.warning(
            "serving plain HTTP on an address that is not loopback: tokens cross the network "
            "in clear; give --tls-cert and --tls-key, or listen on 127.0.0.1 behind a "
            "TLS-terminating proxy",
            host=config.host,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    watchdog = asyncio.create_task(notifier.watchdog_loop(), name="sd-watchdog")
    notifier.ready(status=f"serving on {url}")
    try:
        await stop.wait()
        notifier.stopping(status="finishing requests in flight")
        log.info("shutting down")
        if metrics_runner is not None:
            await metrics_runner.cleanup()
        await runner.cleanup()
    finally:
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog
    log.info("stopped")
