"""H3, H5, H7 through the API: the owner's verbs, the fleet view, the recorded sick hosts."""

from pathlib import Path
from typing import Any

from tests.conftest import Api, execute
from tests.nodes import (
    apply_spec,
    host_confirms,
    join,
    joined,
    one_pass,
    pool_with_token,
    recorded,
    twin,
    wire,
)


def at(node: dict[str, Any], **body: Any) -> dict[str, Any]:
    return {"tenantId": "root", "nodeId": node["nodeId"], **body}


async def reserve(api: Api, pool: str, resources: dict[str, int]) -> Any:
    return await api.ok(
        "compute/reservations/create",
        {"tenantId": "root", "poolId": pool, "resources": resources},
    )


async def state_of(api: Api, reservation: dict[str, Any]) -> tuple[str, str | None]:
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": reservation["id"]}
    )
    return got["state"], got["reason"]


async def event_types(api: Api, *types: str) -> list[str]:
    found = await api.ok("compute/events/list", {"tenantId": "root", "types": list(types)})
    return [e["type"] for e in found["items"]]


async def test_h3_cordon_and_uncordon(api: Api, db: Path) -> None:
    """H3: cordon makes the node unschedulable with its reason (node.cordoned), bookings run
    on; cordoning again changes nothing; uncordon undoes it (node.uncordoned), once."""
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    running = await reserve(api, pool, {"gpu": 1})
    view = await api.ok("compute/nodes/cordon", at(node, reason="bad fan"))
    assert (view["schedulable"], view["cordon"]["reason"], view["state"]) == (
        False,
        "bad fan",
        "ready",
    )
    again = await api.ok("compute/nodes/cordon", at(node, reason="bad fan"))
    assert again["cordon"] == view["cordon"]
    assert (await reserve(api, pool, {"gpu": 1}))["state"] == "pending"
    assert await state_of(api, running) == ("placed", None)
    back = await api.ok("compute/nodes/uncordon", at(node))
    assert (back["schedulable"], back["cordon"]) == (True, None)
    await api.ok("compute/nodes/uncordon", at(node))
    assert await event_types(api, "node.cordoned", "node.uncordoned") == [
        "node.cordoned",
        "node.uncordoned",
    ]


async def test_h3_drain_waits_for_bookings_then_drained(api: Api, db: Path) -> None:
    """H3, D7: drain cordons and waits: draining while a booking is live, and while it is
    releasing once ended; drained (node.drained) at the first pass after the host confirms
    the release; a node with nothing booked is drained at once."""
    pool, token = await pool_with_token(api)
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    idle = await joined(api, token, twin("dgx-h100-01", 5))
    running = await reserve(api, pool, {"gpu": 8})
    assert (await api.ok("compute/nodes/drain", at(idle, reason="rma")))["drain"]["state"] == (
        "drained"
    )
    view = await api.ok("compute/nodes/drain", at(node, reason="kernel update"))
    assert (view["drain"]["state"], view["drain"]["reason"], view["schedulable"]) == (
        "draining",
        "kernel update",
        False,
    )
    assert view["drain"]["deadline"] is None
    one_pass(db)
    assert (await api.ok("compute/nodes/get", at(node)))["drain"]["state"] == "draining"
    await api.ok("compute/reservations/end", {"tenantId": "root", "reservationId": running["id"]})
    one_pass(db)
    releasing = await api.ok("compute/nodes/get", at(node))
    assert releasing["drain"]["state"] == "draining"
    assert [b["delivery"] for b in releasing["bookings"]] == ["releasing"]
    await host_confirms(api, node, inventory)
    one_pass(db)
    assert (await api.ok("compute/nodes/get", at(node)))["drain"]["state"] == "drained"
    assert (await reserve(api, pool, {"gpu": 1}))["state"] == "pending"
    assert (await api.ok("compute/nodes/uncordon", at(node)))["drain"] is None
    assert await event_types(api, "node.draining", "node.drained") == [
        "node.draining",
        "node.drained",
        "node.draining",
        "node.drained",
    ]


async def test_h3_at_the_deadline_what_is_left_ends_with_node_drained(api: Api, db: Path) -> None:
    """H3, D7: at the drain's deadline the remaining reservations end with NodeDrained, their
    quota goes back at once and their bookings once the host confirms the release."""
    pool, token = await pool_with_token(api)
    inventory = recorded("dgx-h100-01")
    node = await joined(api, token, inventory)
    running = await reserve(api, pool, {"gpu": 2})
    await api.ok("compute/nodes/drain", at(node, reason="swap", deadlineSeconds=0))
    one_pass(db)
    assert await state_of(api, running) == ("ended", "NodeDrained")
    assert execute(db, "SELECT used FROM quotas WHERE resource = 'gpu'") == [(0,)]
    assert (await api.ok("compute/nodes/get", at(node)))["drain"]["state"] == "draining"
    await host_confirms(api, node, inventory)
    one_pass(db)
    view = await api.ok("compute/nodes/get", at(node))
    assert view["drain"]["state"] == "drained"
    assert not [d for d in view["devices"] if d["allocated"]]
    assert execute(db, "SELECT used FROM quotas WHERE resource = 'gpu'") == [(0,)]


async def test_h3_remove_and_force_and_the_host_joins_another_pool(api: Api, db: Path) -> None:
    """H3: remove is INVALID_STATE while a booking is live; force ends it with NodeRemoved,
    deletes rows and atoms, revokes the credential (401) and frees the machine identity, so
    the host joins another pool with a new token; removing again answers the same."""
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    running = await reserve(api, pool, {"gpu": 1})
    error = await api.err("compute/nodes/remove", at(node), "INVALID_STATE", "nodeId")
    assert error["details"]["reservations"] == [running["id"]]
    assert await api.ok("compute/nodes/remove", at(node, force=True)) == {"removed": True}
    assert await state_of(api, running) == ("ended", "NodeRemoved")
    assert execute(db, "SELECT count(*) FROM node_resources") == [(0,)]
    assert execute(db, "SELECT count(*) FROM node_devices") == [(0,)]
    assert await api.ok("compute/nodes/remove", at(node)) == {"removed": True}
    await api.err("compute/nodes/get", at(node), "NOT_FOUND", "nodeId")
    listed = await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool})
    assert listed["items"] == []
    response = await api.client.post(
        "/api/compute/nodes/report",
        json={"nodeId": node["nodeId"], "inventory": wire(recorded("dgx-h100-01"))},
        headers={"Authorization": f"Bearer {node['token']}"},
    )
    assert response.status == 401
    other, other_token = await pool_with_token(api)
    moved = await joined(api, other_token, recorded("dgx-h100-01"))
    assert moved["poolId"] == other and moved["nodeId"] != node["nodeId"]
    assert await event_types(api, "node.removed") == ["node.removed"]


async def test_h3_the_verbs_are_owner_only(api: Api, db: Path) -> None:
    """H3: an offered tenant, or a stranger, gets NOT_FOUND from each verb."""
    await api.tenant("acme")
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    await api.offer(pool, "acme", {"gpu": 2})
    acme = await api.token_for("acme")
    body = {"tenantId": "acme", "nodeId": node["nodeId"]}
    for path, extra in (
        ("compute/nodes/cordon", {"reason": "x"}),
        ("compute/nodes/uncordon", {}),
        ("compute/nodes/drain", {"reason": "x"}),
        ("compute/nodes/remove", {"force": True}),
    ):
        await api.err(path, {**body, **extra}, "NOT_FOUND", "nodeId", acme)
    assert (await api.ok("compute/nodes/get", at(node)))["schedulable"] is True


async def test_h7_the_fleet_view_pages_through_every_owned_pool(api: Api) -> None:
    """H7, B1: nodes/list without poolId lists every node of every pool the tenant owns, in
    id order, a page at a time; states filters."""
    first, token = await pool_with_token(api)
    second, token2 = await pool_with_token(api, gpuModel="H200")
    ids = {
        (await joined(api, token, recorded("dgx-h100-01")))["nodeId"],
        (await joined(api, token, twin("dgx-h100-01", 3)))["nodeId"],
        (await joined(api, token2, recorded("hgx-h200-01"), applied=False))["nodeId"],
    }
    seen: list[str] = []
    cursor: dict[str, str] = {}
    for _ in range(5):  # bounded
        page = await api.ok("compute/nodes/list", {"tenantId": "root", "limit": 2, **cursor})
        seen += [n["id"] for n in page["items"]]
        if page["next"] is None:
            break
        cursor = {"cursor": page["next"]}
    assert seen == sorted(ids)
    configuring = await api.ok(
        "compute/nodes/list", {"tenantId": "root", "states": ["configuring"]}
    )
    assert [(n["poolId"], n["state"]) for n in configuring["items"]] == [(second, "configuring")]
    await api.tenant("acme")
    await api.offer(first, "acme", {"gpu": 2})
    acme = await api.token_for("acme")
    assert (await api.ok("compute/nodes/list", {"tenantId": "acme"}, acme))["items"] == []


async def test_h5_the_recorded_sick_hosts(api: Api, db: Path) -> None:
    """H5: on dgx-h100-sick GPU 3 (XID 79) and GPU 5 (a row remap pending) are unhealthy and
    never placed, GPU 6 (XID 13, an application error) is healthy; on hgx-h200-ecc GPU 0
    (uncorrected ECC) is unhealthy and GPU 7 (lost) offers nothing."""
    pool, token = await pool_with_token(api)
    sick = recorded("dgx-h100-sick")
    node = await joined(api, token, sick)
    view = await api.ok("compute/nodes/get", at(node))
    health = {g["index"]: (g["health"], g["healthReason"]) for g in view["gpus"]}
    assert health[3] == ("unhealthy", "xid:79")
    assert health[5] == ("unhealthy", "row_remap_pending")
    assert health[6] == ("healthy", None)
    assert [i for i, (h, _) in health.items() if h != "healthy"] == [3, 5]
    placed = [await reserve(api, pool, {"gpu": 1}) for _ in range(8)]
    assert [r["state"] for r in placed].count("placed") == 6
    bad = {sick.gpus[3].uuid, sick.gpus[5].uuid}
    booked = {u for (u,) in execute(db, "SELECT gpu_uuid FROM node_devices WHERE allocated = 1")}
    assert not booked & bad and sick.gpus[6].uuid in booked
    h200, h200_token = await pool_with_token(api, gpuModel="H200")
    ecc = recorded("hgx-h200-ecc")
    status, answer = await join(api, h200_token, ecc)
    assert status == 200, answer
    gpus = {
        g["index"]: g["health"] for g in (await api.ok("compute/nodes/get", at(answer)))["gpus"]
    }
    assert (gpus[0], gpus[7]) == ("unhealthy", "unhealthy")
    assert [i for i, h in gpus.items() if h != "healthy"] == [0, 7]
    await apply_spec(api, answer, ecc)  # ready: what it sells is its healthy GPUs
    ledger = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": h200})
    gpu_row = next(r for r in ledger["items"] if r["resource"] == "gpu")
    # GPU 7 was lost before the agent ever saw it: no name, no family, no atom
    assert (gpu_row["total"], gpu_row["schedulable"]) == (7, 6)
    events = await event_types(api, "node.gpuUnhealthy")
    assert events == ["node.gpuUnhealthy"] * 4
