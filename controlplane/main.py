"""better-compute-controlplane: the control-plane daemon's commands. They turn flags into a
``Config`` and call the server (controlplane/server.py)."""

import asyncio
import logging
from pathlib import Path

import click

from controlplane.config import BODY_TIMEOUT_S, DB_TIMEOUT_S, READ_WORKERS, Config, Durability
from controlplane.demo import demo
from controlplane.overload import DEFAULT_MAX_INFLIGHT, MAX_WRITE_WAIT_S
from controlplane.server import (
    HEADER_TIMEOUT_S,
    KEEPALIVE_TIMEOUT_S,
    redacted,
    run_server,
    tls_context,
)
from controlplane.storage.db import is_postgres
from shared.log import configure_logging

LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


def parse_listen(value: str) -> tuple[str, int]:
    """--listen as a host and a port (no host: 127.0.0.1)."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise click.BadParameter("expected HOST:PORT, e.g. 127.0.0.1:8080")
    return host.strip("[]") or "127.0.0.1", int(port)


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
    "--body-timeout",
    type=click.FloatRange(min=0.1),
    default=BODY_TIMEOUT_S,
    show_default=True,
    help="Seconds a request's whole body has to arrive in after its headers (else 408).",
)
@click.option(
    "--db-timeout",
    type=click.FloatRange(min=0.5),
    default=DB_TIMEOUT_S,
    show_default=True,
    help="Seconds a request waits on a PostgreSQL database that does not answer, in all, "
    "before it answers 503 UNAVAILABLE with Retry-After.",
)
@click.option(
    "--metrics-listen",
    callback=lambda _ctx, _param, value: None if value is None else parse_listen(value),
    help="HOST:PORT to serve /metrics on without a token (an internal address), instead of "
    "on --listen to root credentials.",
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
@click.option(
    "--max-inflight",
    type=click.IntRange(min=1),
    default=DEFAULT_MAX_INFLIGHT,
    show_default=True,
    help="API requests handled at once; beyond it a request is answered 503 UNAVAILABLE with "
    "Retry-After at once (shed) instead of queuing until its client times out (F10).",
)
@click.option(
    "--max-write-wait",
    type=click.FloatRange(min=0.1),
    default=MAX_WRITE_WAIT_S,
    show_default=True,
    help="Seconds the oldest mutation may wait for this replica's writer before further "
    "mutations are shed (503 UNAVAILABLE, Retry-After) (F10).",
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
    body_timeout: float,
    db_timeout: float,
    metrics_listen: tuple[str, int] | None,
    durability: Durability,
    tls_cert: Path | None,
    tls_key: Path | None,
    read_workers: int,
    max_inflight: int,
    max_write_wait: float,
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
    try:
        tls = None if tls_cert is None or tls_key is None else tls_context(tls_cert, tls_key)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--tls-cert/--tls-key") from None
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
        body_timeout=body_timeout,
        db_timeout=db_timeout,
        metrics_listen=metrics_listen,
        max_inflight=max_inflight,
        max_write_wait=max_write_wait,
    )
    asyncio.run(
        run_server(
            config, keepalive_timeout=keepalive_timeout, header_timeout=header_timeout, tls=tls
        )
    )


cli.add_command(demo)
