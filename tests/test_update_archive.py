"""pools.update, pools.archive and the tenancy teardown: U1–U3, A1–A2, T1."""

from pathlib import Path

from tests.conftest import Api, execute, snapshot
from tests.nodes import held, joined, pool_with_token, recorded


async def test_u1_update_replaces_policy_bumps_version_and_emits(api: Api, db: Path) -> None:
    """U1: the policy is replaced whole, version +1, pool.updated."""
    site = await api.site()
    pool = await api.pool(site, policy={"maxPending": "6h", "hugepages": {"2Mi": 64}})
    updated = await api.ok(
        "compute/pools/update",
        {"tenantId": "root", "poolId": pool["id"], "policy": {"maxPending": "1h"}},
    )
    assert updated["policy"] == {"maxPending": "1h"}
    assert updated["version"] == 2
    model = await api.ok(
        "compute/pools/update", {"tenantId": "root", "poolId": pool["id"], "gpuModel": "H200"}
    )
    assert model["gpuModel"] == "H200" and model["version"] == 3
    assert model["policy"] == {"maxPending": "1h"}
    events = await api.ok("compute/events/list", {"tenantId": "root", "types": ["pool.updated"]})
    assert [(e["data"]["version"], e["data"]["changed"]) for e in events["items"]] == [
        (2, ["policy"]),
        (3, ["gpuModel"]),
    ]


async def test_u1_neither_field_is_invalid_input(api: Api, db: Path) -> None:
    """U1: an update with neither policy nor gpuModel is INVALID_INPUT."""
    site = await api.site()
    pool = await api.pool(site)
    before = snapshot(db)
    await api.err(
        "compute/pools/update",
        {"tenantId": "root", "poolId": pool["id"]},
        "INVALID_INPUT",
        "policy",
    )
    assert snapshot(db) == before


async def test_u1_class_site_sharing_agent_cannot_change(api: Api, db: Path) -> None:
    """U1: class, site, sharing and agent are not fields of update: unknown, INVALID_INPUT."""
    site = await api.site()
    pool = await api.pool(site)
    before = snapshot(db)
    for field, value in (
        ("class", "vps-host"),
        ("siteId", site),
        ("sharing", "mig"),
        ("agent", "none"),
    ):
        await api.err(
            "compute/pools/update",
            {"tenantId": "root", "poolId": pool["id"], "policy": {}, field: value},
            "INVALID_INPUT",
            field,
        )
    assert snapshot(db) == before


async def test_u1_owner_only_and_validated_as_on_create(api: Api, db: Path) -> None:
    """U1, P6: update is owner only (NOT_FOUND for others); the policy is validated as on create."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site, sharing="mig"))["id"]
    await api.offer(pool, "acme")
    acme = await api.token_for("acme")
    before = snapshot(db)
    await api.err(
        "compute/pools/update",
        {"tenantId": "acme", "poolId": pool, "policy": {}},
        "NOT_FOUND",
        "poolId",
        acme,
    )
    await api.err(
        "compute/pools/update",
        {"tenantId": "root", "poolId": pool, "policy": {"migLayout": {"default": ["1g.18gb"]}}},
        "INVALID_INPUT",
        "policy.migLayout.default",
    )
    # A gpuModel change re-checks the stored policy against the new model.
    await api.ok(
        "compute/pools/update",
        {
            "tenantId": "root",
            "poolId": pool,
            "policy": {"migLayout": {"default": ["3g.40gb", "3g.40gb"]}},
        },
    )
    before = snapshot(db)
    await api.err(
        "compute/pools/update",
        {"tenantId": "root", "poolId": pool, "gpuModel": "L40S"},
        "INVALID_INPUT",
        "policy.migLayout",
    )
    assert snapshot(db) == before


async def test_u1_authz_rows_refreshed_for_owner_and_offered(api: Api, db: Path) -> None:
    """U1: the authz rows of the owner and every offered tenant follow a gpuModel change."""
    await api.tenant("acme")
    await api.tenant("beta")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "acme")
    await api.offer(pool, "beta")
    await api.ok("compute/pools/update", {"tenantId": "root", "poolId": pool, "gpuModel": "B200"})
    rows = execute(db, "SELECT tenant_id, gpu_model, owned FROM pool_authz ORDER BY tenant_id")
    assert rows == [("acme", "B200", 0), ("beta", "B200", 0), ("root", "B200", 1)]
    # A statement keyed on the old model no longer matches.
    only_h100 = await api.token_for(
        "acme",
        [
            {
                "effect": "allow",
                "actions": ["compute:pools:read"],
                "resources": ["compute-pool"],
                "conditions": {"gpuModel": ["H100"]},
            }
        ],
    )
    await api.err(
        "compute/pools/get", {"tenantId": "acme", "poolId": pool}, "NOT_FOUND", token=only_h100
    )


async def test_u1_archived_pool_cannot_be_updated(api: Api, db: Path) -> None:
    """U1, A1: an archived pool takes no update."""
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    before = snapshot(db)
    await api.err(
        "compute/pools/update", {"tenantId": "root", "poolId": pool, "policy": {}}, "INVALID_STATE"
    )
    assert snapshot(db) == before


async def test_u2_single_tenant_on_needs_at_most_one_offer(api: Api, db: Path) -> None:
    """U2: turning singleTenant on is INVALID_STATE with two offered tenants or includeDescendants."""
    await api.tenant("acme")
    await api.tenant("beta")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "acme")
    await api.offer(pool, "beta")
    body = {"tenantId": "root", "poolId": pool, "policy": {"singleTenant": True}}
    before = snapshot(db)
    await api.err("compute/pools/update", body, "INVALID_STATE", "policy.singleTenant")
    assert snapshot(db) == before
    await api.ok(
        "compute/pools/unoffer", {"tenantId": "root", "poolId": pool, "toTenantId": "beta"}
    )
    await api.offer(pool, "acme", includeDescendants=True)
    await api.err("compute/pools/update", body, "INVALID_STATE", "policy.singleTenant")
    await api.offer(pool, "acme", includeDescendants=False)
    assert (await api.ok("compute/pools/update", body))["policy"] == {"singleTenant": True}


async def test_u3_mig_layout_and_prewarm_images_are_stored_and_validated(api: Api) -> None:
    """U3: migLayout and prewarmImages are stored and validated now; nodes take them later."""
    site = await api.site()
    pool = (await api.pool(site, sharing="mig", gpuModel="H200"))["id"]
    policy = {
        "migLayout": {
            "default": ["1g.18gb"] * 7,
            "GPU-0b4c2c6f-6b9e-4b8e-9c9c-2f6f1c6f9a11": ["7g.141gb"],
        },
        "prewarmImages": [
            "nvcr.io/nvidia/pytorch:25.01-py3",
            "ghcr.io/acme/train@sha256:" + "b" * 64,
        ],
    }
    updated = await api.ok(
        "compute/pools/update", {"tenantId": "root", "poolId": pool, "policy": policy}
    )
    assert updated["policy"] == policy
    await api.err(
        "compute/pools/update",
        {"tenantId": "root", "poolId": pool, "policy": {"migLayout": {"default": ["1g.18gb"] * 8}}},
        "INVALID_INPUT",
        "policy.migLayout.default",
    )


async def test_a1_archive_removes_offers_quotas_and_authz(api: Api, db: Path) -> None:
    """A1: every offer removed, offered quotas drop to in use, their authz rows removed."""
    await api.tenant("acme")
    await api.tenant("beta")
    pool, token = await pool_with_token(api)
    await joined(api, token, recorded("dgx-h100-01"))
    await api.offer(pool, "acme", {"gpu": 32})
    await api.offer(pool, "beta", {"gpu": 8})
    await held(api, pool, "acme", {"gpu": 5}, await api.token_for("acme"))
    archived = await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    assert archived["archived"] is True and archived["offers"] == []
    rows = execute(
        db, "SELECT tenant_id, max, used FROM quotas WHERE tenant_id != 'root' ORDER BY tenant_id"
    )
    assert rows == [("acme", 5, 5), ("beta", 0, 0)]
    assert execute(db, "SELECT tenant_id FROM pool_authz") == [("root",)]
    assert execute(db, "SELECT count(*) FROM pool_offers") == [(0,)]


async def test_a2_archive_is_idempotent_and_lists_unoffered_tenants(api: Api, db: Path) -> None:
    """A2: archiving again returns the pool unchanged; pool.archived lists the unoffered tenants."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "acme")
    first = await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    before = snapshot(db)
    again = await api.ok("compute/pools/archive", {"tenantId": "root", "poolId": pool})
    assert again == first
    assert snapshot(db) == before
    events = await api.ok("compute/events/list", {"tenantId": "root", "types": ["pool.archived"]})
    assert [e["data"] for e in events["items"]] == [{"unofferedTenants": ["acme"]}]
    acme = await api.token_for("acme")
    seen = await api.ok(
        "compute/events/list", {"tenantId": "acme", "types": ["pool.archived"]}, acme
    )
    assert len(seen["items"]) == 1


async def test_a1_only_the_owner_archives(api: Api, db: Path) -> None:
    """A1: archive is owner only; an offered tenant gets NOT_FOUND."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "acme")
    acme = await api.token_for("acme")
    before = snapshot(db)
    await api.err(
        "compute/pools/archive", {"tenantId": "acme", "poolId": pool}, "NOT_FOUND", "poolId", acme
    )
    assert snapshot(db) == before


async def test_t1_tenant_deletion_teardown(api: Api, db: Path) -> None:
    """T1: archive its pools (reason tenant deleted, offered quotas zeroed), withdraw offers to it,
    revoke its credentials."""
    await api.tenant("acme")
    await api.tenant("beta")
    acme = await api.token_for("acme")
    custom = await api.site("acme", kind="custom", token=acme)
    acme_pool = (await api.pool(custom, tenant_id="acme", token=acme))["id"]
    await api.ok(
        "compute/pools/offer",
        {"tenantId": "acme", "poolId": acme_pool, "toTenantId": "beta", "quota": {"gpu": 4}},
        acme,
    )
    root_pool = (await api.pool(await api.site()))["id"]
    await api.offer(root_pool, "acme", {"gpu": 16})
    deleted = await api.ok("iam/tenants/delete", {"tenantId": "acme"})
    assert deleted == {
        "tenantId": "acme",
        "archivedPools": [acme_pool],
        "withdrawnOffers": [root_pool],
        "revokedCredentials": 1,
    }
    assert execute(
        db,
        "SELECT tenant_id, max FROM quotas WHERE pool_id = ? AND tenant_id = 'beta'",
        (acme_pool,),
    ) == [("beta", 0)]
    archived = await api.ok("compute/events/list", {"tenantId": "root", "types": ["pool.archived"]})
    assert archived["items"][0]["data"] == {
        "unofferedTenants": ["beta"],
        "reason": "tenant deleted",
    }
    unoffered = await api.ok(
        "compute/events/list", {"tenantId": "root", "types": ["pool.unoffered"]}
    )
    assert [(e["poolId"], e["data"]["toTenantId"]) for e in unoffered["items"]] == [
        (root_pool, "acme")
    ]
    status, answer = await api.call("compute/pools/list", {"tenantId": "acme"}, acme)
    assert (status, answer["error"]["code"]) == (401, "UNAUTHENTICATED")
    await api.err("compute/pools/list", {"tenantId": "acme"}, "NOT_FOUND", "tenantId")
    await api.err("iam/tenants/delete", {"tenantId": "acme"}, "NOT_FOUND", "tenantId")


async def test_t1_root_cannot_be_deleted_and_children_first(api: Api, db: Path) -> None:
    """T1: the root tenant cannot be deleted; a tenant with live children is INVALID_STATE."""
    await api.tenant("acme")
    await api.tenant("acme-dev", parentTenantId="acme")
    before = snapshot(db)
    await api.err("iam/tenants/delete", {"tenantId": "root"}, "INVALID_INPUT", "tenantId")
    await api.err("iam/tenants/delete", {"tenantId": "acme"}, "INVALID_STATE", "tenantId")
    assert snapshot(db) == before
    await api.ok("iam/tenants/delete", {"tenantId": "acme-dev"})
    await api.ok("iam/tenants/delete", {"tenantId": "acme"})


async def test_t1_owner_of_a_withdrawn_offer_gets_pool_unoffered(api: Api) -> None:
    """T1: withdrawing an offer made to a deleted tenant emits pool.unoffered to the pool's owner."""
    await api.tenant("acme")
    await api.tenant("beta")
    beta = await api.token_for("beta")
    site = await api.site("beta", kind="custom", token=beta)
    pool = (await api.pool(site, tenant_id="beta", token=beta))["id"]
    await api.ok(
        "compute/pools/offer",
        {"tenantId": "beta", "poolId": pool, "toTenantId": "acme", "quota": {"gpu": 2}},
        beta,
    )
    await api.ok("iam/tenants/delete", {"tenantId": "acme"})
    seen = await api.ok(
        "compute/events/list", {"tenantId": "beta", "types": ["pool.unoffered"]}, beta
    )
    assert [(e["poolId"], e["data"]) for e in seen["items"]] == [(pool, {"toTenantId": "acme"})]
    owner = await api.ok("compute/pools/get", {"tenantId": "beta", "poolId": pool}, beta)
    assert owner["offers"] == [] and owner["archived"] is False
