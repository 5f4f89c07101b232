"""H1, H2, H4, H5, H6 through the API: capacity that hosts really have, configured and healthy."""

from pathlib import Path
from typing import Any

import msgspec

from tests.conftest import Api, execute
from tests.nodes import (
    apply_spec,
    host_confirms,
    joined,
    one_pass,
    pool_with_token,
    recorded,
    twin,
    wire,
)

replace = msgspec.structs.replace
A100_GPU5 = "GPU-62bda8cc-919d-7ce3-272e-7b8aa5da5524"  # seven 1g.10gb instances


async def node_view(api: Api, node: dict[str, Any]) -> Any:
    return await api.ok("compute/nodes/get", {"tenantId": "root", "nodeId": node["nodeId"]})


async def reserve(api: Api, pool: str, resources: dict[str, int], **extra: Any) -> Any:
    return await api.ok(
        "compute/reservations/create",
        {"tenantId": "root", "poolId": pool, "resources": resources, **extra},
    )


async def report(api: Api, node: dict[str, Any], inventory: Any) -> None:
    response = await api.client.post(
        "/api/compute/nodes/report",
        json={"nodeId": node["nodeId"], "inventory": wire(inventory)},
        headers={"Authorization": f"Bearer {node['token']}"},
    )
    assert response.status == 200, await response.json()


def ledger_of(capacity: Any) -> dict[str, tuple[int, ...]]:
    return {
        r["resource"]: (r["total"], r["schedulable"], r["allocated"], r["available"])
        for r in capacity["items"]
    }


async def test_h1_a_node_is_configuring_until_its_spec_is_applied(api: Api, db: Path) -> None:
    """H1, H2: a joined node whose agent has applied nothing (as with --dry-run) is configuring
    and never placed; once its agent reports every unit applied it is ready, and the pending
    reservation is placed at the next pass."""
    pool, token = await pool_with_token(api, policy={"hugepages": {"2Mi": 512}})
    node = await joined(api, token, recorded("dgx-h100-01"), applied=False)
    view = await node_view(api, node)
    assert (view["state"], view["schedulable"], view["appliedVersion"]) == (
        "configuring",
        False,
        None,
    )
    assert view["stateReason"] == "waiting for the agent to apply its NodeSpec"
    waiting = await reserve(api, pool, {"gpu": 1})
    assert waiting["state"] == "pending"
    one_pass(db)
    assert (await node_view(api, node))["state"] == "configuring"
    spec = await apply_spec(api, node, recorded("dgx-h100-01"))
    assert spec["units"], "the hugepages policy gives the spec units"
    view = await node_view(api, node)
    assert (view["state"], view["schedulable"], view["appliedVersion"]) == (
        "ready",
        True,
        spec["version"],
    )
    one_pass(db)
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": waiting["id"]}
    )
    assert got["state"] == "placed"


async def test_h1_a_failed_unit_makes_a_ready_node_configuring_with_its_id(
    api: Api, db: Path
) -> None:
    """H1: a unit that fails on a ready node makes it configuring with the failed unit ids as
    the reason; its live bookings run on; the next clean apply makes it ready again."""
    pool, token = await pool_with_token(api, policy={"hugepages": {"2Mi": 512}})
    node = await joined(api, token, recorded("dgx-h100-01"))
    held = await reserve(api, pool, {"gpu": 1})
    assert held["state"] == "placed"
    spec = await apply_spec(api, node, recorded("dgx-h100-01"))
    broken = spec["units"][0]["id"]
    await apply_spec(api, node, recorded("dgx-h100-01"), **{broken: "failed"})
    view = await node_view(api, node)
    assert view["state"] == "configuring" and view["stateReason"] == f"units failed: {broken}"
    assert (await reserve(api, pool, {"gpu": 1}))["state"] == "pending"
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": held["id"]}
    )
    assert got["state"] == "placed"  # live bookings run on
    await apply_spec(api, node, recorded("dgx-h100-01"))
    assert (await node_view(api, node))["state"] == "ready"


async def test_h1_a_unit_needing_a_reboot(api: Api) -> None:
    """H1: pending-reboot keeps a new node configuring, but leaves a ready node ready with
    pendingReboot true."""
    _, token = await pool_with_token(api, policy={"hugepages": {"1Gi": 16}})
    node = await joined(api, token, recorded("dgx-h100-01"), applied=False)
    spec = await apply_spec(api, node, recorded("dgx-h100-01"))  # ready first
    kernel = next(u["id"] for u in spec["units"] if u["kind"] == "kernel-args")
    fresh = await joined(api, token, twin("dgx-h100-01", 99), applied=False)
    for target in (node, fresh):
        await apply_spec(api, target, recorded("dgx-h100-01"), **{kernel: "pending-reboot"})
    ready = await node_view(api, node)
    assert (ready["state"], ready["pendingReboot"]) == ("ready", True)
    new = await node_view(api, fresh)
    assert (new["state"], new["pendingReboot"]) == ("configuring", True)
    assert new["stateReason"] == f"pending reboot: {kernel}"


async def test_h2_h6_the_ledger_on_a_pool_with_offers(api: Api) -> None:
    """H6: total over every node, schedulable over ready schedulable nodes, allocated booked,
    available = schedulable not booked, offered = what was sold to other tenants (owner only);
    a cordon takes the node out of schedulable but not out of total (H2)."""
    await api.tenant("acme")
    pool, token = await pool_with_token(
        api,
        policy={"hostReserve": {"vcpu": 24, "memoryGiB": 0}},
        ownerQuota={"gpu": 100, "vcpu": 1000},
    )
    node = await joined(api, token, recorded("dgx-h100-01"))
    # a second host, configuring: in total, not schedulable
    await joined(api, token, twin("dgx-h100-01", 77), applied=False)
    await api.offer(pool, "acme", {"gpu": 4, "vcpu": 64})
    await reserve(api, pool, {"gpu": 2, "vcpu": 16})
    body = {"tenantId": "root", "poolId": pool}
    owner = await api.ok("compute/pools/capacity", body)
    assert ledger_of(owner)["gpu"] == (16, 8, 2, 6)
    assert ledger_of(owner)["vcpu"] == (400, 200, 16, 184)
    assert {r["resource"]: r["offered"] for r in owner["items"]}["gpu"] == 4
    assert {r["resource"]: r["offered"] for r in owner["items"]}["vcpu"] == 64
    assert await api.ok("compute/capacity/byPool", body) == owner
    acme = await api.token_for("acme")
    seen = await api.ok("compute/pools/capacity", {"tenantId": "acme", "poolId": pool}, acme)
    assert all("offered" not in r for r in seen["items"])
    assert ledger_of(seen) == ledger_of(owner)
    await api.ok(
        "compute/nodes/cordon", {"tenantId": "root", "nodeId": node["nodeId"], "reason": "x"}
    )
    cordoned = ledger_of(await api.ok("compute/pools/capacity", body))
    assert cordoned["gpu"] == (16, 0, 2, 0)


async def test_h4_gpus_about_to_be_repartitioned_are_never_placed(api: Api, db: Path) -> None:
    """H4: a migLayout change renders a drain-gated unit; from the render on its GPU's atoms
    are held, so a reservation arriving before the agent applies it is never placed there;
    once the unit is reported applied they return."""
    pool, token = await pool_with_token(
        api, gpuModel="A100", sharing="mig", ownerQuota={"gpu.mig": 100}
    )
    node = await joined(api, token, recorded("dgx-a100-02"))
    update = {"tenantId": "root", "poolId": pool, "policy": {"migLayout": {A100_GPU5: ["7g.80gb"]}}}
    await api.ok("compute/pools/update", update)
    one_pass(db)  # the render: mig/apply touches GPU 5
    view = await node_view(api, node)
    held = {d["gpuUuid"] for d in view["devices"] if d["held"]}
    assert held == {A100_GPU5}
    # GPUs 4 and 7 have three 1g.10gb between them; GPU 5's seven are held.
    placed = [await reserve(api, pool, {"gpu.mig": 1}, migProfile="1g.10gb") for _ in range(3)]
    assert all(r["state"] == "placed" for r in placed)
    late = await reserve(api, pool, {"gpu.mig": 1}, migProfile="1g.10gb")
    assert late["state"] == "pending", "never on a GPU about to be repartitioned"
    assert execute(
        db, "SELECT count(*) FROM node_devices WHERE gpu_uuid = ? AND allocated = 1", (A100_GPU5,)
    ) == [(0,)]
    one_pass(db)
    assert execute(db, "SELECT state FROM reservations WHERE id = ?", (late["id"],)) == [
        ("pending",)
    ]
    # The agent applies it and reports with the host as the apply left it: GPU 5 is one
    # 7g.80gb now. Its atoms are the new instance's, un-held; the old 1g.10gb are gone.
    await apply_spec(api, node, repartitioned())
    view = await node_view(api, node)
    assert not [d for d in view["devices"] if d["held"]]
    on_gpu5 = [d["profile"] for d in view["devices"] if d["gpuUuid"] == A100_GPU5]
    assert on_gpu5 == ["7g.80gb"]
    one_pass(db)
    assert execute(db, "SELECT state FROM reservations WHERE id = ?", (late["id"],)) == [
        ("pending",)
    ]  # no 1g.10gb is left anywhere: the late one waits rather than land on a destroyed one
    whole = await reserve(api, pool, {"gpu.mig": 1}, migProfile="7g.80gb")
    assert whole["state"] == "placed"


def repartitioned() -> Any:
    """The recorded DGX A100 after mig-parted gave GPU 5 one 7g.80gb instance."""
    a100 = recorded("dgx-a100-02")
    gpu5 = next(g for g in a100.gpus if g.uuid == A100_GPU5)
    whole = replace(gpu5.mig_instances[0], uuid="MIG-7g80gb-on-gpu5", profile="7g.80gb")
    gpus = [replace(g, mig_instances=[whole]) if g.uuid == A100_GPU5 else g for g in a100.gpus]
    return replace(a100, gpus=gpus)


async def test_h4_u3_a_booked_gpu_is_not_in_the_drain_gated_unit(api: Api, db: Path) -> None:
    """H4, U3: with a booking on GPU 5, a new layout for it leaves it out of the drain-gated
    unit, so nothing of it is held and its free atoms stay placeable; once the booking ends
    the node is rendered again, GPU 5 is in the unit and held until it is applied."""
    pool, token = await pool_with_token(
        api, gpuModel="A100", sharing="mig", ownerQuota={"gpu.mig": 100}
    )
    node = await joined(api, token, recorded("dgx-a100-02"))
    on_gpu5 = "SELECT count(*) FROM node_devices WHERE gpu_uuid = ? AND allocated = 1"
    while execute(db, on_gpu5, (A100_GPU5,)) == [(0,)]:  # bounded: 10 atoms of 1g.10gb
        placed = await reserve(api, pool, {"gpu.mig": 1}, migProfile="1g.10gb")
        assert placed["state"] == "placed"
    update = {"tenantId": "root", "poolId": pool, "policy": {"migLayout": {A100_GPU5: ["7g.80gb"]}}}
    await api.ok("compute/pools/update", update)
    one_pass(db)
    spec = await apply_spec(api, node, recorded("dgx-a100-02"))
    assert A100_GPU5 in spec.get("bookedGpus", [])
    assert all(A100_GPU5 not in u.get("gpus", []) for u in spec["units"])
    assert not [d for d in (await node_view(api, node))["devices"] if d["held"]]
    assert (await reserve(api, pool, {"gpu.mig": 1}, migProfile="1g.10gb"))["state"] == "placed"
    for (reservation,) in execute(db, "SELECT id FROM reservations WHERE state = 'placed'"):
        await api.ok("compute/reservations/end", {"tenantId": "root", "reservationId": reservation})
    await host_confirms(api, node, recorded("dgx-a100-02"))  # D7: released on the host
    one_pass(db)  # the bookings moved: rendered again, GPU 5 idle now
    held = {d["gpuUuid"] for d in (await node_view(api, node))["devices"] if d["held"]}
    assert held == {A100_GPU5}
    spec = await apply_spec(api, node, repartitioned())
    assert any(A100_GPU5 in u.get("gpus", []) for u in spec["units"])
    assert not [d for d in (await node_view(api, node))["devices"] if d["held"]]


async def test_h5_an_unhealthy_gpu_is_never_placed_and_its_booking_is_flagged(
    api: Api, db: Path
) -> None:
    """H5: a GPU the agent reports unhealthy leaves schedulable capacity and placement; a
    live booking on it stays booked and is flagged; node.gpuUnhealthy / node.gpuHealthy."""
    pool, token = await pool_with_token(api)
    dgx = recorded("dgx-h100-01")
    node = await joined(api, token, dgx)
    first = await reserve(api, pool, {"gpu": 1})
    booked_uuid = execute(
        db, "SELECT gpu_uuid FROM node_devices WHERE reservation_id = ?", (first["id"],)
    )[0][0]
    sick = replace(
        dgx,
        gpus=[
            replace(g, health="unhealthy", health_reasons=["xid:79"])
            if g.uuid in (booked_uuid, dgx.gpus[7].uuid)
            else g
            for g in dgx.gpus
        ],
    )
    await report(api, node, sick)
    view = await node_view(api, node)
    health = {g["uuid"]: (g["health"], g["healthReason"]) for g in view["gpus"]}
    assert health[dgx.gpus[7].uuid] == ("unhealthy", "xid:79")
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": first["id"]}
    )
    assert (got["state"], got["reason"]) == ("placed", "GpuUnhealthy")
    ledger = ledger_of(await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool}))
    assert ledger["gpu"] == (8, 6, 1, 6)
    placed = [await reserve(api, pool, {"gpu": 1}) for _ in range(7)]
    assert [r["state"] for r in placed].count("placed") == 6
    sick_atoms = {booked_uuid, dgx.gpus[7].uuid}
    for r in placed:
        if r["state"] == "placed":
            on = execute(
                db, "SELECT gpu_uuid FROM node_devices WHERE reservation_id = ?", (r["id"],)
            )
            assert on[0][0] not in sick_atoms
    await report(api, node, dgx)
    got = await api.ok(
        "compute/reservations/get", {"tenantId": "root", "reservationId": first["id"]}
    )
    assert got["reason"] is None
    kinds = await api.ok(
        "compute/events/list",
        {"tenantId": "root", "types": ["node.gpuUnhealthy", "node.gpuHealthy"]},
    )
    assert [e["type"] for e in kinds["items"]] == ["node.gpuUnhealthy"] * 2 + [
        "node.gpuHealthy"
    ] * 2
