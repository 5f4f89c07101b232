"""R2: what every request is screened for, before authentication and before any method runs;
F4: a body that takes too long, and a bearer token that cannot be any credential."""

import asyncio
import itertools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from controlplane.api.keys import BODY, BODY_TIMEOUT
from controlplane.config import BODY_TIMEOUT_S, MAX_BODY_BYTES
from controlplane.iam.tokens import CREDENTIAL_PREFIX, NODE_PREFIX
from shared.errors import BodyTimedOut, InvalidInput, PayloadTooLarge, Unauthenticated
from shared.ids import request_id as new_request_id

JSON = "application/json"
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

PREFIXES = {"credential": CREDENTIAL_PREFIX, "node": NODE_PREFIX}  # by Method.auth
# After its prefix, a token is secrets.token_urlsafe(32): 43 characters of base64url.
_TOKEN_SECRET = re.compile(r"[A-Za-z0-9_-]{43}")


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


@dataclass(frozen=True, slots=True)
class Screened:
    """What admission and the screen need of one method, found by its path once a request."""

    decoder: msgspec.json.Decoder[Any]  # of its request schema
    write: bool  # a mutation: shed too while this replica's writes wait long (F10)
    token_prefix: str | None  # F4: its kind of bearer token (nodes/join takes none)


def check_body(raw: bytes, decoder: msgspec.json.Decoder[Any] | None = None) -> object:
    """R2: the body is UTF-8, JSON, nested at most MAX_DEPTH deep, and an object.

    With the ``decoder`` of its method's schema, a good body is decoded once, here, and
    returned; one the schema refuses has its JSON checked apart (R2's refusals come first)
    and the schema's ``ValidationError`` is returned, for the method to raise after
    authentication.
    """
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
    if decoder is not None:
        try:
            return decoder.decode(raw)
        except msgspec.ValidationError as refused:
            outcome: object = refused
        except (msgspec.DecodeError, RecursionError):
            raise InvalidInput("the body is not valid JSON") from None
    else:
        outcome = None
    try:
        _OBJECT.decode(raw)
    except msgspec.ValidationError:
        raise InvalidInput("the body is not a JSON object") from None
    except (msgspec.DecodeError, RecursionError):
        raise InvalidInput("the body is not valid JSON") from None
    return outcome


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
    seconds = BODY_TIMEOUT_S
    try:
        if request.content.is_eof():  # the usual case: it came whole with its head
            return await request.read()  # over 1 MiB: aiohttp's client_max_size refuses it
        if request.content_length is not None and request.content_length > MAX_BODY_BYTES:
            raise PayloadTooLarge("request body is over 1 MiB", limit=MAX_BODY_BYTES)
        # Screened as soon as its head is parsed, so the deadline runs from the headers (F4):
        # a body trickled in a byte at a time holds its connection no longer than this.
        seconds = request.app.get(BODY_TIMEOUT, BODY_TIMEOUT_S)
        async with asyncio.timeout(seconds):
            return await request.read()
    except TimeoutError:
        raise BodyTimedOut(
            f"the body did not arrive whole within {seconds:g} s of the headers", seconds=seconds
        ) from None
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge("request body is over 1 MiB", limit=MAX_BODY_BYTES) from None
    except (HttpProcessingError, ConnectionError):
        raise InvalidInput(
            "the body could not be read (bad chunk encoding, or cut short)"
        ) from None


def check_token_shape(headers: Mapping[str, str], prefix: str) -> None:
    """F4: a bearer token that is not of the shape the daemon issues with ``prefix`` is no
    credential of that kind: UNAUTHENTICATED, as an unknown one is, with nothing read for it.
    A missing or non-bearer ``Authorization`` is left to the method (401 before any read too);
    a token of the right shape is looked up, and that read is its authentication."""
    scheme, _, token = headers.get("Authorization", "").partition(" ")
    token = token.strip()
    if (
        scheme.lower() == "bearer"
        and token
        and not (token.startswith(prefix) and _TOKEN_SECRET.fullmatch(token, len(prefix)))
    ):
        raise Unauthenticated("unknown, revoked or expired credential")


async def screen(request: web.Request, screened: Screened | None) -> None:
    """R2: refused before authentication and before any method runs, as INVALID_INPUT.

    Any request with a second ``Authorization`` header. A method (a POST on a route) whose
    body is not a UTF-8 JSON object nested at most 64 deep, or, the body being fine, whose
    Content-Type is not ``application/json`` (a missing one included: every client we ship,
    and curl with ``-H 'Content-Type: application/json'``, sends it; ``curl -d`` alone sends a
    form type). F4: a body not whole within the body timeout (408), then a bearer token that
    cannot be the method's kind of credential (401). ``screened``: what the path's method
    needs, None when the path is no method's (an app without methods: a test's).
    """
    headers = request.headers
    if len(headers.getall("Authorization", ())) > 1:
        raise InvalidInput("send one Authorization header", header="Authorization")
    if request.method != "POST" or request.match_info.http_exception is not None:
        return
    raw = await read_body(request)
    request[BODY] = check_body(raw, None if screened is None else screened.decoder)
    content_type = headers.get("Content-Type")
    if content_type not in _JSON_TYPES and not is_json_type(content_type):
        raise InvalidInput("send Content-Type: application/json", header="Content-Type")
    if screened is not None and screened.token_prefix is not None:
        check_token_shape(headers, screened.token_prefix)
