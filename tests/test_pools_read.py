"""pools.list, pools.get, pools.capacity and capacity.byPool: L1–L3."""

from pathlib import Path

from tests.conftest import Api, execute

READ_TENANT = {
    "effect": "allow",
    "actions": ["compute:pools:read"],
    "resources": ["compute-tenant"],
}


async def test_l1_list_owned_and_offered_with_own_quota_rows(api: Api) -> None:
    """L1: list returns owned and offered pools with owned, archived and the caller's quota rows."""
    await api.tenant("acme")
    site = await api.site()
    offered = (await api.pool(site))["id"]
    hidden = (await api.pool(site))["id"]
    await api.offer(offered, "acme", {"gpu": 32})
    acme = await api.token_for("acme")
    own_site = await api.site("acme", kind="custom", token=acme)
    owned = (await api.pool(own_site, tenant_id="acme", token=acme))["id"]
    listed = await api.ok("compute/pools/list", {"tenantId": "acme"}, acme)
    by_id = {p["id"]: p for p in listed["items"]}
    assert set(by_id) == {offered, owned}
    assert hidden not in by_id
    assert by_id[offered]["owned"] is False and by_id[owned]["owned"] is True
    assert all(p["archived"] is False for p in listed["items"])
    assert by_id[offered]["quotas"] == [
        {
            "tenantId": "acme",
            "poolId": offered,
            "resource": "gpu",
            "max": 32,
            "used": 0,
            "available": 32,
        }
    ]
    assert "offers" not in by_id[offered] and by_id[owned]["offers"] == []


async def test_l1_archived_pools_only_for_their_owner(api: Api) -> None:
    """L1, A2: an archived pool is listed for its owner (archived: true) and for nobody else."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "acme")
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    acme = await api.token_for("acme")
    assert (await api.ok("compute/pools/list", {"tenantId": "acme"}, acme))["items"] == []
    root = await api.ok("compute/pools/list", {"tenantId": "root"})
    assert [(p["id"], p["archived"]) for p in root["items"]] == [(pool, True)]


async def test_l1_items_are_decided_one_by_one(api: Api) -> None:
    """L1: each item is checked as compute:pools:read on the pool; only allowed ones return."""
    await api.tenant("acme")
    site = await api.site()
    h100 = (await api.pool(site, gpuModel="H100"))["id"]
    a100 = (await api.pool(site, gpuModel="A100"))["id"]
    await api.offer(h100, "acme")
    await api.offer(a100, "acme")
    only_h100 = await api.token_for(
        "acme",
        [
            READ_TENANT,
            {
                "effect": "allow",
                "actions": ["compute:pools:read"],
                "resources": ["compute-pool"],
                "conditions": {"gpuModel": ["H100"]},
            },
        ],
    )
    listed = await api.ok("compute/pools/list", {"tenantId": "acme"}, only_h100)
    assert [p["id"] for p in listed["items"]] == [h100]
    await api.ok("compute/pools/get", {"tenantId": "acme", "poolId": h100}, only_h100)
    await api.err(
        "compute/pools/get", {"tenantId": "acme", "poolId": a100}, "NOT_FOUND", "poolId", only_h100
    )


async def test_l1_coarse_decision_on_the_tenant(api: Api) -> None:
    """L1: without compute:pools:read on the tenant, list is PERMISSION_DENIED."""
    await api.tenant("acme")
    pool_only = await api.token_for(
        "acme",
        [{"effect": "allow", "actions": ["compute:pools:read"], "resources": ["compute-pool"]}],
    )
    await api.err("compute/pools/list", {"tenantId": "acme"}, "PERMISSION_DENIED", token=pool_only)


async def test_l2_get_not_found_when_not_owned_nor_offered_or_archived(api: Api) -> None:
    """L2: get is NOT_FOUND for a pool neither owned nor offered, or archived for a non-owner."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    acme = await api.token_for("acme")
    missing = await api.err(
        "compute/pools/get", {"tenantId": "acme", "poolId": pool}, "NOT_FOUND", "poolId", acme
    )
    ghost = "pool_01m8p96ta1gm587tbv5pw7gvfq"
    absent = await api.err(
        "compute/pools/get", {"tenantId": "acme", "poolId": ghost}, "NOT_FOUND", "poolId", acme
    )
    assert missing["message"] == absent["message"]  # existence is never revealed
    await api.offer(pool, "acme")
    got = await api.ok("compute/pools/get", {"tenantId": "acme", "poolId": pool}, acme)
    assert got["owned"] is False
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    await api.err(
        "compute/pools/get", {"tenantId": "acme", "poolId": pool}, "NOT_FOUND", "poolId", acme
    )
    owner = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool})
    assert owner["archived"] is True


async def test_l3_capacity_equals_capacity_by_pool(api: Api, db: Path) -> None:
    """L3: pools.capacity gives one rollup row per resource, the same answer as capacity.byPool."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    body = {"tenantId": "root", "poolId": pool}
    assert await api.ok("compute/pools/capacity", body) == {"items": []}
    # Nodes and their rows arrive with the agent; stand two in directly.
    for node, (vcpu, used) in {"node_a": (100, 10), "node_b": (50, 0)}.items():
        execute(
            db,
            "INSERT INTO nodes (id, pool_id, hostname, state, created_at) VALUES (?, ?, ?, 'ready', 'now')",
            (node, pool, node),
        )
        execute(
            db,
            "INSERT INTO node_resources (node_id, resource, capacity, allocated) VALUES (?, 'vcpu', ?, ?)",
            (node, vcpu, used),
        )
        execute(
            db,
            "INSERT INTO node_resources (node_id, resource, capacity, allocated) VALUES (?, 'gpu', 8, 8)",
            (node,),
        )
    rollup = await api.ok("compute/pools/capacity", body)
    assert rollup == {
        "items": [
            {
                "poolId": pool,
                "resource": "gpu",
                "total": 16,
                "schedulable": 16,
                "allocated": 16,
                "available": 0,
                "releasing": 0,
                "offered": 0,
                "coverage": None,  # C5: nothing offered
            },
            {
                "poolId": pool,
                "resource": "vcpu",
                "total": 150,
                "schedulable": 150,
                "allocated": 10,
                "available": 140,
                "releasing": 0,
                "offered": 0,
                "coverage": None,  # C5: nothing offered
            },
        ]
    }
    assert await api.ok("compute/capacity/byPool", body) == rollup


async def test_l3_capacity_not_found_when_not_visible(api: Api) -> None:
    """L3: capacity of a pool the tenant cannot see is NOT_FOUND."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    acme = await api.token_for("acme")
    for path in ("compute/pools/capacity", "compute/capacity/byPool"):
        await api.err(path, {"tenantId": "acme", "poolId": pool}, "NOT_FOUND", "poolId", acme)
    await api.offer(pool, "acme")
    assert await api.ok("compute/capacity/byPool", {"tenantId": "acme", "poolId": pool}, acme) == {
        "items": []
    }


async def test_offered_tenants_do_not_see_the_owners_secrets(api: Api) -> None:
    """Security: the kubeadm token in a policy is the owner's; an offered tenant sees the rest."""
    await api.tenant("acme")
    site = await api.site()
    join = {
        "apiServer": "https://k8s.example:6443",
        "token": "abcdef.0123456789abcdef",
        "caCertHash": "sha256:" + "a" * 64,
    }
    pool = (
        await api.pool(
            site, policy={"kubernetes": join, "platformOperated": True, "maxPending": "6h"}
        )
    )["id"]
    await api.offer(pool, "acme")
    acme = await api.token_for("acme")
    seen = await api.ok("compute/pools/get", {"tenantId": "acme", "poolId": pool}, acme)
    assert seen["policy"] == {
        "kubernetes": {"apiServer": join["apiServer"], "caCertHash": join["caCertHash"]},
        "platformOperated": True,
        "maxPending": "6h",
    }
    listed = await api.ok("compute/pools/list", {"tenantId": "acme"}, acme)
    assert "token" not in listed["items"][0]["policy"]["kubernetes"]
    owner = await api.ok("compute/pools/get", {"tenantId": "root", "poolId": pool})
    assert owner["policy"]["kubernetes"]["token"] == join["token"]
