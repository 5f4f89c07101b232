"""Node life: what counts as a changed inventory, host identity, admission, held capacity."""

import asyncio
from pathlib import Path
from typing import Any

import msgspec
import pytest

from controlplane.app import make_app
from controlplane.capacity.liveness import Liveness
from controlplane.capacity.nodes import isolated
from controlplane.config import Config
from controlplane.reconciler import PassStats
from controlplane.storage.db import Store
from shared.inventory import Inventory
from tests import nodes
from tests.conftest import Api, execute
from tests.nodes import (
    DGX_POLICY,
    apply_spec,
    join,
    joined,
    nothing_sellable,
    pool_with_token,
    recorded,
    wire,
)
from tests.test_nodes import node_snapshot, report

replace = msgspec.structs.replace


def one_pass(db: Path, liveness: Liveness | None = None, may_mark_lost: bool = True) -> PassStats:
    """A pass with the daemon's default 90 s before a silent node is lost."""
    return nodes.one_pass(db, liveness, may_mark_lost, lost_after=90)


async def node_view(api: Api, node: dict[str, Any]) -> Any:
    return await api.ok("compute/nodes/get", {"tenantId": "root", "nodeId": node["nodeId"]})


def warmer(inventory: Inventory) -> Inventory:
    """The same host a minute later: hotter GPUs, fewer free huge pages."""
    gpus = [replace(gpu, temperature_c=(gpu.temperature_c or 30) + 11) for gpu in inventory.gpus]
    pages = inventory.hugepages
    busy = replace(pages, pages_1gi=replace(pages.pages_1gi, free=0)) if pages.pages_1gi else pages
    return replace(inventory, gpus=gpus, hugepages=busy)


async def test_readings_that_move_every_minute_are_not_a_changed_inventory(
    api: Api, db: Path
) -> None:
    """Temperatures and free huge pages change all the time; such a report still writes nothing."""
    _, token = await pool_with_token(api, gpuModel="H200")
    node = await joined(api, token, recorded("hgx-h200-01"))
    status, first = await report(api, node, recorded("hgx-h200-01"))
    before = node_snapshot(db)
    status, second = await report(api, node, warmer(recorded("hgx-h200-01")))
    assert status == 200 and second["specVersion"] == first["specVersion"]
    assert node_snapshot(db) == before


async def test_n1_the_family_is_derived_by_the_control_plane(api: Api) -> None:
    """N1: the agent's `family` is ignored; the name decides (an H200 claiming H100 is refused)."""
    _, token = await pool_with_token(api)
    h200 = recorded("hgx-h200-01")
    liar = replace(h200, gpus=[replace(gpu, family="H100") for gpu in h200.gpus])
    status, answer = await join(api, token, liar)
    assert (status, answer["error"]["code"]) == (400, "INVALID_INPUT")
    _, cpu_token = await pool_with_token(api, **{"class": "vps-host", "gpuModel": None})
    dgx = recorded("dgx-h100-01")
    hidden = replace(dgx, gpus=[replace(gpu, family=None) for gpu in dgx.gpus])
    status, answer = await join(api, cpu_token, hidden)
    assert (status, answer["error"]["code"]) == (400, "INVALID_INPUT")


async def test_a_host_that_lost_a_gpu_is_still_the_same_node(api: Api, db: Path) -> None:
    """A GPU falling off the bus changes the node's inventory; re-joining does not make a second node."""
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    dgx = recorded("dgx-h100-01")
    seven = replace(dgx, gpus=dgx.gpus[:7])
    again = await joined(api, token, seven)
    assert again["nodeId"] == node["nodeId"]
    capacity = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool})
    assert {r["resource"]: r["total"] for r in capacity["items"]}["gpu"] == 7
    assert execute(db, "SELECT count(*) FROM nodes") == [(1,)]


async def test_a_cloned_machine_id_is_refused_not_merged(api: Api) -> None:
    """Two hosts with one machine id (a cloned image) do not collapse into one node."""
    _, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    dgx = recorded("dgx-h100-01")
    clone = replace(
        dgx,
        hostname="dgx-h100-02",
        gpus=[replace(gpu, uuid=gpu.uuid[:-4] + "beef") for gpu in dgx.gpus],
    )
    status, answer = await join(api, token, clone)
    assert (status, answer["error"]["code"], answer["error"]["details"]["field"]) == (
        409,
        "CONFLICT",
        "inventory.machineId",
    )
    _, cpu_token = await pool_with_token(api, **{"class": "vps-host", "gpuModel": None})
    await joined(api, cpu_token, recorded("vps-cpu-01"))
    status, answer = await join(
        api, cpu_token, replace(recorded("vps-cpu-01"), hostname="vps-cpu-02")
    )
    assert (status, answer["error"]["code"]) == (409, "CONFLICT")


async def test_n5_held_capacity_follows_once_the_booking_ends(api: Api, db: Path) -> None:
    """N5: a row held at what is allocated shrinks to the desired value when the booking ends."""
    pool, token = await pool_with_token(api, policy=DGX_POLICY)
    await joined(api, token, recorded("dgx-h100-01"))
    execute(db, "UPDATE node_resources SET allocated = 400 WHERE resource = 'vcpu'")
    await api.ok(
        "compute/pools/update",
        {"tenantId": "root", "poolId": pool, "policy": {**DGX_POLICY, "overcommit": {"vcpu": 1}}},
    )
    one_pass(db)
    assert execute(db, "SELECT capacity FROM node_resources WHERE resource = 'vcpu'") == [(400,)]
    one_pass(db)  # still held: looked at again, nothing to write
    execute(db, "UPDATE node_resources SET allocated = 0 WHERE resource = 'vcpu'")  # booking ended
    one_pass(db)
    assert execute(db, "SELECT capacity FROM node_resources WHERE resource = 'vcpu'") == [(216,)]
    assert one_pass(db).nodes_recomputed == 0


async def test_s1_a_booked_gpu_that_vanished_stays_until_its_booking_ends(
    api: Api, db: Path
) -> None:
    """S1: an atom booked when its GPU left the inventory is kept, then removed once free."""
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    dgx = recorded("dgx-h100-01")
    gone = dgx.gpus[7].uuid
    execute(db, "UPDATE node_devices SET allocated = 1 WHERE device_id = ?", (gone,))
    status, _ = await report(api, node, replace(dgx, gpus=dgx.gpus[:7]))
    assert status == 200
    assert execute(db, "SELECT count(*) FROM node_devices WHERE device_id = ?", (gone,)) == [(1,)]
    execute(db, "UPDATE node_devices SET allocated = 0 WHERE device_id = ?", (gone,))
    one_pass(db)
    assert execute(db, "SELECT count(*) FROM node_devices") == [(7,)]
    capacity = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool})
    assert {r["resource"]: r["total"] for r in capacity["items"]}["gpu"] == 7


async def test_admission_is_decided_again_on_every_changed_inventory(api: Api) -> None:
    """Acceptance on each changed report: a sick node is quarantined, a healed one is ready again."""
    pool, token = await pool_with_token(api, policy={"acceptance": [{"kind": "diag.nvml"}]})
    node = await joined(api, token, recorded("dgx-h100-01"))
    dgx = recorded("dgx-h100-01")
    sick = replace(dgx, gpus=[replace(dgx.gpus[0], ecc_uncorrected_volatile=2), *dgx.gpus[1:]])
    await report(api, node, sick)
    view = await node_view(api, node)
    assert view["state"] == "quarantined"
    await nothing_sellable(api, pool)
    await report(api, node, dgx)
    assert (await node_view(api, node))["state"] == "ready"
    events = await api.ok(
        "compute/events/list", {"tenantId": "root", "types": ["node.quarantined", "node.ready"]}
    )
    assert [e["type"] for e in events["items"]] == ["node.ready", "node.quarantined", "node.ready"]
    assert "uncorrected ECC" in events["items"][1]["data"]["reason"]


async def test_a_pool_update_readmits_its_nodes(api: Api, db: Path) -> None:
    """A new acceptance check or gpuModel re-decides every node of the pool at the next pass."""
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    await api.ok("compute/pools/update", {"tenantId": "root", "poolId": pool, "gpuModel": "H200"})
    one_pass(db)
    view = await node_view(api, node)
    assert view["state"] == "quarantined"
    await nothing_sellable(api, pool)
    await api.ok("compute/pools/update", {"tenantId": "root", "poolId": pool, "gpuModel": "H100"})
    one_pass(db)
    # H1: back from quarantine, configuring until its agent applies the spec of the new version.
    assert (await node_view(api, node))["state"] == "configuring"
    await apply_spec(api, node, recorded("dgx-h100-01"))
    assert (await node_view(api, node))["state"] == "ready"


async def test_no_node_is_lost_in_the_first_grace_period_after_a_start(api: Api, db: Path) -> None:
    """A restarted control plane has seen no reports yet: it marks nothing lost until a grace period has passed."""
    _, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    execute(db, "UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z'")
    assert one_pass(db, may_mark_lost=False).nodes_lost == 0
    assert one_pass(db, may_mark_lost=True).nodes_lost == 1


async def test_a_live_nodes_stamp_is_written_only_once_it_grows_old(api: Api, db: Path) -> None:
    """Liveness: a pass writes a node's stamp only when the stored one is older than the grace period."""
    _, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    liveness = Liveness()
    liveness.seen(node["nodeId"])
    assert one_pass(db, liveness).stamps_written == 0  # stored at the join: still fresh
    execute(db, "UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z'")
    stats = one_pass(db, liveness)
    assert (stats.stamps_written, stats.nodes_lost) == (1, 0)
    assert execute(db, "SELECT state FROM nodes") == [("ready",)]


async def test_r4_a_report_never_rewrites_the_hostname_join_set(api: Api, db: Path) -> None:
    """R4: one writer per field: the hostname is join's (validated there); a report carrying
    another, even one join would refuse, is taken for its inventory but leaves the hostname."""
    _, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    dgx = recorded("dgx-h100-01")
    changed = replace(dgx, hostname="not a hostname!!", memory_total_bytes=2**40)
    status, _ = await report(api, node, changed)
    assert status == 200
    view = await node_view(api, node)
    assert view["hostname"] == "dgx-h100-01"
    assert view["inventory"]["memoryTotalBytes"] == 2**40  # the report itself was taken
    assert execute(db, "SELECT hostname FROM nodes") == [("dgx-h100-01",)]


async def test_a_node_credential_cannot_reach_another_real_node(api: Api) -> None:
    """Two joined nodes: each credential reaches only its own node."""
    _, h100_token = await pool_with_token(api)
    _, l40s_token = await pool_with_token(api, gpuModel="L40S")
    dgx = await joined(api, h100_token, recorded("dgx-h100-01"))
    l40s = await joined(api, l40s_token, recorded("l40s-node-03"))
    status, answer = await report(api, {**l40s, "nodeId": dgx["nodeId"]}, recorded("l40s-node-03"))
    assert (status, answer["error"]["code"]) == (404, "NOT_FOUND")
    response = await api.client.post(
        "/api/compute/nodes/spec",
        json={"nodeId": dgx["nodeId"]},
        headers={"Authorization": f"Bearer {l40s['token']}"},
    )
    assert response.status == 404
    assert wire(recorded("l40s-node-03"))["hostname"] == "l40s-node-03"


async def test_a_host_that_cannot_take_the_policy_stays_quarantined_when_it_reports(
    api: Api, db: Path
) -> None:
    """N6: a render refusal quarantines the node, and its next reports (applied results) keep it so."""
    pool, token = await pool_with_token(api, gpuModel="L40S")
    node = await joined(api, token, recorded("l40s-node-03"))
    # 504 GiB host: 400 GiB of 1 GiB pages beside a 200 GiB reserve cannot fit on it.
    policy = {"hostReserve": {"vcpu": 0, "memoryGiB": 200}, "hugepages": {"1Gi": 400}}
    await api.ok("compute/pools/update", {"tenantId": "root", "poolId": pool, "policy": policy})
    one_pass(db)
    view = await node_view(api, node)
    assert view["state"] == "quarantined" and "hugepages" in view["stateReason"]
    response = await api.client.post(
        "/api/compute/nodes/report",
        json={
            "nodeId": node["nodeId"],
            "inventory": wire(recorded("l40s-node-03")),
            "applied": {"version": "x", "units": []},
        },
        headers={"Authorization": f"Bearer {node['token']}"},
    )
    assert response.status == 200
    assert (await node_view(api, node))["state"] == "quarantined"


async def test_u3_a_booked_gpu_takes_the_new_layout_once_idle(api: Api, db: Path) -> None:
    """U3: a new migLayout never repartitions a booked GPU; once its booking ends, the next pass gives it the layout."""
    pool, token = await pool_with_token(api, gpuModel="A100", sharing="mig")
    node = await joined(api, token, recorded("dgx-a100-02"))
    a100 = recorded("dgx-a100-02")
    booked = next(g for g in a100.gpus if g.mig_current)
    execute(db, "UPDATE node_devices SET allocated = 1 WHERE gpu_uuid = ?", (booked.uuid,))
    layout = {"migLayout": {"default": ["7g.80gb"]}}
    await api.ok("compute/pools/update", {"tenantId": "root", "poolId": pool, "policy": layout})
    one_pass(db)
    [spec] = execute(db, "SELECT spec FROM nodes")
    assert spec[0].count("7g.80gb") >= 1
    held_version = execute(db, "SELECT spec_version FROM nodes")
    one_pass(db)  # still booked: looked at again, same spec
    assert execute(db, "SELECT spec_version FROM nodes") == held_version
    execute(db, "UPDATE node_devices SET allocated = 0")
    one_pass(db)
    assert execute(db, "SELECT spec_version FROM nodes") != held_version
    assert node["nodeId"]


async def test_a_policy_update_moves_the_spec_version_even_when_no_unit_changes(
    api: Api, db: Path
) -> None:
    """A policy update (here: an unknown field only) moves every node of the pool to a new spec version."""
    pool, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    [before] = execute(db, "SELECT spec_version FROM nodes")
    await api.ok(
        "compute/pools/update", {"tenantId": "root", "poolId": pool, "policy": {"team": "infra"}}
    )
    one_pass(db)
    [after] = execute(db, "SELECT spec_version FROM nodes")
    assert after != before


async def test_r5_a_pool_whose_policy_no_longer_parses_never_stops_the_pass(
    api: Api, db: Path
) -> None:
    """R5: one pool's stored policy stops parsing; a pass quarantines that pool's node with the
    reason, counts the failure, and still marks a silent node lost, recomputes other pools'
    nodes and places their pending reservations."""
    broken, broken_token = await pool_with_token(api)
    healthy, healthy_token = await pool_with_token(api, gpuModel="H200")
    sick = await joined(api, broken_token, recorded("dgx-h100-01"))
    await joined(api, healthy_token, recorded("hgx-h200-01"))
    silent_pool, silent_token = await pool_with_token(api, gpuModel="L40S")
    await joined(api, silent_token, recorded("l40s-node-03"))
    execute(
        db,
        "UPDATE pools SET policy = ?, version = version + 1 WHERE id = ?",
        ('{"hugepages": "lots"}', broken),
    )
    execute(
        db,
        "UPDATE pools SET policy = ?, version = version + 1 WHERE id = ?",
        ('{"hostReserve": {"vcpu": 100, "memoryGiB": 0}}', healthy),
    )
    execute(
        db,
        "UPDATE nodes SET last_seen_at = '2000-01-01T00:00:00.000Z' WHERE pool_id = ?",
        (silent_pool,),
    )
    stats = one_pass(db)
    assert stats.failures == 1 and stats.nodes_lost == 1
    state, reason = execute(
        db, "SELECT state, state_reason FROM nodes WHERE id = ?", (sick["nodeId"],)
    )[0]
    assert state == "quarantined" and reason.startswith("cannot be reconciled: policy")
    assert execute(
        db,
        "SELECT r.capacity FROM node_resources r JOIN nodes n ON n.id = r.node_id "
        "WHERE n.pool_id = ? AND r.resource = 'vcpu'",
        (healthy,),
    ) == [(recorded("hgx-h200-01").cpu.logical_cpus - 100,)]
    quarantined = execute(db, "SELECT count(*) FROM events WHERE type = 'node.quarantined'")
    assert one_pass(db).failures == 1, "retried each pass until the pool is fixed"
    assert execute(db, "SELECT count(*) FROM events WHERE type = 'node.quarantined'") == quarantined
    await api.ok("compute/pools/update", {"tenantId": "root", "poolId": broken, "policy": {}})
    assert one_pass(db).failures == 0
    # H1: out of quarantine it is configuring until its agent applies the pool's new spec.
    assert execute(db, "SELECT state FROM nodes WHERE id = ?", (sick["nodeId"],)) == [
        ("configuring",)
    ]
    await apply_spec(api, sick, recorded("dgx-h100-01"))
    assert execute(db, "SELECT state FROM nodes WHERE id = ?", (sick["nodeId"],)) == [("ready",)]


async def test_r5_failures_are_counted_in_the_metrics(aiohttp_client: Any, tmp_path: Path) -> None:
    """R5: a node the running reconciler cannot reconcile shows in bc_reconcile_failures_total,
    and the passes go on (the counter keeps rising while the policy stays broken)."""
    config = Config(
        db_path=tmp_path / "bc.db", root_token_file=tmp_path / "root.token", reconcile_interval=0.05
    )
    client = await aiohttp_client(make_app(config))
    api = Api(client, config.root_token_file.read_text().strip())
    pool, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    execute(
        config.db_path,
        'UPDATE pools SET policy = \'{"hugepages": "lots"}\', version = version + 1 WHERE id = ?',
        (pool,),
    )

    async def failures() -> float:
        scrape = await client.get("/metrics", headers={"Authorization": f"Bearer {api.token}"})
        text = await scrape.text()
        line = next(x for x in text.splitlines() if x.startswith("bc_reconcile_failures_total"))
        return float(line.split()[-1])

    seen = 0.0
    for _ in range(100):  # bounded: up to 5 s
        seen = await failures()
        if seen >= 2:
            break
        await asyncio.sleep(0.05)
    assert seen >= 2
    assert execute(config.db_path, "SELECT state FROM nodes") == [("quarantined",)]


async def test_r5_a_report_into_a_pool_whose_policy_no_longer_parses_is_taken(
    api: Api, db: Path
) -> None:
    """R5: on the report path too: a lost node of a pool whose stored policy no longer parses
    reports back (and then a changed inventory): each report is taken (200, liveness, the
    inventory), and the node is quarantined with the reason instead of lost forever."""
    pool, token = await pool_with_token(api)
    node = await joined(api, token, recorded("dgx-h100-01"))
    execute(
        db,
        'UPDATE pools SET policy = \'{"hugepages": "lots"}\', version = version + 1 WHERE id = ?',
        (pool,),
    )
    execute(db, "UPDATE nodes SET state = 'lost'")
    status, answer = await report(api, node, recorded("dgx-h100-01"))
    assert status == 200, answer
    state, reason = execute(db, "SELECT state, state_reason FROM nodes")[0]
    assert state == "quarantined" and reason.startswith("cannot be reconciled: policy")
    bigger = replace(recorded("dgx-h100-01"), memory_total_bytes=2**41)
    status, answer = await report(api, node, bigger)
    assert status == 200, answer
    view = await node_view(api, node)
    assert view["inventory"]["memoryTotalBytes"] == 2**41 and view["state"] == "quarantined"


def test_r5_a_pass_stops_when_sqlite_has_rolled_the_whole_transaction_back(
    tmp_path: Path,
) -> None:
    """R5: isolation is per savepoint only while the transaction lives: when SQLite itself
    rolled it all back (disk full, I/O error), the failure stops the pass instead of the rest
    of it running in autocommit."""

    def torn(db: Any) -> None:
        db.execute("ROLLBACK")  # what SQLITE_FULL or SQLITE_IOERR do to the transaction
        raise RuntimeError("disk full")

    def pass_(db: Any) -> None:
        isolated(db, "node", "node_x", torn, db)
        db.execute("INSERT INTO t VALUES (1)")  # the rest of a pass, with no transaction left

    store = Store(tmp_path / "bc.db")
    try:
        store.transact(lambda db: db.execute("CREATE TABLE t (x)"))
        with pytest.raises(Exception, match=r"disk full|no transaction"):
            store.transact(pass_)
        assert store.reader.execute("SELECT count(*) FROM t").fetchone() == (0,)
        assert store.transact(lambda db: isolated(db, "node", "node_x", lambda: 7)) == 7
    finally:
        store.close()
