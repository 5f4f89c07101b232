"""F9: small heartbeats. A report carries the whole inventory or the digest of the one the
control plane holds; a digest that matches is a report of that inventory, one that does not is
a heartbeat that asks for the whole inventory."""

import time
from typing import Any

from controlplane.api.keys import RUNTIME
from controlplane.storage.db import timestamp
from tests.conftest import Api, execute, snapshot
from tests.nodes import join, pool_with_token, recorded, wire
from tests.statements import writer_statements

OTHER_DIGEST = "sha256:" + "0" * 64


async def post(api: Api, node: dict[str, Any], body: dict[str, Any]) -> tuple[int, Any]:
    response = await api.client.post(
        "/api/compute/nodes/report",
        json={"nodeId": node["nodeId"], **body},
        headers={"Authorization": f"Bearer {node['token']}"},
    )
    return response.status, await response.json()


async def spec_units(api: Api, node: dict[str, Any]) -> dict[str, Any]:
    response = await api.client.post(
        "/api/compute/nodes/spec",
        json={"nodeId": node["nodeId"]},
        headers={"Authorization": f"Bearer {node['token']}"},
    )
    spec = await response.json()
    units = [{"id": u["id"], "status": "applied"} for u in spec["units"]]
    return {"version": spec["version"], "units": units}


async def test_f9_a_digest_report_is_a_heartbeat_that_decodes_and_writes_no_inventory(
    api: Api, db: Any
) -> None:
    """F9: the join answers the digest of the inventory it stored; a digest report carrying
    it applies the spec (the node turns ready) without touching the inventory, and once
    nothing else is new writes nothing at all, only stamping the node alive; a digest that
    is not the one held is a heartbeat that changes nothing and answers inventoryWanted."""
    _, token = await pool_with_token(api)
    inventory = recorded("dgx-h100-01")
    status, node = await join(api, token, inventory)
    assert status == 200, node
    digest = node["inventoryDigest"]
    assert digest.startswith("sha256:") and len(digest) == len(OTHER_DIGEST)
    stored = execute(db, "SELECT inventory, inventory_rev FROM nodes")

    applied = await spec_units(api, node)
    status, answer = await post(api, node, {"inventoryDigest": digest, "applied": applied})
    assert status == 200, answer
    assert answer["inventoryDigest"] == digest and answer["inventoryWanted"] is False
    view = await api.ok("compute/nodes/get", {"tenantId": "root", "nodeId": node["nodeId"]})
    assert view["state"] == "ready"
    assert execute(db, "SELECT inventory, inventory_rev FROM nodes") == stored

    status, full = await post(api, node, {"inventory": wire(inventory), "applied": applied})
    assert status == 200 and full == answer  # the whole inventory, unchanged: the same answer

    liveness = api.client.app[RUNTIME].liveness
    for sent, wanted in ((digest, False), (OTHER_DIGEST, True)):
        before, rows = timestamp(time.time()), snapshot(db)
        with writer_statements(api.client.app[RUNTIME].db) as statements:
            status, answer = await post(api, node, {"inventoryDigest": sent, "applied": applied})
        assert status == 200, answer
        assert answer == {
            "specVersion": full["specVersion"],
            "inventoryDigest": digest,
            "inventoryWanted": wanted,
        }
        assert statements == []  # no transaction at all
        assert snapshot(db) == rows
        seen = liveness.last_seen(node["nodeId"])
        assert seen is not None and seen >= before  # a heartbeat all the same


async def test_f9_a_report_carries_exactly_one_of_inventory_and_digest(api: Api, db: Any) -> None:
    """F9: a report with both, or neither, is INVALID_INPUT naming inventoryDigest and changes
    nothing; the OpenAPI document shows the field and that every answer carries the digest and
    inventoryWanted."""
    _, token = await pool_with_token(api)
    inventory = recorded("dgx-h100-01")
    status, node = await join(api, token, inventory)
    assert status == 200, node
    rows = snapshot(db)
    for body in ({}, {"inventory": wire(inventory), "inventoryDigest": node["inventoryDigest"]}):
        status, answer = await post(api, node, body)
        assert status == 400, answer
        assert answer["error"]["code"] == "INVALID_INPUT"
        assert answer["error"]["details"]["field"] == "inventoryDigest"
    assert snapshot(db) == rows
    document = await (await api.client.get("/api/openapi.json")).json()
    schemas = document["components"]["schemas"]
    assert "inventoryDigest" in schemas["NodesReport"]["properties"]
    assert "inventory" not in schemas["NodesReport"].get("required", [])
    assert {"inventoryDigest", "inventoryWanted"} <= set(schemas["Reported"]["required"])
    assert "inventoryDigest" in schemas["NodeJoined"]["properties"]
