"""One API method: its path, request and answer schemas, and the service call behind it."""

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from aiohttp import web

from controlplane.config import MAX_BODY_BYTES
from controlplane.iam.decide import Principal
from controlplane.runtime import Runtime
from controlplane.storage.db import Store
from shared.errors import InvalidInput, PayloadTooLarge
from shared.validation import field_of

# Who calls: a tenant credential's principal, a node (its row), or nobody (nodes/join).
Caller = Any
Call = Callable[[Runtime, Caller, Any], Awaitable[msgspec.Struct] | msgspec.Struct]
Auth = Literal["credential", "node", "none"]


@dataclass(frozen=True)
class Method:
    """``POST /api/<service>/<group>/<verb>`` with a JSON object body and a JSON answer."""

    path: str
    request: type[msgspec.Struct]
    answer: type[msgspec.Struct]
    call: Call
    summary: str
    auth: Auth = "credential"

    @property
    def operation_id(self) -> str:
        return self.path.removeprefix("/api/").replace("/", ".")

    async def invoke(self, runtime: Runtime, caller: Caller, body: Any) -> msgspec.Struct:
        result = self.call(runtime, caller, body)
        if inspect.isawaitable(result):
            result = await result
        return result


def read(fn: Callable[[Any, Principal, Any], msgspec.Struct]) -> Call:
    """A read service runs on the reader connection, on the event loop (no thread hop),
    in one read transaction so that a pool and its quota rows come from the same write."""

    def call(runtime: Runtime, principal: Principal, body: Any) -> msgspec.Struct:
        with runtime.db.snapshot() as db:
            return fn(db, principal, body)

    return call


def write(fn: Callable[[Store, Principal, Any], Awaitable[msgspec.Struct]]) -> Call:
    """A mutation service runs its transaction on the store's writer."""
    return lambda runtime, principal, body: fn(runtime.db, principal, body)


async def parse_body(request: web.Request, schema: type[msgspec.Struct]) -> Any:
    """The body decoded and validated by its schema, or INVALID_INPUT naming the field."""
    if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
        raise PayloadTooLarge("request body is over 1 MiB", limit=MAX_BODY_BYTES)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge("request body is over 1 MiB", limit=MAX_BODY_BYTES) from None
    try:
        return msgspec.json.decode(raw, type=schema)
    except msgspec.ValidationError as exc:
        field, message = field_of(exc)
        raise InvalidInput(message, field=field or None) from None
    except msgspec.DecodeError:
        raise InvalidInput("the body is not valid JSON") from None
