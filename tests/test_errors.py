"""One error body shape over every error path: {"error": {code, message, details, requestId}}."""

import io
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestClient

from controlplane.api.keys import METRICS
from controlplane.api.middleware import request_middleware
from controlplane.metrics import Metrics
from tests.conftest import Api

SHAPE = {"code", "message", "details", "requestId"}


def assert_shape(status: int, body: dict[str, Any], headers: Any, code: str, expected: int) -> None:
    assert status == expected, body
    assert set(body) == {"error"}
    assert set(body["error"]) == SHAPE
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["details"], dict)
    assert body["error"]["requestId"] == headers["X-Request-Id"]


async def post(
    api: Api, path: str, body: Any = None, token: str | None = "root", raw: Any = None
) -> tuple[int, Any, Any]:
    headers = {}
    if token == "root":
        headers["Authorization"] = f"Bearer {api.token}"
    elif token is not None:
        headers["Authorization"] = token
    if raw is not None:
        response = await api.client.post(path, data=raw, headers=headers)
    else:
        response = await api.client.post(path, json=body, headers=headers)
    return response.status, await response.json(), response.headers


async def test_error_shape_on_every_path(api: Api) -> None:
    """401, 400, 413, 403, 404, 409 CONFLICT, 409 INVALID_STATE and 405 share one body shape."""
    await api.tenant("acme")
    acme = await api.token_for("acme")
    site = await api.site()
    pool = (await api.pool(site, idempotencyKey="k"))["id"]
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    list_path = "/api/compute/pools/list"
    cases = [
        (list_path, {"tenantId": "root"}, None, None, "UNAUTHENTICATED", 401),
        (list_path, {"tenantId": "root"}, "Basic abc", None, "UNAUTHENTICATED", 401),
        (list_path, {"tenantId": "root"}, "Bearer bct_unknown", None, "UNAUTHENTICATED", 401),
        (list_path, None, "root", b"{", "INVALID_INPUT", 400),
        (list_path, {"tenantId": "root", "x": 1}, "root", None, "INVALID_INPUT", 400),
        (
            list_path,
            None,
            "root",
            io.BytesIO(b'{"a":"' + b"x" * (1024 * 1024 + 1) + b'"}'),
            "INVALID_INPUT",
            413,
        ),
        (list_path, {"tenantId": "root"}, f"Bearer {acme}", None, "PERMISSION_DENIED", 403),
        ("/api/compute/pools/nope", {}, "root", None, "NOT_FOUND", 404),
        (
            "/api/compute/pools/get",
            {"tenantId": "acme", "poolId": pool},
            f"Bearer {acme}",
            None,
            "NOT_FOUND",
            404,
        ),
        (
            "/api/compute/pools/create",
            {"tenantId": "root", "siteId": site, "class": "vps-host", "idempotencyKey": "k"},
            "root",
            None,
            "CONFLICT",
            409,
        ),
        (
            "/api/compute/pools/offer",
            {"tenantId": "root", "poolId": pool, "toTenantId": "acme", "quota": {"gpu": 1}},
            "root",
            None,
            "INVALID_STATE",
            409,
        ),
    ]
    for path, body, token, raw, code, status in cases:
        got_status, got_body, headers = await post(api, path, body, token, raw)
        assert_shape(got_status, got_body, headers, code, status)
    response = await api.client.get(list_path)
    assert_shape(response.status, await response.json(), response.headers, "INVALID_INPUT", 405)


async def test_internal_errors_say_nothing_internal(aiohttp_client: Any) -> None:
    """An unexpected exception is 500 INTERNAL with a request id and none of its text."""

    async def broken(request: web.Request) -> web.Response:
        raise RuntimeError("secret database path /var/lib/x")

    app = web.Application(middlewares=[request_middleware])
    app[METRICS] = Metrics.create()
    app.router.add_post("/api/broken", broken)
    client: TestClient = await aiohttp_client(app)
    response = await client.post("/api/broken", json={})
    body = await response.json()
    assert_shape(response.status, body, response.headers, "INTERNAL", 500)
    assert "secret" not in str(body)
