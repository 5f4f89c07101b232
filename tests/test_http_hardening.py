"""R2 on the wire: bad bodies and headers are INVALID_INPUT before anything else, never a 500;
integers as the OpenAPI document says; timeouts on half-sent heads and idle connections."""

import asyncio
import http.client
import json
import socket
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from multidict import CIMultiDict

from controlplane.api.routes import ALL_METHODS
from controlplane.api.screen import MAX_DEPTH, json_depth
from tests.conftest import Api
from tests.daemons import Daemon

SHAPE = {"code", "message", "details", "requestId"}
NODE_SHAPED = "bcn_" + "A" * 43  # of a node credential's shape, no node's
JSON_TYPE = {"Content-Type": "application/json"}
# A few methods of each kind: a read, a write, the unauthenticated join, a node method, IAM.
PATHS = (
    "compute/pools/list",
    "compute/pools/create",
    "compute/nodes/join",
    "compute/nodes/report",
    "iam/tenants/create",
    "compute/reservations/create",
)


async def post(
    api: Api,
    path: str,
    raw: bytes,
    *,
    auth: bool = True,
    content_type: str | None = "application/json",
    extra: Sequence[tuple[str, str]] = (),
) -> tuple[int, Any, Any]:
    headers: CIMultiDict[str] = CIMultiDict()
    if auth:
        headers.add("Authorization", f"Bearer {api.token}")
    if content_type is not None:
        headers.add("Content-Type", content_type)
    for name, value in extra:
        headers.add(name, value)
    response = await api.client.post(
        f"/api/{path}", data=raw, headers=headers, skip_auto_headers=["Content-Type"]
    )
    return response.status, await response.json(), response.headers


def invalid_input(status: int, body: Any, headers: Any, expected: int = 400) -> dict[str, Any]:
    """The one error body shape (shared/errors.py error_body), INVALID_INPUT."""
    assert status == expected, body
    assert set(body) == {"error"} and set(body["error"]) == SHAPE, body
    assert body["error"]["code"] == "INVALID_INPUT", body
    assert body["error"]["requestId"] == headers["X-Request-Id"]
    return dict(body["error"])


def nested(depth: int) -> bytes:
    """An object body whose policy nests arrays so that the whole body is `depth` deep."""
    inner = b"[" * (depth - 2) + b"]" * (depth - 2)
    return b'{"tenantId":"root","policy":{"x":' + inner + b"}}"


async def test_r2_bad_utf8_is_invalid_input_for_any_method_also_unauthenticated(api: Api) -> None:
    """R2: a body that is not UTF-8 is 400 INVALID_INPUT on every method, with or without a token."""
    for path in PATHS:
        for auth in (True, False):
            status, body, headers = await post(api, path, b'{"tenantId":"\xff"}', auth=auth)
            error = invalid_input(status, body, headers)
            assert "UTF-8" in error["message"]


async def test_r2_nesting_deeper_than_64_is_invalid_input_before_authentication(api: Api) -> None:
    """R2: JSON nested 65 or ~990+ levels deep is 400 INVALID_INPUT (never a RecursionError 500)."""
    for depth in (MAX_DEPTH + 1, 990, 5000):
        for path in PATHS:
            for auth in (True, False):
                status, body, headers = await post(api, path, nested(depth), auth=auth)
                error = invalid_input(status, body, headers)
                assert "deeper than 64" in error["message"]
    # Unclosed brackets and a deep array as the whole body are refused as well.
    for raw in (b"[" * 5000, b'{"a":' + b"[" * 5000, b"[" * 990 + b"]" * 990):
        invalid_input(*await post(api, "compute/pools/list", raw, auth=False))


async def test_r2_nesting_of_64_levels_passes_the_screen(api: Api) -> None:
    """R2: 64 levels is allowed; brackets inside strings are text, not nesting."""
    site = await api.site()
    body = nested(MAX_DEPTH).replace(b'"root",', b'"root","siteId":"%s",' % site.encode())
    _, answer, _ = await post(api, "compute/pools/create", body)
    assert "deeper than" not in json.dumps(answer), answer
    text = b'{"tenantId":"' + b"[{" * 500 + b'"}'
    _, answer, _ = await post(api, "compute/pools/list", text)
    assert "deeper than" not in json.dumps(answer), answer
    assert json_depth(b'{"a":"[[[\\"[[[","b":[{"c":[]}]}') == 4
    assert json_depth(b"{}") == 1 and json_depth(b"") == 0


async def test_r2_not_json_or_not_an_object_is_invalid_input_without_a_token(api: Api) -> None:
    """R2: a body that is not JSON, or JSON but not an object, is 400 before authentication."""
    for raw in (
        b"",
        b"not json",
        b"{",
        b'{"a":1}x',
        b"[]",
        b"1",
        b'"x"',
        b"null",
        b'{"a":"\\ud800"}',
    ):
        for path in PATHS:
            invalid_input(*await post(api, path, raw, auth=False))


async def test_r2_a_body_the_schema_refuses_early_is_still_screened_whole(api: Api) -> None:
    """R2: the screen decodes a body with its method's schema once; a body that schema refuses
    at its first field but that is not JSON further on is still 400 before authentication,
    while a well-formed body the schema refuses waits for authentication (401 without a
    token) and is then INVALID_INPUT naming the field."""
    broken = b'{"tenantId": 5, "poolId": '
    refused = b'{"tenantId": 5, "poolId": "pool_x"}'
    error = invalid_input(*await post(api, "compute/pools/get", broken, auth=False))
    assert error["message"] == "the body is not valid JSON", error
    status, body, _ = await post(api, "compute/pools/get", refused, auth=False)
    assert (status, body["error"]["code"]) == (401, "UNAUTHENTICATED"), body
    error = invalid_input(*await post(api, "compute/pools/get", refused))
    assert error["details"]["field"] == "tenantId", error


async def test_r2_a_second_authorization_header_is_invalid_input(api: Api) -> None:
    """R2: two Authorization headers are 400 INVALID_INPUT, on a method and on any other path."""
    two = [("Authorization", f"Bearer {api.token}")]
    status, body, headers = await post(api, "compute/pools/list", b'{"tenantId":"root"}', extra=two)
    error = invalid_input(status, body, headers)
    assert error["details"] == {"header": "Authorization"}
    response = await api.client.get(
        "/healthz", headers=CIMultiDict([("Authorization", "Bearer a"), ("Authorization", "b")])
    )
    invalid_input(response.status, await response.json(), response.headers)


async def test_r2_a_content_type_other_than_json_is_invalid_input(api: Api) -> None:
    """R2: form, text, octet-stream, a missing type or a non-UTF-8 charset are INVALID_INPUT."""
    good = b'{"tenantId":"root"}'
    refused = (
        "application/x-www-form-urlencoded",  # what curl -d sends
        "text/plain",
        "application/octet-stream",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonx",
        "application/json; 0*",  # aiohttp's own parser raises IndexError on this one
        "application/json; charset",
        "",
        None,  # no Content-Type at all
    )
    for content_type in refused:
        for auth in (True, False):
            status, body, headers = await post(
                api, "compute/pools/list", good, auth=auth, content_type=content_type
            )
            error = invalid_input(status, body, headers)
            assert error["details"] == {"header": "Content-Type"}, content_type
    accepted = (
        "application/json",
        "Application/JSON",
        "application/json; charset=UTF-8",
        'application/json ; charset="utf-8"; v=1',
    )
    for content_type in accepted:
        status, body, _ = await post(api, "compute/pools/list", good, content_type=content_type)
        assert status == 200, (content_type, body)


async def test_r2_a_405_carries_allow(api: Api) -> None:
    """R2: a 405 answer names the methods the path takes in Allow."""
    response = await api.client.get("/api/compute/pools/list")
    invalid_input(response.status, await response.json(), response.headers, expected=405)
    assert response.headers["Allow"] == "POST"
    response = await api.client.post("/healthz", json={})
    invalid_input(response.status, await response.json(), response.headers, expected=405)
    assert set(response.headers["Allow"].split(", ")) == {"GET", "HEAD"}


def test_r2_readme_and_the_cli_send_json() -> None:
    """R2: the README's curl examples and the shared client send Content-Type: application/json."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    curls = [line for line in readme.splitlines() if "curl " in line and " -d" in line]
    assert curls and all("Content-Type: application/json" in line for line in curls)
    client = (Path(__file__).parent.parent / "shared" / "client.py").read_text()
    assert '{"Content-Type": "application/json"}' in client


# --- integers: the OpenAPI document and the server agree ---------------------------------------


def _integer_leaves(
    schema: dict[str, Any], components: dict[str, Any], seen: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[tuple[str, str], ...], dict[str, Any]]]:
    """Every integer schema under a request schema: (steps to reach it, the schema)."""
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        if name not in seen:
            yield from _integer_leaves(components[name], components, (*seen, name))
        return
    for branch in schema.get("anyOf", ()):
        yield from _integer_leaves(branch, components, seen)
    if schema.get("type") == "integer":
        yield (), schema
    for name, prop in schema.get("properties", {}).items():
        for steps, leaf in _integer_leaves(prop, components, seen):
            yield (("key", name), *steps), leaf
    if isinstance(schema.get("additionalProperties"), dict):
        for steps, leaf in _integer_leaves(schema["additionalProperties"], components, seen):
            yield (("map", "gpu"), *steps), leaf
    if isinstance(schema.get("items"), dict):
        for steps, leaf in _integer_leaves(schema["items"], components, seen):
            yield (("item", "0"), *steps), leaf


def _body_and_field(steps: tuple[tuple[str, str], ...], value: Any) -> tuple[Any, str]:
    """The smallest body reaching the leaf, and the field INVALID_INPUT must name."""
    body = value
    for kind, name in reversed(steps):
        body = {name: body} if kind in ("key", "map") else [body]
    # A map's value is named by its map (msgspec does not name map keys); an item by its index.
    field = ".".join(name for kind, name in steps if kind != "map")
    return body, field


async def test_r2_openapi_integers_are_integers_and_the_server_refuses_floats(api: Api) -> None:
    """R2: every integer of every request schema says integer (no number, no float bound) in the
    OpenAPI document, and the server refuses 87.0 there with INVALID_INPUT naming the field."""
    document = await (await api.client.get("/api/openapi.json")).json()
    components = document["components"]["schemas"]
    checked = 0
    for method in ALL_METHODS:
        schema = components[method.request.__name__]
        for steps, leaf in _integer_leaves(schema, components):
            assert leaf["type"] == "integer"
            for bound in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "default"):
                assert not isinstance(leaf.get(bound, 0), float), (method.path, steps, leaf)
            assert "multipleOf" not in leaf and "format" not in leaf
            assert "not 87.0" in leaf["description"]
            body, field = _body_and_field(steps, 87.0)
            # A node method takes a node's token: the root one is refused by its shape (F4).
            token = NODE_SHAPED if method.auth == "node" else None
            status, answer = await api.call(method.path.removeprefix("/api/"), body, token)
            assert status == 400, (method.path, body, answer)
            assert answer["error"]["code"] == "INVALID_INPUT"
            assert answer["error"]["details"].get("field") == field, (method.path, body, answer)
            assert "float" in answer["error"]["message"], answer
            checked += 1
    assert checked >= 20  # quota maps, priority, limit, ttlSeconds, the inventory's counters…
    assert "87.0" in document["info"]["description"]


# --- no input ever yields a 500 ---------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzz_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    running = Daemon(tmp_path_factory.mktemp("fuzz"))
    running.start()
    yield running
    running.kill()


PRINTABLE = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
FIELDS = sorted(
    {field.encode_name for m in ALL_METHODS for field in msgspec.structs.fields(m.request)}
)


def _objects() -> st.SearchStrategy[bytes]:
    """Objects with the schemas' own field names and values of any JSON type."""
    keys = st.sampled_from(FIELDS) | st.text(max_size=8)
    return st.dictionaries(keys, JSON_VALUES, max_size=6).map(
        lambda d: json.dumps(d, allow_nan=True).encode()
    )


# Bytes for inside a JSON string: anything, and the UTF-8 mistakes that used to be 500s.
STRING_BYTES = st.binary(max_size=12) | st.sampled_from(
    [b"\xff", b"\xc3", b"\xc0\xaf", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80", b"a\x80b"]
)
BODIES = st.one_of(
    st.binary(max_size=200),
    JSON_VALUES.map(lambda v: json.dumps(v).encode()),
    _objects(),
    _objects().map(lambda b: b[: len(b) // 2]),
    # A string holding any bytes (not UTF-8, control characters, a lone surrogate…).
    STRING_BYTES.map(lambda b: b'{"tenantId":"%s"}' % b),
    st.tuples(st.sampled_from(FIELDS), STRING_BYTES).map(
        lambda kv: b'{"tenantId":"root","%s":"%s"}' % (kv[0].encode(), kv[1])
    ),
    # Arrays nested anywhere from harmless to far past the recursion limit, in a free-form field.
    st.integers(min_value=1, max_value=3000).map(nested),
)
CONTENT_TYPES = st.sampled_from(
    ["application/json"] * 4 + [None, "text/plain", "application/x-www-form-urlencoded"]
) | PRINTABLE.map(lambda t: f"application/json; {t}")


@settings(
    max_examples=300,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    path=st.sampled_from(PATHS) | st.sampled_from(PATHS) | PRINTABLE.map(lambda t: f"compute/{t}"),
    body=BODIES,
    content_type=CONTENT_TYPES,
    authorization=st.sampled_from(["root"] * 6 + [None, "Bearer bct_nope", "Basic x"])
    | st.just("root")
    | PRINTABLE,
    extra=st.lists(
        st.tuples(st.sampled_from(["Authorization", "X-Request-Id", "Accept", "X-Foo"]), PRINTABLE),
        max_size=2,
    ),
    verb=st.sampled_from(["POST"] * 8 + ["GET", "PUT", "DELETE"]),
)
def test_r2_no_input_yields_a_500(
    fuzz_daemon: Daemon,
    path: str,
    body: bytes,
    content_type: str | None,
    authorization: str | None,
    extra: list[tuple[str, str]],
    verb: str,
) -> None:
    """R2: random bodies, content types and headers on a few methods never answer 500."""
    connection = http.client.HTTPConnection("127.0.0.1", fuzz_daemon.port, timeout=10)
    try:
        connection.putrequest(verb, "/api/" + path.replace(" ", "%20"), skip_accept_encoding=True)
        if content_type is not None:
            connection.putheader("Content-Type", content_type)
        if authorization is not None:
            token = f"Bearer {fuzz_daemon.token}" if authorization == "root" else authorization
            connection.putheader("Authorization", token)
        for name, value in extra:
            connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        answer = response.read()
    finally:
        connection.close()
    assert response.status < 500, (response.status, answer)
    if response.getheader("Content-Type") == "application/json" and response.status >= 400:
        # The app answered (not aiohttp's own 400 for a malformed request): the one error shape.
        error = json.loads(answer)["error"]
        assert set(error) == SHAPE and error["requestId"] == response.getheader("X-Request-Id")


def test_r2_broken_chunked_bodies_are_not_a_500(fuzz_daemon: Daemon) -> None:
    """R2: a chunked body with a bad chunk size, or cut short, is answered 400, not 500."""
    head = (
        b"POST /api/compute/pools/list HTTP/1.1\r\nHost: x\r\n"
        b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n"
    )
    for tail in (b"zz\r\n{}\r\n0\r\n\r\n", b"ffff\r\n{}"):
        with socket.create_connection(("127.0.0.1", fuzz_daemon.port), timeout=10) as sock:
            sock.sendall(head + tail)
            if tail.startswith(b"ffff"):
                sock.shutdown(socket.SHUT_WR)  # the body is cut short
            answer = b""
            while chunk := sock.recv(65536):
                answer += chunk
        status = int(answer.split(b" ", 2)[1]) if answer else 0
        assert status < 500, answer
    assert "Traceback" not in fuzz_daemon.log.read_text()


def test_r2_bad_bodies_leave_no_traceback_in_the_log(fuzz_daemon: Daemon) -> None:
    """R2: the bodies that used to be 500s (bad UTF-8, 990 levels deep) log a 400, no traceback."""
    for raw in (b'{"tenantId":"\xff"}', nested(990)):
        connection = http.client.HTTPConnection("127.0.0.1", fuzz_daemon.port, timeout=10)
        connection.request("POST", "/api/compute/pools/create", raw, JSON_TYPE)
        assert connection.getresponse().status == 400
        connection.close()
    log = fuzz_daemon.log.read_text()
    assert "Traceback" not in log and '"status":500' not in log


# --- timeouts ---------------------------------------------------------------------------------


def _closed_after(sock: socket.socket, limit: float) -> float:
    """Seconds until the server closes sock (reads until EOF), at most `limit`."""
    started = time.monotonic()
    sock.settimeout(limit)
    while sock.recv(65536):
        pass
    return time.monotonic() - started


@pytest.fixture
def quick_daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = Daemon(tmp_path, "--header-timeout", "0.5", "--keepalive-timeout", "1.5")
    running.start()
    yield running
    running.kill()


def test_timeouts_half_sent_request_line_is_closed_within_the_header_timeout(
    quick_daemon: Daemon,
) -> None:
    """Idle and half-sent-header connections: half a request line or head, then silence, is closed
    within --header-timeout; so is a connection that sends nothing."""
    for partial in (b"POST /api/comp", b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-A: "):
        with socket.create_connection(("127.0.0.1", quick_daemon.port)) as sock:
            sock.sendall(partial)
            assert 0.4 < _closed_after(sock, 5) < 1.4
    with socket.create_connection(("127.0.0.1", quick_daemon.port)) as sock:
        assert _closed_after(sock, 5) < 1.4  # a connection that never sends a byte


def test_timeouts_idle_keepalive_connection_is_closed_after_the_keepalive_timeout(
    quick_daemon: Daemon,
) -> None:
    """Idle and half-sent-header connections: an idle kept-alive connection closes after
    --keepalive-timeout, not before; the header timeout starts again at a request's first byte."""
    request = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
    with socket.create_connection(("127.0.0.1", quick_daemon.port)) as sock:
        sock.sendall(request)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        time.sleep(0.8)  # idle longer than the header timeout: still open
        sock.sendall(request)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        assert 1.2 < _closed_after(sock, 5) < 2.5
    with socket.create_connection(("127.0.0.1", quick_daemon.port)) as sock:
        sock.sendall(request)
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.sendall(b"GET /hea")
        assert _closed_after(sock, 5) < 1.2


def test_timeouts_a_slow_body_is_not_a_header_timeout(quick_daemon: Daemon) -> None:
    """Idle and half-sent-header connections: the header timeout times the head only; a slow body
    still gets its answer."""
    body = b'{"tenantId":"root"}'
    head = (
        b"POST /api/compute/pools/list HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Authorization: Bearer " + quick_daemon.token.encode() + b"\r\n"
        b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", quick_daemon.port), timeout=5) as sock:
        sock.sendall(head + body[:5])
        time.sleep(0.8)
        sock.sendall(body[5:])
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")


async def test_r2_a_string_that_never_closes_is_refused_at_once(api: Api) -> None:
    """R2: a 128 KiB body of brackets and an unclosed string (quadratic for the depth scan's
    string pattern: 35 s of the event loop before the fix) is refused in one linear scan;
    the hang guard is generous and only there so a regression fails instead of hanging."""
    body = b"[" * 70 + b'"' + b'\\"' * 65_536
    status, answer, _ = await asyncio.wait_for(post(api, "compute/pools/list", body), 20)
    assert (status, answer["error"]["code"]) == (400, "INVALID_INPUT")
    assert "deeper than 64" in answer["error"]["message"]
    unclosed = b'{"tenantId": "' + b'\\"' * 65_536
    status, answer, _ = await asyncio.wait_for(post(api, "compute/pools/list", unclosed), 20)
    assert answer["error"]["message"] == "the body is not valid JSON"
