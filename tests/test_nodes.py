"""Joining, reporting and node_resources rows: N1–N5, S1, P8 on the real app and SQLite."""

from pathlib import Path

import msgspec

from controlplane.capacity.liveness import Liveness
from controlplane.reconciler import reconcile_pass
from controlplane.storage.db import Store
from tests.conftest import Api, execute, snapshot, stored_bytes
from tests.nodes import (
    DGX_POLICY,
    counting_writes,
    join,
    joined,
    node_snapshot,
    nothing_sellable,
    pool_with_token,
    recorded,
    report,
    rows_of,
    wire,
)


async def test_n3_dgx_h100_rows_equal_hand_computed_values(api: Api) -> None:
    """N3, N4, S1: DGX H100 with hostReserve {8, 64} and overcommit {vcpu: 2}."""
    pool, token = await pool_with_token(api, policy=DGX_POLICY)
    node = await joined(api, token, recorded("dgx-h100-01"))
    listed = await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool})
    [view] = listed["items"]
    assert view["id"] == node["nodeId"] and view["state"] == "ready"
    # vcpu = (224 - 8) × 2; memoryGiB = floor(2164278687744 / 2^30 - 64) = floor(1951.67…)
    assert rows_of(view) == {
        "vcpu": (432, 0, 2.0),
        "memoryGiB": (1951, 0, 1.0),
        "hugepages2Mi": (0, 0, 1.0),
        "hugepages1Gi": (0, 0, 1.0),
    }
    assert [d["resource"] for d in view["devices"]] == ["gpu"] * 8
    capacity = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool})
    assert {r["resource"]: (r["total"], r["available"]) for r in capacity["items"]} == {
        "gpu": (8, 8),
        "hugepages1Gi": (0, 0),
        "hugepages2Mi": (0, 0),
        "memoryGiB": (1951, 1951),
        "vcpu": (432, 432),
    }
    assert await api.ok("compute/capacity/byPool", {"tenantId": "root", "poolId": pool}) == capacity


async def test_n4_out_of_range_ratios_are_stored_as_given_and_clamped(api: Api) -> None:
    """N4: overcommit vcpu 500 and memoryGiB 0.01 are accepted and stored as given; the
    reconciler clamps them to 100 and 0.1 on the rows."""
    policy = {
        "hostReserve": {"vcpu": 8, "memoryGiB": 64},
        "overcommit": {"vcpu": 500, "memoryGiB": 0.01},
    }
    pool, token = await pool_with_token(api, policy=policy)
    got = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool})
    assert got["policy"]["overcommit"] == {"vcpu": 500, "memoryGiB": 0.01}
    node = await joined(api, token, recorded("dgx-h100-01"))
    view = await api.ok("compute/nodes/get", {"tenantId": "root", "nodeId": node["nodeId"]})
    rows = rows_of(view)
    assert rows["vcpu"] == ((224 - 8) * 100, 0, 100.0)
    assert rows["memoryGiB"] == (195, 0, 0.1)  # floor(1951.67… × 0.1)


async def test_n3_huge_page_pools_leave_memory_and_are_never_overcommitted(api: Api) -> None:
    """N3: 1Gi pages (HGX H200: 128) are their own row and come out of memoryGiB."""
    pool, token = await pool_with_token(
        api, gpuModel="H200", policy={"overcommit": {"memoryGiB": 1.5}}
    )
    await joined(api, token, recorded("hgx-h200-01"))
    [view] = (await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool}))["items"]
    memory = (2164938394624 / 2**30 - 128) * 1.5
    assert rows_of(view)["memoryGiB"] == (int(memory), 0, 1.5)
    assert rows_of(view)["hugepages1Gi"] == (128, 0, 1.0)
    assert rows_of(view)["vcpu"] == (recorded("hgx-h200-01").cpu.logical_cpus, 0, 1.0)


async def test_n3_vps_host_pool_takes_a_cpu_host_with_disk(api: Api) -> None:
    """N1, N3: a pool without gpuModel takes hosts without GPUs; vps-host rows include diskGiB."""
    pool, token = await pool_with_token(
        api,
        **{"class": "vps-host", "gpuModel": None},
        policy={"overcommit": {"vcpu": 4, "diskGiB": 1.5}},
    )
    await joined(api, token, recorded("vps-cpu-01"))
    [view] = (await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool}))["items"]
    assert rows_of(view) == {
        "vcpu": (16, 0, 4.0),
        "memoryGiB": (int(8340826112 / 2**30), 0, 1.0),
        "diskGiB": (int(168878112768 / 2**30 * 1.5), 0, 1.5),
        "hugepages2Mi": (0, 0, 1.0),  # seed 000: huge page rows for every pool
        "hugepages1Gi": (0, 0, 1.0),
    }
    assert view["devices"] == []


async def test_n1_family_mismatch_is_refused_and_changes_nothing(api: Api, db: Path) -> None:
    """N1: an H200 host cannot join an H100 pool; the token is not spent."""
    _, token = await pool_with_token(api, max_uses=1)
    before = node_snapshot(db)
    status, answer = await join(api, token, recorded("hgx-h200-01"))
    assert (status, answer["error"]["code"]) == (400, "INVALID_INPUT")
    assert answer["error"]["details"]["field"] == "inventory.gpus.0.name"
    assert "H200" in answer["error"]["message"] and "H100" in answer["error"]["message"]
    assert node_snapshot(db) == before
    for host in ("vps-cpu-01", "l40s-node-03"):
        status, answer = await join(api, token, recorded(host))
        assert answer["error"]["code"] == "INVALID_INPUT"
    await joined(api, token, recorded("dgx-h100-01"))  # the single use is still there


async def test_n1_gpu_host_into_a_pool_without_gpu_model_is_refused(api: Api) -> None:
    """N1: a pool without gpuModel takes only hosts without GPUs."""
    _, token = await pool_with_token(api, **{"class": "vps-host", "gpuModel": None})
    status, answer = await join(api, token, recorded("l40s-node-03"))
    assert (status, answer["error"]["details"]["field"]) == (400, "inventory.gpus.0.name")


async def test_join_tokens_are_pool_scoped_expiring_and_limited(api: Api, db: Path) -> None:
    """Join tokens: stored hashed, used up after maxUses, unknown ones are UNAUTHENTICATED."""
    _, token = await pool_with_token(api, max_uses=1)
    assert token.startswith("bcj_")
    assert token.encode() not in stored_bytes(db)
    await joined(api, token, recorded("dgx-h100-01"))
    # A second host finds the token used up.
    other = msgspec.structs.replace(recorded("dgx-h100-01"), machine_id="another-host", gpus=[])
    status, answer = await join(api, token, other)
    assert (status, answer["error"]["code"]) == (401, "UNAUTHENTICATED")
    status, answer = await join(api, "bcj_nope", recorded("dgx-h100-01"))
    assert (status, answer["error"]["code"]) == (401, "UNAUTHENTICATED")
    _, expiring = await pool_with_token(api)
    execute(db, "UPDATE join_tokens SET expires_at = '2000-01-01T00:00:00.000Z'")
    status, answer = await join(api, expiring, recorded("dgx-h100-01"))
    assert (status, answer["error"]["code"]) == (401, "UNAUTHENTICATED")


async def test_join_tokens_owner_only_and_not_for_archived_or_agentless_pools(api: Api) -> None:
    """Only the owner creates join tokens; archived and agent: none pools take no agents."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "acme")
    acme = await api.token_for("acme")
    await api.err(
        "compute/joinTokens/create",
        {"tenantId": "acme", "poolId": pool},
        "NOT_FOUND",
        "poolId",
        acme,
    )
    provider = await api.pool(
        site, **{"class": "provider", "providerAccountId": "pacct_" + "0" * 26}
    )
    await api.err(
        "compute/joinTokens/create", {"tenantId": "root", "poolId": provider["id"]}, "INVALID_STATE"
    )
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    await api.err(
        "compute/joinTokens/create", {"tenantId": "root", "poolId": pool}, "INVALID_STATE"
    )


async def test_p8_pool_join_attestors_and_unregistered_attestors(api: Api) -> None:
    """P8: only registered attestors join, and only those the pool's policy names."""
    _, token = await pool_with_token(api)
    inventory = recorded("dgx-h100-01")
    body = {
        "joinToken": token,
        "attestor": "tpm-quote",
        "hostname": "h",
        "inventory": wire(inventory),
    }
    response = await api.client.post("/api/compute/nodes/join", json=body)
    answer = await response.json()
    assert (response.status, answer["error"]["details"]["field"]) == (400, "attestor")


async def test_rejoining_the_same_host_keeps_one_node_and_rotates_its_credential(
    api: Api, db: Path
) -> None:
    """Re-joining (same machine id and GPU UUIDs) does not make a second node."""
    _, token = await pool_with_token(api)
    first = await joined(api, token, recorded("dgx-h100-01"))
    second = await joined(api, token, recorded("dgx-h100-01"))
    assert second["nodeId"] == first["nodeId"] and second["rejoined"] is True
    assert execute(db, "SELECT count(*) FROM nodes") == [(1,)]
    status, _ = await report(api, first, recorded("dgx-h100-01"))
    assert status == 401  # the old credential was replaced
    status, _ = await report(api, second, recorded("dgx-h100-01"))
    assert status == 200
    _, other_token = await pool_with_token(api)
    status, answer = await join(api, other_token, recorded("dgx-h100-01"))
    assert (status, answer["error"]["code"]) == (409, "CONFLICT")


async def test_a_node_credential_sees_only_its_own_node(api: Api) -> None:
    """nodes/report and nodes/spec with a node credential reach only that node."""
    _, token = await pool_with_token(api, gpuModel="L40S")
    l40s = await joined(api, token, recorded("l40s-node-03"))
    other = {**l40s, "nodeId": "node_" + "0" * 26}
    status, answer = await report(api, other, recorded("l40s-node-03"))
    assert (status, answer["error"]["code"]) == (404, "NOT_FOUND")
    response = await api.client.post(
        "/api/compute/nodes/spec",
        json={"nodeId": l40s["nodeId"]},
        headers={"Authorization": f"Bearer {l40s['token']}"},
    )
    spec = await response.json()
    assert spec["nodeId"] == l40s["nodeId"] and spec["gpuModel"] == "L40S"
    response = await api.client.post(
        "/api/compute/pools/list",
        json={"tenantId": "root"},
        headers={"Authorization": f"Bearer {l40s['token']}"},
    )
    assert response.status == 401  # a node credential is not a tenant credential


async def test_an_unchanged_report_writes_nothing(api: Api, db: Path) -> None:
    """An unchanged inventory writes nothing beyond liveness, which is batched in memory."""
    _, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    before = node_snapshot(db)
    for _ in range(5):
        status, answer = await report(api, node, recorded("dgx-h100-01"))
        assert status == 200
    assert node_snapshot(db) == before
    [view] = execute(db, "SELECT spec_version FROM nodes")
    assert answer["specVersion"] == view[0] and len(view[0]) == 64  # the spec's content hash


async def test_a_changed_inventory_recomputes_rows_at_once(api: Api) -> None:
    """A report with a changed inventory updates the node's rows in the same transaction."""
    pool, token = await pool_with_token(api, policy=DGX_POLICY)
    node = await joined(api, token, recorded("dgx-h100-01"))
    changed = recorded("dgx-h100-01")
    pages = msgspec.structs.replace(changed.hugepages.pages_1gi, total=64)  # type: ignore[arg-type]
    changed = msgspec.structs.replace(
        changed, hugepages=msgspec.structs.replace(changed.hugepages, pages_1gi=pages)
    )
    status, _ = await report(api, node, changed)
    assert status == 200
    [view] = (await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool}))["items"]
    assert rows_of(view)["hugepages1Gi"] == (64, 0, 1.0)
    assert rows_of(view)["memoryGiB"] == (1951 - 64, 0, 1.0)


async def test_s1_atoms_per_sharing_mode(api: Api) -> None:
    """S1: mig → gpu.mig per MIG instance; exclusive → gpu per non-MIG GPU; timeslice → replicas slots."""
    mig_pool, mig_token = await pool_with_token(api, gpuModel="A100", sharing="mig")
    await joined(api, mig_token, recorded("dgx-a100-02"))
    a100 = recorded("dgx-a100-02")
    instances = [(i.uuid, i.profile) for g in a100.gpus if g.mig_current for i in g.mig_instances]
    [view] = (await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": mig_pool}))["items"]
    assert sorted((d["deviceId"], d["profile"]) for d in view["devices"]) == sorted(instances)
    assert {d["resource"] for d in view["devices"]} == {"gpu.mig"}
    slots_pool, slots_token = await pool_with_token(
        api, gpuModel="L40S", sharing="timeslice", policy={"replicas": 4}
    )
    await joined(api, slots_token, recorded("l40s-node-03"))
    capacity = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": slots_pool})
    assert {r["resource"]: r["total"] for r in capacity["items"]}["gpu.slot"] == 16


async def test_s1_exclusive_pool_counts_only_gpus_not_in_mig_mode(api: Api) -> None:
    """S1: a GPU in MIG mode is not a whole-GPU atom (DGX A100: MIG on GPUs 4–7)."""
    pool, token = await pool_with_token(api, gpuModel="A100")
    await joined(api, token, recorded("dgx-a100-02"))
    capacity = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool})
    whole = sum(1 for g in recorded("dgx-a100-02").gpus if not g.mig_current)
    assert {r["resource"]: r["total"] for r in capacity["items"]}["gpu"] == whole


async def test_n2_tenant_controlled_nodes_get_no_rows(api: Api) -> None:
    """N2: only metal-host and vps-host nodes add capacity; metal-dedicated nodes get none."""
    pool, token = await pool_with_token(api, **{"class": "metal-dedicated"})
    await joined(api, token, recorded("dgx-h100-01"))
    [view] = (await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool}))["items"]
    assert view["resources"] == [] and view["devices"] == []


async def test_n5_reconciler_rewrites_nothing_unchanged_and_never_shrinks_below_allocated(
    api: Api, db: Path
) -> None:
    """N5: a pass with nothing changed writes no row; a shrink stops at what is allocated."""
    pool, token = await pool_with_token(api, policy=DGX_POLICY)
    node = await joined(api, token, recorded("dgx-h100-01"))
    store = Store(db)
    try:
        before = node_snapshot(db)
        stats, writes = counting_writes(store, lambda d: reconcile_pass(d, Liveness(), 3600, True))
        assert (stats.nodes_recomputed, stats.rows_written, writes) == (0, 0, 0)
        assert node_snapshot(db) == before
        execute(db, "UPDATE node_resources SET allocated = 400 WHERE resource = 'vcpu'")
        await api.ok(
            "compute/pools/update",
            {
                "tenantId": "root",
                "poolId": pool,
                "policy": {**DGX_POLICY, "overcommit": {"vcpu": 1}},
            },
        )
        stats = store.transact(lambda d: reconcile_pass(d, Liveness(), 3600, True))
        assert (stats.nodes_recomputed, stats.rows_written) == (1, 1)  # vcpu only
        row = execute(
            db, "SELECT capacity, allocated, ratio FROM node_resources WHERE resource = 'vcpu'"
        )
        assert row == [(400, 400, 1.0)]  # desired 216, held at the 400 allocated
        assert store.transact(lambda d: reconcile_pass(d, Liveness(), 3600, True)).rows_written == 0
    finally:
        store.close()
    assert node["nodeId"]


async def test_nodes_lost_and_ready_again(api: Api, db: Path) -> None:
    """A node silent past the grace period is lost (node.lost); its next report makes it ready."""
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    execute(db, "UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z'")
    store = Store(db)
    try:
        assert store.transact(lambda d: reconcile_pass(d, Liveness(), 90, True)).nodes_lost == 1
    finally:
        store.close()
    await nothing_sellable(api, pool)  # a lost node offers nothing
    status, _ = await report(api, node, recorded("dgx-h100-01"))
    assert status == 200
    events = await api.ok(
        "compute/events/list",
        {"tenantId": "root", "types": ["node.joined", "node.lost", "node.ready"]},
    )
    assert [e["type"] for e in events["items"]] == [
        "node.joined",
        "node.ready",
        "node.lost",
        "node.ready",
    ]
    [view] = (await api.ok("compute/nodes/list", {"tenantId": "root", "poolId": pool}))["items"]
    assert view["state"] == "ready"


async def test_acceptance_diag_nvml_quarantines_unhealthy_hosts(api: Api) -> None:
    """acceptance [{kind: diag.nvml}]: a GPU with uncorrected ECC errors keeps the node out."""
    pool, token = await pool_with_token(api, policy={"acceptance": [{"kind": "diag.nvml"}]})
    sick = recorded("dgx-h100-01")
    gpus = [msgspec.structs.replace(sick.gpus[0], ecc_uncorrected_volatile=3), *sick.gpus[1:]]
    node = await joined(api, token, msgspec.structs.replace(sick, gpus=gpus))
    view = await api.ok("compute/nodes/get", {"tenantId": "root", "nodeId": node["nodeId"]})
    assert view["state"] == "quarantined"
    await nothing_sellable(api, pool)


async def test_nodes_are_visible_to_the_pool_owner_only(api: Api, db: Path) -> None:
    """nodes/list and nodes/get are owner only: anyone else, offered or not, gets NOT_FOUND
    (DESIGN: PERMISSION_DENIED is only for a credential that may not act for the tenant)."""
    await api.tenant("acme")
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    await api.offer(pool, "acme")
    acme = await api.token_for("acme")
    await api.err(
        "compute/nodes/list",
        {"tenantId": "acme", "poolId": pool},
        "NOT_FOUND",
        "poolId",
        acme,
    )
    await api.err(
        "compute/nodes/get",
        {"tenantId": "acme", "nodeId": node["nodeId"]},
        "NOT_FOUND",
        "nodeId",
        acme,
    )
    await api.tenant("stranger")
    stranger = await api.token_for("stranger")
    await api.err(
        "compute/nodes/list",
        {"tenantId": "stranger", "poolId": pool},
        "NOT_FOUND",
        "poolId",
        stranger,
    )
    assert snapshot(db)["pools"]


async def test_r8_a_rejoin_spends_a_use_and_a_used_up_token_joins_nothing(
    api: Api, db: Path
) -> None:
    """R8: a used-up (unexpired) token plus a host's machine id and GPU UUIDs cannot re-join as
    that node and cut its agent off; with a use left, a re-join spends it like a first join."""
    _, token = await pool_with_token(api, max_uses=2)
    first = await joined(api, token, recorded("dgx-h100-01"))
    again = await joined(api, token, recorded("dgx-h100-01"))
    assert again["rejoined"] is True and again["nodeId"] == first["nodeId"]
    assert execute(db, "SELECT uses, max_uses FROM join_tokens") == [(2, 2)]
    before = node_snapshot(db)
    status, answer = await join(api, token, recorded("dgx-h100-01"))
    assert (status, answer["error"]["code"]) == (401, "UNAUTHENTICATED")
    assert "used up" in answer["error"]["message"]
    assert node_snapshot(db) == before
    # The agent holding the last credential minted keeps reporting.
    status, _ = await report(api, again, recorded("dgx-h100-01"))
    assert status == 200
