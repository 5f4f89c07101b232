"""make_app(config): typed app state, the middleware, the route table, and lifetimes."""

import asyncio
import contextlib
import itertools
import re
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from importlib.metadata import version
from typing import Any, TypeVar

import msgspec
import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from controlplane.api import iam, nodes, pools, quotas, reservations, sites
from controlplane.api.method import Method, Read, parse_body
from controlplane.api.openapi import openapi_document
from controlplane.config import MAX_BODY_BYTES, Config
from controlplane.console import add_console_routes
from controlplane.iam.decide import Principal
from controlplane.metrics import Metrics
from controlplane.reconciler import run_reconciler
from controlplane.runtime import Runtime
from controlplane.services.access import authorize
from controlplane.services.iam import authenticate, bootstrap, still_live
from controlplane.services.reports import authenticate_node
from controlplane.storage.commits import CommitListener, CommitSignal
from controlplane.storage.db import Store, generation
from controlplane.storage.events import latest_seq
from controlplane.storage.migrations import MIGRATIONS, schema_version
from controlplane.storage.sql import Database
from shared.errors import (
    ApiError,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    Unauthenticated,
    error_body,
    relayed_error,
)
from shared.ids import request_id as new_request_id
from shared.log import log_request

log = structlog.get_logger("controlplane.http")
T = TypeVar("T")
SWITCH_INTERVAL_S = 0.0005
JSON = "application/json"


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


# --- R2: what every request is screened for, before anything else -------------------------------

MAX_DEPTH = 64  # arrays and objects nested deeper than this are INVALID_INPUT
# M5: an incoming X-Request-Id is kept when it is a plain token, else a new id is made.
_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
# Content-Type values taken without parsing (what the CLI, the agent and aiohttp send).
_JSON_TYPES = frozenset({JSON, "application/json; charset=utf-8", "application/json;charset=utf-8"})
_OBJECT = msgspec.json.Decoder(dict[str, msgspec.Raw])  # checks the syntax, builds no values
# A string, or an unclosed one to the end of the body: possessive, so a body of unclosed
# strings is one linear scan (a pattern that must find the closing quote backtracks from
# every quote to the end: quadratic, seconds of the event loop for 32 KB).
_STRING = re.compile(rb'"(?:[^"\\]++|\\.?)*+(?:"|\Z)', re.DOTALL)
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_NOT_OPENING = bytes(b for b in range(256) if b not in b"[{")
_STEP = bytes.maketrans(b"[{]}", b"\x01\x01\xff\xff")  # +1 and -1 as signed bytes


def incoming_request_id(request: web.Request) -> str:
    """The caller's ``X-Request-Id`` when it matches ``^[A-Za-z0-9._:-]{1,128}$``, else a new id."""
    given = request.headers.get("X-Request-Id")
    if given is not None and _REQUEST_ID.fullmatch(given):
        return given
    return new_request_id()


def json_depth(raw: bytes) -> int:
    """How deep arrays and objects nest in a JSON text, with no recursion.

    Strings are cut out (a bracket inside one is text), every other byte but the
    brackets is dropped, and the running sum of +1 per opening and -1 per closing
    bracket peaks at the depth: all in C loops (re, bytes.translate, accumulate).
    """
    steps = _STRING.sub(b"", raw).translate(_STEP, _NOT_BRACKET)
    return max(itertools.accumulate(memoryview(steps).cast("b")), default=0)


def check_body(raw: bytes) -> None:
    """R2: the body is UTF-8, JSON, nested at most MAX_DEPTH deep, and an object."""
    if not raw.isascii():
        try:
            raw.decode()
        except UnicodeDecodeError as exc:
            raise InvalidInput("the body is not UTF-8", byte=exc.start) from None
    # Deeper than MAX_DEPTH needs more than MAX_DEPTH opening brackets: most bodies stop here.
    if (
        len(raw) > MAX_DEPTH
        and len(raw.translate(None, _NOT_OPENING)) > MAX_DEPTH  # one pass, ~0.4 ns a byte
        and json_depth(raw) > MAX_DEPTH
    ):
        raise InvalidInput(f"the body nests arrays or objects deeper than {MAX_DEPTH} levels")
    try:
        _OBJECT.decode(raw)
    except msgspec.ValidationError:
        raise InvalidInput("the body is not a JSON object") from None
    except (msgspec.DecodeError, RecursionError):
        raise InvalidInput("the body is not valid JSON") from None


def is_json_type(value: str | None) -> bool:
    """``application/json`` (any case), with no charset or UTF-8 (RFC 8259: JSON is UTF-8).

    Parsed here, not by aiohttp's ``request.content_type``: that raises IndexError on
    ``application/json; 0*`` (a 500). Other ``name=value`` parameters are ignored; a
    parameter without ``=`` makes the type unacceptable.
    """
    if value is None:
        return False
    mime, *parameters = value.split(";")
    if mime.strip().lower() != JSON:
        return False
    for parameter in parameters:
        name, equals, given = parameter.partition("=")
        if not equals:
            return False
        if name.strip().lower() == "charset" and given.strip().strip('"').lower() not in (
            "utf-8",
            "utf8",
        ):
            return False
    return True


async def read_body(request: web.Request) -> bytes:
    """The whole body (aiohttp keeps it: parse_body reads it again for free), at most 1 MiB."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise PayloadTooLarge("request body is over 1 MiB", limit=MAX_BODY_BYTES)
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge("request body is over 1 MiB", limit=MAX_BODY_BYTES) from None
    except (HttpProcessingError, ConnectionError):
        raise InvalidInput(
            "the body could not be read (bad chunk encoding, or cut short)"
        ) from None


async def screen(request: web.Request) -> None:
    """R2: refused before authentication and before any method runs, as INVALID_INPUT.

    Any request with a second ``Authorization`` header. A method (a POST on a route) whose
    body is not a UTF-8 JSON object nested at most 64 deep, or, the body being fine, whose
    Content-Type is not ``application/json`` (a missing one included: every client we ship,
    and curl with ``-H 'Content-Type: application/json'``, sends it; ``curl -d`` alone sends a
    form type).
    """
    headers = request.headers
    if len(headers.getall("Authorization", ())) > 1:
        raise InvalidInput("send one Authorization header", header="Authorization")
    if request.method != "POST" or request.match_info.http_exception is not None:
        return
    check_body(await read_body(request))
    content_type = headers.get("Content-Type")
    if content_type not in _JSON_TYPES and not is_json_type(content_type):
        raise InvalidInput("send Content-Type: application/json", header="Content-Type")


@web.middleware
async def request_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request id on every log line and error body; one log line per request; errors mapped."""
    request_id = incoming_request_id(request)
    structlog.contextvars.bind_contextvars(request_id=request_id)
    started = time.perf_counter()
    try:
        try:
            await screen(request)
            response = await handler(request)
        except ApiError as exc:
            response = error_response(exc, request_id)
        except web.HTTPNotFound:
            response = error_response(NotFound("no such method", path=request.path), request_id)
        except web.HTTPMethodNotAllowed as exc:
            error = InvalidInput("use POST with a JSON body")
            response = error_response(error, request_id)
            response.set_status(405)
            response.headers["Allow"] = ", ".join(sorted(exc.allowed_methods))
        except web.HTTPException as exc:
            # Anything else aiohttp raises about the request itself (never seen so far).
            status = exc.status if 400 <= exc.status < 500 else 400
            response = error_response(InvalidInput(exc.reason), request_id)
            response.set_status(status)
        except Exception:
            log.exception("unhandled error", path=request.path)
            response = json_response(
                error_body("INTERNAL", "internal error", {}, request_id), status=500
            )
        elapsed = time.perf_counter() - started
        response.headers["X-Request-Id"] = request_id
        route = request.path if request.match_info.route.resource else "unmatched"
        request.app[METRICS].observe(route, response.status, elapsed)
        log_request(
            request_id,
            request.method,
            request.path,
            response.status,
            round(elapsed * 1000, 3),
            request.get(CALLER, {}),
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
    db: Database,
    token: str | None,
    request: MutableMapping[Any, Any],
    runtime: Runtime,
) -> Principal | dict[str, Any] | None:
    """Who calls, by the method's kind of credential; UNAUTHENTICATED when unknown. Who it
    is goes in ``request`` (the request, or a worker's stand-in) for the log line."""
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


def decide_in(db: Database, method: Method, token: str | None, caller: Any, body: Any) -> None:
    """At the start of each of a mutation's transactions: the caller's credential is still
    live (a revocation committed meanwhile refuses it) and the method's decision holds."""
    if token is not None:
        live = (
            still_live(db, token)
            if method.auth == "credential"
            else (authenticate_node(db, token) or {}).get("id") == caller["id"]
        )
        if not live:
            raise Unauthenticated("unknown, revoked or expired credential")
    authorize(db, caller, method.access, body)


ENCODE_SLICE = 200  # a list's items encoded this many at a time


def encode_answer(answer: msgspec.Struct) -> bytes:
    """The answer's JSON; a long list's items a slice at a time. One msgspec call holds the
    interpreter until it returns: a 10,000-pool answer in one call held it ~15 ms, so the
    event loop waited that long behind a reader thread (B6)."""
    items = getattr(answer, "items", None)
    if not isinstance(items, list) or len(items) <= ENCODE_SLICE:
        return msgspec.json.encode(answer)
    empty = msgspec.json.encode(msgspec.structs.replace(answer, items=[]))
    parts = [
        msgspec.json.encode(items[at : at + ENCODE_SLICE])[1:-1]
        for at in range(0, len(items), ENCODE_SLICE)
    ]
    # Quotes inside strings are escaped, so the first '"items":[]' is the field itself.
    return empty.replace(b'"items":[]', b'"items":[' + b",".join(parts) + b"]", 1)


async def on_reader(store: Store, fn: Callable[[Database], T]) -> T:
    """``fn`` on a reader: SQLite's on the loop (a local call of microseconds, autocommit
    statements), PostgreSQL's on a reader thread (a network round trip must not hold the
    loop, B6)."""
    if store.postgres:
        return await store.read_short(fn)
    return fn(store.reader)


def run_read(
    method: Method,
    call: Read,
    token: str | None,
    request: MutableMapping[Any, Any],
    runtime: Runtime,
    body: Any,
) -> Callable[[Database], tuple[int, msgspec.Struct, bytes]]:
    """The read as one function of its transaction: who calls, the decision, the answer and
    its encoding (on a reader thread too, for an offloaded one), and the generation it saw."""

    def run(db: Database) -> tuple[int, msgspec.Struct, bytes]:
        caller = identify(method, db, token, request, runtime)
        authorize(db, caller, method.access, body)
        made_at = generation(db) if call.cached else 0
        answer = call.fn(db, caller, body, runtime)
        return made_at, answer, encode_answer(answer)

    return run


async def answer_read(
    request: web.Request, runtime: Runtime, method: Method, call: Read, token: str | None
) -> bytes:
    """A read's encoded answer: from the cache while the generation stands; else read, on a
    reader thread when offloaded; a long-poll reads again after each commit until it has
    something or its time is up (B2)."""
    store = runtime.db
    body = await parse_body(request, method.request)
    key = None
    if call.cached:
        # The credential is live, then the state a cached answer must have been made at.
        def check(db: Database) -> tuple[Any, int]:
            return identify(method, db, token, request, runtime), generation(db)

        caller, now_at = await on_reader(store, check)
        assert isinstance(caller, Principal), "a cached read is a credential's"
        key = (method.path, caller.credential_id, await request.read())
        hit = runtime.answers.get(key, now_at)
        if hit is not None:
            return hit  # made at this generation, for this credential and body, after its decision
        if call.offload and runtime.workers.ready:
            from_worker = await read_in_worker(request, runtime, method, token)
            if from_worker is not None:
                runtime.answers.put(key, *from_worker)
                return from_worker[1]
    loop = asyncio.get_running_loop()
    deadline = None
    waits_for = None  # whose events end a wait: one tenant's, or (None) any
    if call.long_poll is not None and call.long_poll.seconds(body) > 0:
        caller = await on_reader(store, lambda db: identify(method, db, token, request, runtime))
        waits_for = call.long_poll.waits_for(body, caller)
    while True:
        # Before reading: a commit after this is news to this read.
        seen = runtime.commits.position(waits_for)
        run = run_read(method, call, token, request, runtime, body)
        if call.offload:
            started = time.perf_counter()
            made_at, answer, encoded = await store.read(run)
            if call.cached:  # the reads workers take
                runtime.workers.saw(time.perf_counter() - started)
        elif store.postgres:
            made_at, answer, encoded = await store.read_short(run)
        else:
            # No await inside: the read transaction never spans a suspension.
            with store.snapshot() as db:
                made_at, answer, encoded = run(db)
        if call.long_poll is None:
            break
        if deadline is None:
            deadline = loop.time() + call.long_poll.seconds(body)
        again = call.long_poll.resume(body, answer)
        left = deadline - loop.time()
        if again is None or left <= 0:
            break
        body, read_past = again
        if not read_past and not await runtime.commits.wait_beyond(seen, left, waits_for):
            break
    if key is not None:
        runtime.answers.put(key, made_at, encoded)
    return encoded


async def read_in_worker(
    request: web.Request, runtime: Runtime, method: Method, token: str | None
) -> tuple[int, bytes] | None:
    """A cached list read by a worker process (B6): its generation and encoded answer, or
    the error it decided, raised here as the same ApiError; None when no worker could."""
    outcome = await runtime.workers.answer(method.path, token, await request.read())
    if outcome is None:
        return None
    if outcome[0] == "error":
        _, status, code, message, details = outcome
        raise relayed_error(status, code, message, details)
    _, made_at, encoded, caller = outcome
    request[CALLER] = caller
    return made_at, encoded


def method_handler(method: Method) -> Handler:
    async def handle(request: web.Request) -> web.Response:
        runtime = request.app[RUNTIME]
        token = None if method.auth == "none" else bearer_token(request)
        if isinstance(method.call, Read):
            encoded = await answer_read(request, runtime, method, method.call, token)
            return web.Response(body=encoded, headers=JSON_HEADERS)
        body = await parse_body(request, method.request)

        # On the reader, outside a transaction (each statement sees the latest commit): a
        # refusal costs no writer time, and a write that ends without a transaction (an
        # unchanged report) is decided too; decided again inside each transaction.
        def decide(db: Database) -> Any:
            who = identify(method, db, token, request, runtime)
            authorize(db, who, method.access, body)
            return who

        caller = await on_reader(runtime.db, decide)
        store = runtime.db.gated(lambda db: decide_in(db, method, token, caller, body))
        return json_response(await method.call.fn(store, runtime, caller, body))

    return handle


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
    add_console_routes(app)  # M2: the web console at /ui/
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
