"""make_app(config): typed app state, the middleware, the route table, and lifetimes."""

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import msgspec
import sqlite_utils
import structlog
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from controlplane.api import iam, nodes, pools, quotas, reservations, sites
from controlplane.api.method import Method, Read, parse_body
from controlplane.api.openapi import openapi_document
from controlplane.capacity.reconciler import run_reconciler
from controlplane.config import MAX_BODY_BYTES, Config
from controlplane.iam.decide import Principal
from controlplane.runtime import Runtime
from controlplane.services.access import authorize
from controlplane.services.iam import authenticate, bootstrap
from controlplane.services.nodes import authenticate_node
from controlplane.storage.db import Store
from controlplane.storage.migrations import MIGRATIONS
from shared.errors import ApiError, InvalidInput, NotFound, Unauthenticated, error_body
from shared.ids import request_id as new_request_id

log = structlog.get_logger("controlplane.http")
JSON = "application/json"


@dataclass
class Metrics:
    registry: CollectorRegistry
    requests: Counter
    latency: Histogram
    # Labelled children by (route, status): labels() takes a lock and builds keys each call.
    _children: dict[tuple[str, int], tuple[Any, Any]] = field(default_factory=dict)

    def observe(self, route: str, status: int, seconds: float) -> None:
        children = self._children.get((route, status))
        if children is None:
            children = (self.requests.labels(route, str(status)), self.latency.labels(route))
            self._children[(route, status)] = children
        children[0].inc()
        children[1].observe(seconds)

    @classmethod
    def create(cls) -> "Metrics":
        registry = CollectorRegistry()
        return cls(
            registry=registry,
            requests=Counter(
                "bc_http_requests",
                "HTTP requests by method and status",
                ["method", "status"],
                registry=registry,
            ),
            latency=Histogram(
                "bc_http_request_seconds",
                "HTTP request latency by method",
                ["method"],
                registry=registry,
                buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0),
            ),
        )


RUNTIME = web.AppKey("runtime", Runtime)
METRICS = web.AppKey("metrics", Metrics)
METHODS = web.AppKey("methods", tuple)
OPENAPI = web.AppKey("openapi", bytes)
CALLER = web.RequestKey("caller", dict)  # who is calling, for the log line

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


JSON_HEADERS = {"Content-Type": JSON}


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, headers=JSON_HEADERS)


def error_response(error: ApiError, request_id: str) -> web.Response:
    body = error_body(error.code, error.message, error.details, request_id)
    return json_response(body, status=error.status)


@web.middleware
async def request_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request id on every log line and error body; one log line per request; errors mapped."""
    request_id = new_request_id()
    structlog.contextvars.bind_contextvars(request_id=request_id)
    started = time.perf_counter()
    try:
        try:
            response = await handler(request)
        except ApiError as exc:
            response = error_response(exc, request_id)
        except web.HTTPNotFound:
            response = error_response(NotFound("no such method", path=request.path), request_id)
        except web.HTTPMethodNotAllowed:
            error = InvalidInput("use POST with a JSON body")
            response = error_response(error, request_id)
            response.set_status(405)
        except Exception:
            log.exception("unhandled error", path=request.path)
            response = json_response(
                error_body("INTERNAL", "internal error", {}, request_id), status=500
            )
        elapsed = time.perf_counter() - started
        response.headers["X-Request-Id"] = request_id
        route = request.path if request.match_info.route.resource else "unmatched"
        request.app[METRICS].observe(route, response.status, elapsed)
        log.info(
            "request",
            method=request.method,
            path=request.path,
            status=response.status,
            ms=round(elapsed * 1000, 3),
            **request.get(CALLER, {}),
        )
        return response
    finally:
        structlog.contextvars.unbind_contextvars("request_id")


def bearer_token(request: web.Request) -> str:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthenticated("send Authorization: Bearer <token>")
    return token.strip()


def identify(
    method: Method,
    db: sqlite_utils.Database,
    token: str | None,
    request: web.Request,
    runtime: Runtime,
) -> Principal | dict[str, Any] | None:
    """Who calls, by the method's kind of credential; UNAUTHENTICATED when unknown."""
    if method.auth == "credential":
        assert token is not None
        principal = authenticate(db, token, runtime.credentials)
        if principal is None:
            raise Unauthenticated("unknown, revoked or expired credential")
        request[CALLER] = {"tenant": principal.tenant_id, "credential": principal.credential_id}
        return principal
    if method.auth == "node":
        assert token is not None
        node = authenticate_node(db, token)
        if node is None:
            raise Unauthenticated("unknown node credential")
        request[CALLER] = {"node": node["id"]}
        return node
    return None


def method_handler(method: Method) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        runtime = request.app[RUNTIME]
        token = None if method.auth == "none" else bearer_token(request)
        body = await parse_body(request, method.request)
        if isinstance(method.call, Read):
            # No await from here on: the read transaction never spans a suspension.
            with runtime.db.snapshot() as db:
                caller = identify(method, db, token, request, runtime)
                authorize(db, caller, method.access, body)
                answer = method.call.fn(db, caller, body, runtime)
        else:
            caller = identify(method, runtime.db.reader, token, request, runtime)
            store = runtime.db.gated(lambda db: authorize(db, caller, method.access, body))
            answer = await method.call.fn(store, runtime, caller, body)
        return json_response(answer)

    return handle


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """Ready when the database answers and every migration is applied."""
    applied = request.app[RUNTIME].db.reader.execute("PRAGMA user_version").fetchone()[0]
    ready = applied == len(MIGRATIONS)
    return json_response(
        {"status": "ready" if ready else "migrating", "schemaVersion": applied},
        status=200 if ready else 503,
    )


async def metrics(request: web.Request) -> web.Response:
    body = generate_latest(request.app[METRICS].registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def openapi(request: web.Request) -> web.Response:
    return web.Response(body=request.app[OPENAPI], content_type=JSON)


ALL_METHODS: tuple[Method, ...] = (
    *iam.METHODS,
    *sites.METHODS,
    *pools.METHODS,
    *quotas.METHODS,
    *nodes.METHODS,
    *reservations.METHODS,
)


def make_app(config: Config) -> web.Application:
    app = web.Application(middlewares=[request_middleware], client_max_size=MAX_BODY_BYTES)
    methods = ALL_METHODS
    app[RUNTIME] = Runtime(config)
    app[METRICS] = Metrics.create()
    app[METHODS] = methods
    app[OPENAPI] = msgspec.json.encode(openapi_document(methods, version("better-compute")))
    for method in methods:
        app.router.add_post(method.path, method_handler(method))
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/api/openapi.json", openapi)
    app.cleanup_ctx.append(_store_lifetime)
    app.cleanup_ctx.append(_reconciler_lifetime)
    return app


async def _store_lifetime(app: web.Application) -> AsyncIterator[None]:
    runtime = app[RUNTIME]
    config = runtime.config
    config.db_path.parent.mkdir(parents=True, exist_ok=True)
    store = Store(config.db_path)
    if bootstrap(store, config.root_token_file):
        log.info("bootstrapped tenant root", root_token_file=str(config.root_token_file))
    runtime.store = store
    yield
    runtime.store = None
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
        )
    )
    yield
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
