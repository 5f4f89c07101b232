"""One API method: its path, request and answer schemas, and the service call behind it."""

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal

import msgspec
from aiohttp import web

from controlplane.api.keys import BODY
from controlplane.iam.decide import Principal
from controlplane.services.access import Access
from controlplane.services.call import Call
from controlplane.storage.db import Store
from controlplane.storage.migrations import EVERY_SCOPE, Scope
from controlplane.storage.sql import Database
from shared.errors import InvalidInput
from shared.validation import field_of

Auth = Literal["credential", "node", "none"]


@dataclass(frozen=True)
class LongPoll:
    """B2: a read that, answering nothing new, waits up to ``seconds(body)`` for a commit and
    reads again. ``resume(body, answer)`` is None when the answer has something (send it),
    else the body to read with next and whether this read got past anything (rows the
    caller may not see: read on at once, there may be more behind them)."""

    seconds: Callable[[Any], float]
    resume: Callable[[Any, Any], tuple[Any, bool] | None]
    # Whose events may end the wait, from the body and the caller: a tenant, or None (any
    # event: the fleet's view). A commit of events for others does not even cause a read.
    waits_for: Callable[[Any, Principal], str | None]


@dataclass(frozen=True)
class Read:
    """A read, inside one read transaction that also authenticates the caller, so a pool and
    its quota rows come from one write. Short reads run on the event loop's reader; an
    ``offload`` one (a list, whose cost grows with the fleet) on a reader thread (B6). A
    ``cached`` one's encoded answer is kept per credential and body while the generations
    of its ``scopes`` (what it shows, F8) stand: it must depend on nothing but the database
    (not node liveness)."""

    fn: Callable[[Database, Call[Any]], msgspec.Struct]
    offload: bool = False
    cached: bool = False
    scopes: tuple[Scope, ...] = EVERY_SCOPE
    long_poll: LongPoll | None = None


@dataclass(frozen=True)
class Write:
    """A mutation: its service runs its transactions on the store's writer thread; the store
    it is given runs the method's IAM decision at the start of each (``call.found`` is what
    that decision found, in that transaction)."""

    fn: Callable[[Store, Call[Any]], Awaitable[msgspec.Struct]]


@dataclass(frozen=True)
class Method:
    """``POST /api/<service>/<group>/<verb>`` with a JSON object body and a JSON answer."""

    path: str
    request: type[msgspec.Struct]
    answer: type[msgspec.Struct]
    call: Read | Write
    summary: str
    access: Access  # the IAM decision, made before the service runs: no method without one

    @property
    def auth(self) -> Auth:
        return self.access.auth

    @property
    def operation_id(self) -> str:
        return self.path.removeprefix("/api/").replace("/", ".")


async def parse_body(request: web.Request, schema: type[msgspec.Struct]) -> Any:
    """The body decoded and validated by its schema, or INVALID_INPUT naming the field.

    The app's middleware has already read the body (at most 1 MiB), refused (R2) one that
    is not a UTF-8 JSON object nested at most 64 deep, and decoded it with this schema
    (``BODY``): what it found is taken here, so a body is parsed once.
    """
    screened = request.get(BODY)
    if isinstance(screened, schema):
        return screened
    try:
        if not isinstance(screened, msgspec.ValidationError):
            return msgspec.json.decode(await request.read(), type=schema)
        raise screened
    except msgspec.ValidationError as exc:
        field, message = field_of(exc)
        raise InvalidInput(message, field=field or None) from None
