"""The node lifecycle at its edges (H1, H3, H4, H5, N4 of bookings): each case once failed."""

from pathlib import Path
from typing import Any

import msgspec

from shared.inventory import Inventory
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

replace = msgspec.structs.replace
A100_GPU5 = "GPU-62bda8cc-919d-7ce3-272e-7b8aa5da5524"  # seven 1g.10gb instances


async def agent_cycle(api: Api, node: dict[str, Any], inventory: Inventory) -> dict[str, Any]:
    """What the agent does: fetch the spec, apply what it may (a drain unit touching a booked
    GPU waits, H4), report the outcome."""
    headers = {"Authorization": f"Bearer {node['token']}"}
    response = await api.client.post(
        "/api/compute/nodes/spec", json={"nodeId": node["nodeId"]}, headers=headers
    )
    spec: dict[str, Any] = await response.json()
    booked = set(spec.get("bookedGpus", []))
    units = [
        {
            "id": u["id"],
            "status": "waiting-drain"
            if u.get("needs") == "drain" and booked & set(u.get("gpus", []))
            else "applied",
        }
        for u in spec["units"]
    ]
    response = await api.client.post(
        "/api/compute/nodes/report",
        json={
            "nodeId": node["nodeId"],
            "inventory": wire(inventory),
            "applied": {"version": spec["version"], "units": units},
        },
        headers=headers,
    )
    assert response.status == 200
    return spec


async def report(api: Api, node: dict[str, Any], inventory: Inventory) -> None:
    response = await api.client.post(
        "/api/compute/nodes/report",
        json={"nodeId": node["nodeId"], "inventory": wire(inventory)},
        headers={"Authorization": f"Bearer {node['token']}"},
    )
    assert response.status == 200


async def reserve(api: Api, pool: str, resources: dict[str, int], **extra: Any) -> Any:
    return await api.ok(
        "compute/reservations/create",
        {"tenantId": "root", "poolId": pool, "resources": resources, **extra},
    )


async def test_h4_a_replicas_change_made_while_booked_is_taken_once_idle(
    api: Api, db: Path
) -> None:
    """H4: raising replicas while a slot is booked holds the GPUs and the agent waits; once the
    booking ends and its host releases it (D7) the node is rendered again without it, the agent applies, the GPUs return."""
    l40s = recorded("l40s-node-03")
    pool, token = await pool_with_token(
        api,
        gpuModel="L40S",
        sharing="timeslice",
        policy={"replicas": 4},
        ownerQuota={"gpu.slot": 100},
    )
    node = await joined(api, token, l40s)
    booked = await reserve(api, pool, {"gpu.slot": 1})
    assert booked["state"] == "placed"
    await api.ok(
        "compute/pools/update", {"tenantId": "root", "poolId": pool, "policy": {"replicas": 8}}
    )
    one_pass(db)
    await agent_cycle(api, node, l40s)
    await api.ok("compute/reservations/end", {"tenantId": "root", "reservationId": booked["id"]})
    await host_confirms(api, node, l40s)  # D7: released on the host
    for _ in range(3):  # bounded: passes and agent cycles
        one_pass(db)
        spec = await agent_cycle(api, node, l40s)
    assert spec["bookedGpus"] == []
    assert execute(db, "SELECT sum(held) FROM node_devices") == [(0,)]
    assert (await reserve(api, pool, {"gpu.slot": 1}))["state"] == "placed"


async def test_h1_a_never_ready_node_back_from_lost_is_configuring(api: Api, db: Path) -> None:
    """H1, H2: a node that was still configuring (a unit pending its reboot) when it was lost is
    configuring when it reports again, not ready, and nothing is placed on it."""
    pool, token = await pool_with_token(api, policy={"hugepages": {"1Gi": 16}})
    dgx = recorded("dgx-h100-01")
    node = await joined(api, token, dgx, applied=False)
    spec = await apply_spec(api, node, dgx)
    kernel = next(u["id"] for u in spec["units"] if u["kind"] == "kernel-args")
    other = twin("dgx-h100-01", 42)
    fresh = await joined(api, token, other, applied=False)
    await apply_spec(api, fresh, other, **{kernel: "pending-reboot"})
    execute(
        db,
        "UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z' WHERE id = ?",
        (fresh["nodeId"],),
    )
    assert one_pass(db).nodes_lost == 1
    await apply_spec(api, fresh, other, **{kernel: "pending-reboot"})
    view = await api.ok("compute/nodes/get", {"tenantId": "root", "nodeId": fresh["nodeId"]})
    assert (view["state"], view["schedulable"], view["appliedVersion"]) == (
        "configuring",
        False,
        None,
    )
    await api.ok(
        "compute/nodes/cordon", {"tenantId": "root", "nodeId": node["nodeId"], "reason": "x"}
    )  # only the configuring node could take it
    assert (await reserve(api, pool, {"gpu": 1}))["state"] == "pending"


async def test_h4_applied_with_the_inventory_from_before_the_apply(api: Api, db: Path) -> None:
    """H4: an agent that reports mig/apply applied with the inventory it took before applying
    never gets the old instances of the repartitioned GPU handed back to the placer: they stay
    held until an inventory shows the new layout."""
    pool, token = await pool_with_token(
        api, gpuModel="A100", sharing="mig", ownerQuota={"gpu.mig": 100}
    )
    node = await joined(api, token, recorded("dgx-a100-02"))
    await api.ok(
        "compute/pools/update",
        {"tenantId": "root", "poolId": pool, "policy": {"migLayout": {A100_GPU5: ["7g.80gb"]}}},
    )
    one_pass(db)
    await apply_spec(api, node, recorded("dgx-a100-02"))  # the pre-apply inventory
    for _ in range(5):
        await reserve(api, pool, {"gpu.mig": 1}, migProfile="1g.10gb")
    on_gpu5 = "SELECT count(*) FROM node_devices WHERE gpu_uuid = ? AND allocated = 1"
    assert execute(db, on_gpu5, (A100_GPU5,)) == [(0,)]


async def test_h5_an_unhealthy_booking_stays_flagged_after_its_node_was_lost(
    api: Api, db: Path
) -> None:
    """H5: a booking on an unhealthy GPU keeps its GpuUnhealthy flag when its node was lost
    and came back with the GPU still unhealthy."""
    pool, token = await pool_with_token(api)
    dgx = recorded("dgx-h100-01")
    node = await joined(api, token, dgx)
    first = await reserve(api, pool, {"gpu": 1})
    [(uuid,)] = execute(
        db, "SELECT gpu_uuid FROM node_devices WHERE reservation_id = ?", (first["id"],)
    )
    sick = replace(
        dgx,
        gpus=[
            replace(g, health="unhealthy", health_reasons=["xid:79"]) if g.uuid == uuid else g
            for g in dgx.gpus
        ],
    )
    await report(api, node, sick)
    get = {"tenantId": "root", "reservationId": first["id"]}
    assert (await api.ok("compute/reservations/get", get))["reason"] == "GpuUnhealthy"
    execute(db, "UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z'")
    one_pass(db)
    assert (await api.ok("compute/reservations/get", get))["reason"] == "NodeLost"
    await report(api, node, sick)
    assert (await api.ok("compute/reservations/get", get))["reason"] == "GpuUnhealthy"


async def test_h3_a_removed_draining_node_is_not_drained_after_its_removal(
    api: Api, db: Path
) -> None:
    """H3: a node removed while draining gets no node.drained after its node.removed."""
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    await reserve(api, pool, {"gpu": 1})
    body = {"tenantId": "root", "nodeId": node["nodeId"]}
    await api.ok("compute/nodes/drain", {**body, "reason": "x"})
    await api.ok("compute/nodes/remove", {**body, "force": True})
    one_pass(db)
    events = await api.ok("compute/events/list", {"tenantId": "root"})
    types = [e["type"] for e in events["items"] if e["type"].startswith("node.")]
    assert types[-2:] == ["node.draining", "node.removed"]


async def test_a_lost_node_joining_again_clears_node_lost(api: Api, db: Path) -> None:
    """A lost node that joins again (rather than reports) is back: its bookings lose NodeLost."""
    pool, token = await pool_with_token(api)
    dgx = recorded("dgx-h100-01")
    await joined(api, token, dgx)
    booked = await reserve(api, pool, {"gpu": 1})
    execute(db, "UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z'")
    one_pass(db)
    status, again = await join(api, token, dgx)
    assert status == 200
    await apply_spec(api, dict(again), dgx)
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": booked["id"]}
    )
    assert (got["state"], got["reason"]) == ("placed", None)
