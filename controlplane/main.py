"""better-compute-controlplane: the control-plane daemon."""

import asyncio
import contextlib
import ipaddress
import logging
import signal
import ssl
from pathlib import Path
from typing import Any

import click
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from controlplane.app import make_app
from controlplane.config import READ_WORKERS, Config
from controlplane.demo import demo
from controlplane.storage.db import Durability, is_postgres
from shared.log import configure_logging
from shared.sdnotify import Notifier

log = structlog.get_logger("controlplane")

KEEPALIVE_TIMEOUT_S = 75.0  # an idle kept-alive connection is closed after this long
HEADER_TIMEOUT_S = 10.0  # a request's line and headers must arrive whole within this long
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


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


def redacted(location: Path | str) -> str:
    """A database location for the log: a URL without any password in it."""
    text = str(location)
    if not is_postgres(text):
        return text
    scheme, _, rest = text.partition("://")
    who, at, where = rest.rpartition("@")
    return f"{scheme}://{who.split(':', 1)[0]}{at}{where}" if at else text


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter("expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "127.0.0.1", int(port)


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
    its certificate chain and key; a bad file is a usage error naming it."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise click.BadParameter(
            f"cannot load {cert} with {key}: {exc}", param_hint="--tls-cert/--tls-key"
        ) from None
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
    seconds (from its opening, or from a request's first byte) is closed too.

    With ``tls`` it serves HTTPS (M3); without, on an address other than loopback it says
    once, as a warning, that requests and tokens cross the network in clear.
    """
    if notifier is None:
        notifier = Notifier.from_environment()
    app = make_app(config)
    runner = Runner(
        app,
        access_log=None,
        handle_signals=False,
        shutdown_timeout=10,
        keepalive_timeout=keepalive_timeout,
        header_timeout=header_timeout,
    )
    await runner.setup()  # opens the store and runs its migrations (cleanup_ctx)
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
        await runner.cleanup()
    finally:
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog
    log.info("stopped")


@click.group()
@click.version_option(package_name="better-compute")
def cli() -> None:
    """The Better Compute control plane."""


@cli.command()
@click.option(
    "--db",
    "db_path",
    required=True,
    help="A SQLite file, or a postgresql://user@host:port/db URL (the password from "
    "PGPASSWORD or ~/.pgpass, never on the command line).",
)
@click.option(
    "--listen", default="127.0.0.1:8080", show_default=True, help="HOST:PORT to serve on."
)
@click.option(
    "--root-token-file",
    type=click.Path(path_type=Path),
    help="Where the root token is written on first start (default: root.token next to --db).",
)
@click.option(
    "--reconcile-interval",
    type=click.FloatRange(min=0.1),
    default=30.0,
    show_default=True,
    help="Seconds between capacity reconciler passes.",
)
@click.option(
    "--node-lost-after",
    type=click.FloatRange(min=1),
    default=90.0,
    show_default=True,
    help="Seconds without a report after which a ready node is lost.",
)
@click.option(
    "--keepalive-timeout",
    type=click.FloatRange(min=0.1),
    default=KEEPALIVE_TIMEOUT_S,
    show_default=True,
    help="Seconds an idle keep-alive connection stays open.",
)
@click.option(
    "--header-timeout",
    type=click.FloatRange(min=0.1),
    default=HEADER_TIMEOUT_S,
    show_default=True,
    help="Seconds a request's line and headers have to arrive whole.",
)
@click.option(
    "--durability",
    type=click.Choice(["full", "relaxed"]),
    default="full",
    show_default=True,
    help="full: every commit synced before the answer (survives a power loss); relaxed: "
    "synced at checkpoints (a power loss may lose the last commits; bench/durability.py).",
)
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Serve HTTPS with this certificate chain (PEM, the server's first); with --tls-key.",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The private key (PEM) of --tls-cert.",
)
@click.option(
    "--read-workers",
    type=click.IntRange(min=0, max=64),
    default=READ_WORKERS,
    show_default=True,
    help="Worker processes for long cached lists, started when a read is first seen slow "
    "(0: lists stay on reader threads; docs/reads.md).",
)
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default="auto")
@click.option(
    "--log-level",
    type=click.Choice(list(LOG_LEVELS)),
    default="info",
    show_default=True,
    help="warning drops the per-request lines.",
)
def serve(
    db_path: str,
    listen: str,
    root_token_file: Path | None,
    reconcile_interval: float,
    node_lost_after: float,
    keepalive_timeout: float,
    header_timeout: float,
    durability: Durability,
    tls_cert: Path | None,
    tls_key: Path | None,
    read_workers: int,
    log_format: str,
    log_level: str,
) -> None:
    """Serve the HTTP API on a SQLite file or a PostgreSQL database (created or migrated on
    first start); several replicas may serve one PostgreSQL database."""
    if is_postgres(db_path) and redacted(db_path) != db_path:
        raise click.BadParameter(
            "a password does not go on the command line (it would show in ps and logs): "
            "give it in PGPASSWORD or ~/.pgpass",
            param_hint="--db",
        )
    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together")
    tls = None if tls_cert is None or tls_key is None else tls_context(tls_cert, tls_key)
    configure_logging(
        json=None if log_format == "auto" else log_format == "json", level=LOG_LEVELS[log_level]
    )
    host, port = parse_listen(listen)
    config = Config(
        db_path=db_path if is_postgres(db_path) else Path(db_path),
        root_token_file=root_token_file
        or (Path("root.token") if is_postgres(db_path) else Path(db_path).parent / "root.token"),
        host=host,
        port=port,
        reconcile_interval=reconcile_interval,
        node_lost_after=node_lost_after,
        durability=durability,
        read_workers=read_workers,
    )
    asyncio.run(
        run_server(
            config, keepalive_timeout=keepalive_timeout, header_timeout=header_timeout, tls=tls
        )
    )


cli.add_command(demo)
