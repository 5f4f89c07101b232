"""One method's request from the credential to the answer: who calls, the decision, the read
pipeline (cache, worker processes, reader threads, long-poll) and the write gate."""

import asyncio
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from controlplane.api.answer import JSON_HEADERS, encode_answer, json_response
from controlplane.api.keys import CALLER, RUNTIME
from controlplane.api.method import Method, Read, parse_body
from controlplane.iam.decide import Principal
from controlplane.runtime import Runtime
from controlplane.services.access import authorize
from controlplane.services.call import Call, Caller, Env
from controlplane.services.iam import authenticate, still_live
from controlplane.services.reports import authenticate_head, authenticate_node
from controlplane.storage.db import Store, generation
from controlplane.storage.node_types import NodeHead
from controlplane.storage.sql import Database
from shared.errors import Unauthenticated, relayed_error

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


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
    head: bool = False,
) -> Caller:
    """Who calls, by the method's kind of credential; UNAUTHENTICATED when unknown. Who it
    is goes in ``request`` (the request, or a worker's stand-in) for the log line. A node's
    credential resolves to its node's whole row, or with ``head`` (a write's first step,
    decided again on the whole row in each of its transactions) to its small columns."""
    if method.auth == "credential":
        assert token is not None
        principal = authenticate(db, token, runtime.credentials)
        if principal is None:
            raise Unauthenticated("unknown, revoked or expired credential")
        request[CALLER] = {"tenant": principal.tenant_id, "credential": principal.credential_id}
        return principal
    if method.auth == "node":
        assert token is not None
        node = (
            authenticate_head(db, token, runtime.db.heads) if head else authenticate_node(db, token)
        )
        if node is None:
            raise Unauthenticated("unknown node credential")
        request[CALLER] = {"node": node.id}
        return node
    return None


def decide(db: Database, method: Method, call: Call[Any]) -> None:
    """The method's decision on ``call``, in the snapshot or transaction ``db`` is: what it
    found (the pool, reservation or node) goes in ``call.found`` for the service."""
    call.found = authorize(db, call.caller, method.access, call.body)


def gate(method: Method, token: str | None, call: Call[Any]) -> Callable[[Database], None]:
    """What runs at the start of each of a mutation's transactions: the caller's credential
    is still live (a revocation committed meanwhile refuses it), a node's row is read afresh
    (the one its service then uses), and the method's decision holds."""

    def check(db: Database) -> None:
        if token is not None:
            if method.auth == "credential":
                if not still_live(db, token):
                    raise Unauthenticated("unknown, revoked or expired credential")
            else:
                node = authenticate_node(db, token)
                first = call.caller  # the node the request was identified as
                if node is None or not isinstance(first, NodeHead) or node.id != first.id:
                    raise Unauthenticated("unknown, revoked or expired credential")
                call.caller = node
        decide(db, method, call)

    return check


async def on_reader(store: Store, fn: Callable[[Database], T]) -> T:
    """``fn`` on a reader, outside a transaction (autocommit statements, each seeing the latest
    commit): SQLite's on the loop (a local call of microseconds), PostgreSQL's on a reader
    thread (a network round trip must not hold the loop, B6)."""
    if store.postgres:
        return await store.read_latest(fn)
    return fn(store.reader)


def run_read(
    method: Method,
    read: Read,
    token: str | None,
    request: MutableMapping[Any, Any],
    runtime: Runtime,
    body: Any,
    identified: Principal | None = None,
) -> Callable[[Database], tuple[int, msgspec.Struct, bytes]]:
    """The read as one function of its transaction: who calls (``identified``: the caller a
    cache check just identified, not looked up again), the decision, the answer and its
    encoding (on a reader thread too, for an offloaded one), and the generation it saw."""

    def run(db: Database) -> tuple[int, msgspec.Struct, bytes]:
        caller = identified or identify(method, db, token, request, runtime)
        call = Call(caller, body, runtime.env)
        decide(db, method, call)
        made_at = generation(db, read.scopes) if read.cached else 0
        answer = read.fn(db, call)
        return made_at, answer, encode_answer(answer)

    return run


async def answer_read(
    request: web.Request, runtime: Runtime, method: Method, read: Read, token: str | None
) -> bytes:
    """A read's encoded answer: from the cache while the generation stands; else read, on a
    reader thread when offloaded; a long-poll reads again after each commit until it has
    something or its time is up (B2)."""
    store = runtime.db
    body = await parse_body(request, method.request)
    key, identified = None, None
    if read.cached:
        # The credential is live, then the state a cached answer must have been made at.
        def check(db: Database) -> tuple[Caller, int]:
            return identify(method, db, token, request, runtime), generation(db, read.scopes)

        caller, now_at = await on_reader(store, check)
        assert isinstance(caller, Principal), "a cached read is a credential's"
        key = (method.path, caller.credential_id, await request.read())
        identified = caller  # a miss reads as this caller: identified once
        hit = runtime.answers.get(key, now_at)
        if hit is not None:
            return hit  # made at this generation, for this credential and body, after its decision
        if read.offload and runtime.workers.ready:
            from_worker = await read_in_worker(request, runtime, method, token)
            if from_worker is not None:
                runtime.answers.put(key, *from_worker)
                return from_worker[1]
    loop = asyncio.get_running_loop()
    deadline = None
    waits_for = None  # whose events end a wait: one tenant's, or (None) any
    if read.long_poll is not None and read.long_poll.seconds(body) > 0:
        caller = await on_reader(store, lambda db: identify(method, db, token, request, runtime))
        assert isinstance(caller, Principal), "a long-poll is a credential's"
        waits_for = read.long_poll.waits_for(body, caller)
    while True:
        # Before reading: a commit after this is news to this read.
        seen = runtime.commits.position(waits_for)
        run = run_read(method, read, token, request, runtime, body, identified)
        if read.offload:
            started = time.perf_counter()
            made_at, answer, encoded = await store.read(run)
            if read.cached:  # the reads workers take
                runtime.workers.saw(time.perf_counter() - started)
        elif store.postgres:
            made_at, answer, encoded = await store.read_short(run)
        else:
            # No await inside: the read transaction never spans a suspension.
            with store.snapshot() as db:
                made_at, answer, encoded = run(db)
        if read.long_poll is None:
            break
        if deadline is None:
            deadline = loop.time() + read.long_poll.seconds(body)
        again = read.long_poll.resume(body, answer)
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
        def first(db: Database) -> Call[Any]:
            caller = identify(method, db, token, request, runtime, head=True)
            call = Call(caller, body, runtime.env)
            decide(db, method, call)
            return call

        call = await on_reader(runtime.db, first)
        store = runtime.db.gated(gate(method, token, call))
        return json_response(await method.call.fn(store, call))

    return handle


async def invoke(
    method: Method, store: Store, env: Env, caller: Caller, body: Any
) -> msgspec.Struct:
    """A method called in process (benchmarks, property tests), decided as a request is: the
    read in one snapshot after its decision, the write through the same gate."""
    call = Call(caller, body, env)
    if isinstance(method.call, Read):
        with store.snapshot() as db:
            decide(db, method, call)
            return method.call.fn(db, call)
    return await method.call.fn(store.gated(lambda db: decide(db, method, call)), call)
