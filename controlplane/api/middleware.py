"""The one middleware: a request id on every line, admission (F10), the screen, errors mapped,
one log line."""

import contextlib
import contextvars
import time
from collections.abc import Awaitable, Callable

import structlog
from aiohttp import web

from controlplane.api.answer import error_response, json_response
from controlplane.api.keys import BODY, CALLER, METRICS, RUNTIME, SCREENED
from controlplane.api.screen import incoming_request_id, screen
from controlplane.overload import Overload
from shared.errors import ApiError, BodyTimedOut, InvalidInput, NotFound, Unavailable, error_body
from shared.log import lines_written, log_request

log = structlog.get_logger("controlplane.http")
# The request id on every line logged while the request is handled: structlog's
# merge_contextvars takes each context variable named with its prefix.
REQUEST_ID: contextvars.ContextVar[str] = contextvars.ContextVar(
    f"{structlog.contextvars.STRUCTLOG_KEY_PREFIX}request_id"
)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def request_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A request id on every log line and error body; one log line per request; errors mapped.
    An API method's request is shed (503 with Retry-After) when the replica already handles
    ``--max-inflight`` of them (F10)."""
    request_id = incoming_request_id(request)
    bound = REQUEST_ID.set(request_id)
    started = time.perf_counter()
    hang_up = False
    app = request.app
    screened = app.get(SCREENED, {}).get(request.path)  # None: no API method's path
    overload: Overload | None = None
    admitted: Overload | None = None  # holds one of its slots
    try:
        try:
            if screened is not None:
                runtime = app[RUNTIME]
                overload = runtime.overload
                if not overload.admit(runtime.db.write_wait() if screened.write else None):
                    raise Unavailable(
                        "the control plane is overloaded; try again",
                        retry_after=overload.retry_after,
                    )
                admitted = overload
            await screen(request, screened)
            if admitted is not None and getattr(request.get(BODY), "wait_seconds", None):
                admitted.leave()  # a long-poll waits holding no work: not counted
                admitted = None
            response = await handler(request)
        except BodyTimedOut as exc:
            response = error_response(exc, request_id)
            response.force_close()
            hang_up = True
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
        if admitted is not None:
            admitted.leave()
            admitted = None
        if overload is not None and response.status == 503:
            overload.behind()  # shed, or its database away: reports may have gone unheard
        elapsed = time.perf_counter() - started
        response.headers["X-Request-Id"] = request_id
        route = request.path if request.match_info.route.resource else "unmatched"
        app[METRICS].observe(route, response.status, elapsed)
        if log_request(
            request_id,
            request.method,
            request.path,
            response.status,
            round(elapsed * 1000, 3),
            request.get(CALLER, {}),
        ):
            await lines_written()  # M5: answered once its line is written
        if hang_up:
            await answer_and_hang_up(request, response)
        return response
    finally:
        if admitted is not None:  # cancelled (the client left) before it was answered
            admitted.leave()
        REQUEST_ID.reset(bound)


async def answer_and_hang_up(request: web.Request, response: web.StreamResponse) -> None:
    """F4: after a 408 the rest of the body is not waited for. Returned as it is, aiohttp
    would go on reading the body for its lingering time before closing; so the answer goes
    out here and the connection is closed at once (aiohttp then finds it sent)."""
    with contextlib.suppress(ConnectionError):  # the client left first: nothing to send
        await response.prepare(request)
        await response.write_eof()
    request.protocol.force_close()
