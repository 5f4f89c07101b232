"""Answers as bytes: JSON bodies, the error body, and a long list encoded a slice at a time."""

import msgspec
from aiohttp import web

from controlplane.api.screen import JSON
from shared.errors import ApiError, Unavailable, error_body

JSON_HEADERS = {"Content-Type": JSON}


def json_response(body: object, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, headers=JSON_HEADERS)


def error_response(error: ApiError, request_id: str) -> web.Response:
    body = error_body(error.code, error.message, error.details, request_id)
    response = json_response(body, status=error.status)
    if isinstance(error, Unavailable):  # F1: when the caller should try again
        response.headers["Retry-After"] = str(error.retry_after)
    return response


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
