"""make_app(config): typed app state, the middleware, the route table, and lifetimes; and
make_metrics_app, the app of a --metrics-listen listener."""

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from importlib.metadata import version

import msgspec
import structlog
from aiohttp import web

from controlplane.api import worker
from controlplane.api.keys import (
    BODY_TIMEOUT,
    METHODS,
    METRICS,
    OPENAPI,
    RUNTIME,
    SCREENED,
)
from controlplane.api.method import Write
from controlplane.api.middleware import request_middleware
from controlplane.api.openapi import openapi_document
from controlplane.api.ops import READINESS, Readiness
from controlplane.api.routes import ALL_METHODS, add_metrics_listener_routes, add_routes
from controlplane.api.screen import PREFIXES, Screened
from controlplane.config import MAX_BODY_BYTES, Config
from controlplane.metrics import COUNTED, Metrics
from controlplane.reads.workers import ReadWorkers
from controlplane.reconciler import run_reconciler
from controlplane.runtime import Runtime
from controlplane.services.iam import bootstrap
from controlplane.storage.commits import CommitListener, CommitSignal
from controlplane.storage.db import Store
from controlplane.storage.events import latest_seq

log = structlog.get_logger("controlplane.http")
SWITCH_INTERVAL_S = 0.0005


def make_app(config: Config) -> web.Application:
    app = web.Application(middlewares=[request_middleware], client_max_size=MAX_BODY_BYTES)
    methods = ALL_METHODS
    workers = ReadWorkers(config, config.read_workers, worker.ENTRY)
    app[RUNTIME] = Runtime(config, workers=workers, counters=COUNTED)
    app[METRICS] = Metrics.create()
    app[METHODS] = methods
    app[SCREENED] = {
        m.path: Screened(
            msgspec.json.Decoder(m.request), isinstance(m.call, Write), PREFIXES.get(m.auth)
        )
        for m in methods
    }
    app[BODY_TIMEOUT] = config.body_timeout
    app[READINESS] = Readiness()
    app[OPENAPI] = msgspec.json.encode(openapi_document(methods, version("better-compute")))
    add_routes(app, methods, metrics=config.metrics_listen is None)
    app.on_shutdown.append(_end_long_polls)
    app.cleanup_ctx.append(_store_lifetime)
    app.cleanup_ctx.append(_readiness_lifetime)
    app.cleanup_ctx.append(_reconciler_lifetime)
    return app


def make_metrics_app(api: web.Application) -> web.Application:
    """F4: what ``--metrics-listen`` serves: ``/metrics`` of the API app ``api`` (its runtime,
    its counters), through the same middleware, without a token."""
    app = web.Application(middlewares=[request_middleware])
    app[RUNTIME] = api[RUNTIME]
    app[METRICS] = api[METRICS]
    add_metrics_listener_routes(app)
    return app


async def _end_long_polls(app: web.Application) -> None:
    """At shutdown, waiting long-polls answer now (their page as it is), instead of holding
    the stop for their whole wait."""
    app[RUNTIME].commits.close()


async def _store_lifetime(app: web.Application) -> AsyncIterator[None]:
    runtime = app[RUNTIME]
    config = runtime.config
    # B6: a reader thread in a long list hands the interpreter back to the event loop after
    # this long (Python's default, 5 ms, let a pools/get wait behind it for tens of ms).
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    # makes its directory 0700 (R7)
    store = Store(config.db_path, config.durability, db_timeout=config.db_timeout)
    if bootstrap(store, config.root_token_file):
        log.info("bootstrapped tenant root", root_token_file=str(config.root_token_file))
    with store.snapshot() as db:
        runtime.commits = CommitSignal(latest_seq(db))
    store.on_commit = runtime.commits.advance
    listener = None
    if store.postgres:  # other replicas' commits wake this one's long-polls too
        listener = CommitListener(store, runtime.commits)
        listener.start(asyncio.get_running_loop())
    runtime.store = store
    yield
    runtime.store = None
    if listener is not None:
        listener.stop()
    runtime.workers.close()
    store.close()


async def _readiness_lifetime(app: web.Application) -> AsyncIterator[None]:
    """/readyz answers from a check made once before serving, then every READY_CHECK_S."""
    readiness, store = app[READINESS], app[RUNTIME].db
    await readiness.check(store)
    task = asyncio.create_task(readiness.run(store), name="readiness")
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _reconciler_lifetime(app: web.Application) -> AsyncIterator[None]:
    """The capacity reconciler runs every --reconcile-interval while the app serves."""
    runtime = app[RUNTIME]
    task = asyncio.create_task(
        run_reconciler(
            runtime.db,
            runtime.liveness,
            runtime.config.reconcile_interval,
            runtime.config.node_lost_after,
            runtime.started,
            app[METRICS],
            runtime.leadership,
            runtime.overload,
        )
    )
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    runtime.leadership.close()
