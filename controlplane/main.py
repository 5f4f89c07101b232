"""better-compute-controlplane: the control-plane daemon."""

import asyncio
import contextlib
import signal
from pathlib import Path

import click
import structlog
from aiohttp import web

from controlplane.app import make_app
from controlplane.config import Config
from controlplane.demo import demo
from shared.log import configure_logging
from shared.sdnotify import Notifier

log = structlog.get_logger("controlplane")


def parse_listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter("expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "127.0.0.1", int(port)


async def run_server(config: Config, notifier: Notifier | None = None) -> None:
    """Serve until SIGTERM or SIGINT, then stop taking requests and finish the ones in flight.

    Under systemd (``Type=notify``) it says READY=1 once the store is open and the
    socket listens, pings the watchdog from a task on the event loop (a stuck loop
    stops the pings, and systemd restarts the service), and says STOPPING=1 on the
    way out. ``notifier`` defaults to the one the environment describes.
    """
    if notifier is None:
        notifier = Notifier.from_environment()
    app = make_app(config)
    runner = web.AppRunner(app, access_log=None, handle_signals=False, shutdown_timeout=10)
    await runner.setup()  # opens the store and runs its migrations (cleanup_ctx)
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()
    port = runner.addresses[0][1]  # the bound port, also when --listen asked for port 0
    url = f"http://{config.host}:{port}"
    log.info("serving", url=url, db=str(config.db_path))
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
    "--db", "db_path", type=click.Path(path_type=Path), required=True, help="SQLite file."
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
@click.option("--log-format", type=click.Choice(["auto", "json", "console"]), default="auto")
def serve(
    db_path: Path,
    listen: str,
    root_token_file: Path | None,
    reconcile_interval: float,
    node_lost_after: float,
    log_format: str,
) -> None:
    """Serve the HTTP API on a SQLite database (created and migrated on first start)."""
    configure_logging(json=None if log_format == "auto" else log_format == "json")
    host, port = parse_listen(listen)
    config = Config(
        db_path=db_path,
        root_token_file=root_token_file or db_path.parent / "root.token",
        host=host,
        port=port,
        reconcile_interval=reconcile_interval,
        node_lost_after=node_lost_after,
    )
    asyncio.run(run_server(config))


cli.add_command(demo)
