"""The operations endpoints: liveness, readiness, Prometheus metrics, the OpenAPI document."""

from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from controlplane.api.answer import json_response
from controlplane.api.keys import METRICS, OPENAPI, RUNTIME
from controlplane.api.screen import JSON
from controlplane.storage.migrations import MIGRATIONS, schema_version


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when the database answers and every migration is applied."""
    runtime = request.app[RUNTIME]
    applied = schema_version(runtime.db.reader)
    ready = applied == len(MIGRATIONS)
    return json_response(
        {
            "status": "ready" if ready else "migrating",
            "schemaVersion": applied,
            "backend": "postgresql" if runtime.db.postgres else "sqlite",
            "leader": runtime.leadership.leader,
        },
        status=200 if ready else 503,
    )


async def metrics(request: web.Request) -> web.Response:
    runtime, served = request.app[RUNTIME], request.app[METRICS]
    await served.fleet.refresh(runtime.db, runtime.config.reconcile_interval)
    body = generate_latest(served.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI], content_type=JSON)
