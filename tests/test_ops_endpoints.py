"""Health, readiness, metrics, the OpenAPI document, request ids and the log line."""

import time
from typing import Any

from controlplane.api.keys import RUNTIME
from controlplane.api.ops import READY_WITHIN_S, Readiness
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


class Unreachable:
    """A store whose database does not answer (what a read raises then)."""

    async def read_short(self, fn: Any) -> Any:
        raise OSError("connection refused")


async def test_f4_readiness_is_the_daemons_last_check(api: Api) -> None:
    """F4: what /readyz answers is the daemon's own last check, not a read per probe: ready
    after a check that found every migration, unavailable once a check fails or the last good
    one is older than READY_WITHIN_S, ready again after a check passes."""
    store = api.client.app[RUNTIME].db
    readiness = Readiness()
    assert readiness.state() == "unavailable"  # no check yet
    await readiness.check(store)
    assert readiness.state() == "ready"
    await readiness.check(Unreachable())  # type: ignore[arg-type]
    assert readiness.state() == "unavailable"
    await readiness.check(store)
    assert readiness.state() == "ready"
    readiness.checked_at = time.monotonic() - READY_WITHIN_S - 1  # a check that hangs
    assert readiness.state() == "unavailable"


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
    root = {"Authorization": f"Bearer {api.token}"}
    metrics = await (await api.client.get("/metrics", headers=root)).text()
    assert 'bc_http_requests_total{method="/api/compute/pools/list",status="401"} 1.0' in metrics
