"""Health, readiness, metrics, the OpenAPI document, request ids and the log line."""

from typing import Any

from controlplane.api.routes import ALL_METHODS
from controlplane.config import Config
from tests.conftest import Api


async def test_healthz_and_readyz(api: Api) -> None:
    """/healthz is alive; /readyz says ready once every migration is applied."""
    health = await api.client.get("/healthz")
    assert health.status == 200
    ready = await api.client.get("/readyz")
    assert ready.status == 200
    assert (await ready.json())["status"] == "ready"


async def test_openapi_lists_every_method_with_its_schema(api: Api, config: Config) -> None:
    """GET /api/openapi.json is OpenAPI 3.1 generated from the request schemas."""
    response = await api.client.get("/api/openapi.json")
    document: dict[str, Any] = await response.json()
    assert document["openapi"] == "3.1.0"
    paths = {m.path for m in ALL_METHODS}
    assert set(document["paths"]) == paths
    assert "/api/compute/pools/create" in paths
    create = document["components"]["schemas"]["PoolsCreate"]
    assert create["additionalProperties"] is False
    assert set(create["required"]) == {"tenantId", "siteId", "class"}
    assert create["properties"]["siteId"]["pattern"] == r"^site_[0-9a-hjkmnp-tv-z]{26,52}(?!\n)$"
    assert set(create["properties"]["class"]["enum"]) == {
        "metal-host",
        "metal-dedicated",
        "vps-host",
        "provider",
    }
    offer = document["components"]["schemas"]["PoolsOffer"]
    assert offer["properties"]["priority"]["minimum"] == -1000
    assert offer["properties"]["priority"]["maximum"] == 1000


async def test_request_id_in_header_error_body_and_metrics(api: Api) -> None:
    """Every answer carries X-Request-Id; error bodies repeat it; /metrics counts requests."""
    response = await api.client.post(
        "/api/compute/pools/list",
        json={"tenantId": "root"},
        headers={"Authorization": "Bearer nope"},
    )
    body = await response.json()
    assert response.headers["X-Request-Id"] == body["error"]["requestId"]
    assert body["error"]["requestId"].startswith("req_")
    metrics = await (await api.client.get("/metrics")).text()
    assert 'bc_http_requests_total{method="/api/compute/pools/list",status="401"} 1.0' in metrics
