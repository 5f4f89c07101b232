"""make_app(config): typed app state, the middleware, the route table, and lifetimes."""

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from importlib.metadata import version

import msgspec
import structlog
from aiohttp import web

from controlplane.api import worker
from controlplane.api.keys import METHODS, METRICS, OPENAPI, RUNTIME, SCHEMAS
from controlplane.api.middleware import request_middleware
from controlplane.api.openapi import openapi_document
from controlplane.api.routes import ALL_METHODS, add_routes
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
    app[SCHEMAS] = {method.path: method.request for method in methods}
    app[OPENAPI] = msgspec.json.encode(openapi_document(methods, version("better-compute")))
    add_routes(app, methods)
    app.on_shutdown.append(_end_long_polls)
    app.cleanup_ctx.append(_store_lifetime)
    app.cleanup_ctx.append(_reconciler_lifetime)
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
    store = Store(config.db_path, config.durability)  # makes its directory 0700 (R7)
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
        )
    )
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    runtime.leadership.close()
