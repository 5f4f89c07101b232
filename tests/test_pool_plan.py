"""C1: pools/update with dryRun plans a policy change before it is made, by the renderer,
drain-gating and resource math the reconciler runs, and writes nothing; the plan is then
what the real update and the agents' applies produce."""

from pathlib import Path
from typing import Any

from msgspec.structs import replace

from shared.inventory import Inventory, MigInstance
from tests.conftest import Api, all_tables, execute
from tests.nodes import (
    DGX_POLICY,
    apply_spec,
    host_confirms,
    joined,
    one_pass,
    pool_with_token,
    recorded,
)

LAYOUT = {"migLayout": {"default": ["3g.40gb", "3g.40gb"]}}


async def reserve(api: Api, pool: str, resources: dict[str, int], **extra: Any) -> Any:
    answer = await api.ok(
        "compute/reservations/create",
        {"tenantId": "root", "poolId": pool, "resources": resources, **extra},
    )
    assert answer["state"] == "placed", answer
    return answer


async def schedulable(api: Api, pool: str) -> dict[str, int]:
    ledger = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool})
    return {row["resource"]: row["schedulable"] for row in ledger["items"]}


async def dry_run(api: Api, pool: str, policy: dict[str, Any]) -> Any:
    body = {"tenantId": "root", "poolId": pool, "policy": policy, "dryRun": True}
    return await api.ok("compute/pools/update", body)


def laid_out(inventory: Inventory, profiles: list[str]) -> Inventory:
    """The host as mig-parted leaves it: every GPU carries the layout's instances."""
    gpus = [
        replace(
            gpu,
            mig_current=True,
            mig_pending=True,
            mig_instances=[
                MigInstance(
                    uuid=f"MIG-{gpu.index}-{n}", profile=p, gpu_instance_id=n, compute_instance_id=0
                )
                for n, p in enumerate(profiles)
            ],
        )
        for gpu in inventory.gpus
    ]
    return replace(inventory, gpus=gpus)


async def test_c1_a_mig_layout_change_is_planned_then_made_as_planned(api: Api, db: Path) -> None:
    """C1, H4, U3: on the recorded DGX A100 with one booked MIG instance, the dry run names
    the drain and the booking in the way, gives gpu.mig before → after and the offered quota
    left uncovered, and writes nothing (rows and events as they were, the version too). The
    update applied with the plan's version, the booking ended and released, and the agent's
    apply reported, the ledger shows exactly the plan's capacity."""
    await api.tenant("acme")
    pool, token = await pool_with_token(
        api, gpuModel="A100", sharing="mig", ownerQuota={"gpu.mig": 100}
    )
    await api.offer(pool, "acme", {"gpu.mig": 20})
    a100 = recorded("dgx-a100-02")
    node = await joined(api, token, a100)
    booking = await reserve(api, pool, {"gpu.mig": 1}, migProfile="1g.10gb")
    before = await schedulable(api, pool)

    # A dry run is decided and validated as the update is: the owner's only (anyone else
    # NOT_FOUND), a policy no host could take INVALID_INPUT on its field.
    body = {"tenantId": "acme", "poolId": pool, "policy": LAYOUT, "dryRun": True}
    acme = await api.token_for("acme")
    await api.err("compute/pools/update", body, "NOT_FOUND", "poolId", acme)
    bad = {"migLayout": {"default": ["9g.99gb"]}}
    body = {"tenantId": "root", "poolId": pool, "policy": bad, "dryRun": True}
    error = await api.err("compute/pools/update", body, "INVALID_INPUT")
    assert error["details"]["field"].startswith("policy.migLayout"), error
    tables = all_tables(db)
    answer = await dry_run(api, pool, LAYOUT)
    assert all_tables(db) == tables  # C1: no write, no event, no version
    assert answer["pool"]["version"] == 1 and answer["pool"]["policy"] == LAYOUT
    plan = answer["plan"]
    [planned] = plan["nodes"]
    assert planned["nodeId"] == node["nodeId"] and planned["hostname"] == a100.hostname
    units = {u["id"]: (u["change"], u["needs"]) for u in planned["units"]}
    assert units["mig/apply"] == ("add", ["drain"])
    assert units["mig/layout-file"] == ("add", [])
    assert planned["drainNeeded"] is True and planned["rebootNeeded"] is False
    assert planned["bookingsInTheWay"] == [booking["id"]]
    capacity = {row["resource"]: (row["before"], row["after"]) for row in plan["capacity"]}
    assert capacity["gpu.mig"] == (before["gpu.mig"], 16)  # 8 GPUs × 2 instances
    assert capacity["vcpu"] == (before["vcpu"], before["vcpu"])
    assert plan["quotas"] == [
        {
            "tenantId": "acme",
            "resource": "gpu.mig",
            "max": 20,
            "schedulableAfter": 16,
            "covered": False,
        }
    ]
    assert plan["warnings"] == []

    # R3: the plan's version applies exactly what was planned
    body = {"tenantId": "root", "poolId": pool, "policy": LAYOUT, "version": 1}
    await api.err("compute/pools/update", {**body, "version": 2}, "CONFLICT", "version")
    assert (await api.ok("compute/pools/update", body))["version"] == 2
    one_pass(db)
    await api.ok("compute/reservations/end", {"tenantId": "root", "reservationId": booking["id"]})
    await host_confirms(api, node, a100)  # D7: released on the host
    one_pass(db)
    await apply_spec(api, node, laid_out(a100, ["3g.40gb", "3g.40gb"]))
    one_pass(db)
    assert (await schedulable(api, pool))["gpu.mig"] == 16


async def test_c1_replicas_and_host_reserve_changes_are_planned(api: Api, db: Path) -> None:
    """C1: a replicas change on a time-sliced L40S node re-cuts every GPU (drain, the slot
    booking in the way, gpu.slot 4 → 8 per GPU); a hostReserve change on a DGX H100 moves
    only rows (vcpu, memoryGiB) by the resource math, needs no drain, and the vcpu quota
    offered is covered or not as the new capacity says. Neither dry run writes."""
    sliced, token = await pool_with_token(
        api,
        gpuModel="L40S",
        sharing="timeslice",
        policy={"replicas": 4},
        ownerQuota={"gpu.slot": 64},
    )
    l40s = recorded("l40s-node-03")
    await joined(api, token, l40s)
    slot = await reserve(api, sliced, {"gpu.slot": 1})
    tables = all_tables(db)
    plan = (await dry_run(api, sliced, {"replicas": 8}))["plan"]
    [planned] = plan["nodes"]
    assert {u["id"]: u["change"] for u in planned["units"]} == {
        "sharing/device-plugin-config": "change"
    }
    assert planned["drainNeeded"] is True and planned["bookingsInTheWay"] == [slot["id"]]
    capacity = {row["resource"]: (row["before"], row["after"]) for row in plan["capacity"]}
    gpus = len(l40s.gpus)
    assert capacity["gpu.slot"] == (4 * gpus, 8 * gpus)
    assert plan["quotas"] == []  # a time-sliced pool is its owner's alone (S1)

    await api.tenant("acme")
    exclusive, token = await pool_with_token(api, policy=DGX_POLICY)
    h100 = recorded("dgx-h100-01")
    await joined(api, token, h100)
    await api.offer(exclusive, "acme", {"vcpu": 2 * (h100.cpu.logical_cpus - 12)})
    tables = all_tables(db)
    reserved = {**DGX_POLICY, "hostReserve": {"vcpu": 16, "memoryGiB": 128}}
    plan = (await dry_run(api, exclusive, reserved))["plan"]
    assert all_tables(db) == tables
    [planned] = plan["nodes"]
    assert planned["drainNeeded"] is False and planned["bookingsInTheWay"] == []
    capacity = {row["resource"]: (row["before"], row["after"]) for row in plan["capacity"]}
    cpus = h100.cpu.logical_cpus
    assert capacity["vcpu"] == (2 * (cpus - 8), 2 * (cpus - 16))
    memory_before, memory_after = capacity["memoryGiB"]
    assert memory_before - memory_after == 64
    assert capacity["gpu"] == (8, 8)
    [quota] = plan["quotas"]
    assert (quota["resource"], quota["schedulableAfter"], quota["covered"]) == (
        "vcpu",
        2 * (cpus - 16),
        False,
    )
    # The real update and the reconciler give the rows the plan said.
    await api.ok(
        "compute/pools/update",
        {"tenantId": "root", "poolId": exclusive, "policy": reserved, "version": 1},
    )
    one_pass(db)
    after = await schedulable(api, exclusive)
    assert (after["vcpu"], after["memoryGiB"]) == (2 * (cpus - 16), memory_after)
    assert execute(db, "SELECT count(*) FROM events WHERE type = 'pool.updated'") == [(1,)]


async def test_c1_to_c5_the_published_contract_names_the_fields(api: Api) -> None:
    """C1-C5: OpenAPI, generated from the schemas that validate, shows dryRun and the plan
    answer of pools/update, notAfter, durationSeconds, endsAt, offerEndsAt, the coverage
    warnings and the ledger's coverage."""
    response = await api.client.get("/api/openapi.json")
    document = await response.json()
    schemas = document["components"]["schemas"]
    answer = document["paths"]["/api/compute/pools/update"]["post"]["responses"]["200"]
    refs = [one["$ref"] for one in answer["content"]["application/json"]["schema"]["oneOf"]]
    assert refs == ["#/components/schemas/PoolView", "#/components/schemas/PoolPlan"]
    assert set(schemas["Plan"]["properties"]) == {"nodes", "capacity", "quotas", "warnings"}
    offered = schemas["PoolsOffer"]["properties"]["notAfter"]["anyOf"][0]
    assert offered["format"] == "date-time"
    duration = schemas["ReservationsCreate"]["properties"]["durationSeconds"]
    assert (duration["minimum"], duration["maximum"]) == (60, 7_776_000)
    for struct, field in (
        ("PoolsUpdate", "dryRun"),
        ("ReservationView", "endsAt"),
        ("PoolView", "offerEndsAt"),
        ("OfferView", "notAfter"),
        ("QuotaRows", "warnings"),
        ("CapacityRow", "coverage"),
    ):
        assert field in schemas[struct]["properties"], (struct, field)
