"""The operations endpoints: liveness, readiness, Prometheus metrics, the OpenAPI document.

F4: none of them reads the database for a caller that has not authenticated. ``/readyz``
answers from the daemon's own last check (``Readiness``); ``/metrics`` on the API port is a
root credential's, looked up off the event loop; on ``--metrics-listen`` it takes no token.
"""

import asyncio
import math
import time

import structlog
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from controlplane.api.answer import json_response
from controlplane.api.dispatch import bearer_token
from controlplane.api.keys import CALLER, METRICS, OPENAPI, RUNTIME
from controlplane.api.screen import JSON, check_token_shape
from controlplane.iam.tokens import CREDENTIAL_PREFIX, token_hash
from controlplane.services.iam import authenticate
from controlplane.storage.db import Store
from controlplane.storage.migrations import MIGRATIONS, schema_version
from shared.errors import PermissionDenied, Unauthenticated

log = structlog.get_logger("controlplane.http")

READY_CHECK_S = 1.0  # how often the daemon checks its database for /readyz
# A last good check older than this (a check that hangs) is not ready any more.
READY_WITHIN_S = 5.0


class Readiness:
    """What ``/readyz`` answers: the daemon's own check of its database (that it answers, and
    its schema version), made every ``READY_CHECK_S`` on a reader thread. A probe reads only
    this, so any number of probes, which carry no token, cost the database nothing."""

    def __init__(self) -> None:
        self.schema_version = 0  # as the last good check found it
        self.checked_at = -math.inf  # when that was (monotonic)
        self.failing = False  # the latest check raised

    async def check(self, store: Store) -> None:
        try:
            applied = await store.read_short(schema_version)
        except Exception as exc:  # whatever the database raised, the daemon is not ready
            if not self.failing:
                log.warning("readiness check failed: not ready", error=repr(exc))
            self.failing = True
            return
        if self.failing:
            log.info("readiness check passes again")
        self.schema_version, self.checked_at, self.failing = applied, time.monotonic(), False

    async def run(self, store: Store) -> None:
        while True:
            await asyncio.sleep(READY_CHECK_S)
            await self.check(store)

    def state(self) -> str:
        if self.failing or time.monotonic() - self.checked_at > READY_WITHIN_S:
            return "unavailable"
        return "ready" if self.schema_version == len(MIGRATIONS) else "migrating"


READINESS = web.AppKey("readiness", Readiness)


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when the last check found the database answering with every migration applied."""
    runtime, readiness = request.app[RUNTIME], request.app[READINESS]
    state = readiness.state()
    return json_response(
        {
            "status": state,
            "schemaVersion": readiness.schema_version,
            "backend": "postgresql" if runtime.db.postgres else "sqlite",
            "leader": runtime.leadership.leader,
        },
        status=200 if state == "ready" else 503,
    )


async def metrics(request: web.Request) -> web.Response:
    """``/metrics`` on the API port: the fleet's numbers are for root credentials only."""
    token = bearer_token(request)
    check_token_shape(request.headers, CREDENTIAL_PREFIX)
    runtime = request.app[RUNTIME]
    cache = runtime.credentials
    # A scrape in the cache's lifetime costs nothing; otherwise the lookup runs on a reader
    # thread, as PostgreSQL's API reads do, never on the event loop.
    principal = cache.get(token_hash(token)) or await runtime.db.read_short(
        lambda db: authenticate(db, token, cache)
    )
    if principal is None:
        raise Unauthenticated("unknown, revoked or expired credential")
    request[CALLER] = {"tenant": principal.tenant_id, "credential": principal.credential_id}
    if not principal.is_root:
        raise PermissionDenied("only a root credential reads /metrics")
    return await open_metrics(request)


async def open_metrics(request: web.Request) -> web.Response:
    """``/metrics`` itself; on ``--metrics-listen`` without a token (its address guards it)."""
    runtime, served = request.app[RUNTIME], request.app[METRICS]
    await served.fleet.refresh(runtime.db, runtime.config.reconcile_interval)
    body = generate_latest(served.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI], content_type=JSON)
