"""IAM: bootstrap, tenants, credentials, statements (deny wins), root acting on the fleet."""

import os
import stat
from pathlib import Path

from controlplane.config import Config
from tests.conftest import Api, execute, snapshot, stored_bytes


async def test_bootstrap_root_token_file_is_0600_and_token_stored_hashed(
    api: Api, config: Config
) -> None:
    """The root token file is mode 0600; the database holds only a hash of the token."""
    mode = stat.S_IMODE(os.stat(config.root_token_file).st_mode)
    assert mode == 0o600
    token = config.root_token_file.read_text().strip()
    assert token.encode() not in stored_bytes(config.db_path)
    assert execute(config.db_path, "SELECT id, deleted_at FROM tenants") == [("root", None)]


async def test_credentials_shown_once_and_revoked(api: Api, db: Path) -> None:
    """A credential's token works until revoked; revoking again answers revoked: false."""
    await api.tenant("acme")
    created = await api.ok("iam/credentials/create", {"tenantId": "acme", "name": "ci"})
    assert created["credentialId"].startswith("cred_") and created["token"].startswith("bct_")
    assert created["token"].encode() not in stored_bytes(db)
    await api.ok("compute/pools/list", {"tenantId": "acme"}, created["token"])
    body = {"tenantId": "acme", "credentialId": created["credentialId"]}
    assert await api.ok("iam/credentials/revoke", body) == {
        "credentialId": created["credentialId"],
        "revoked": True,
    }
    status, answer = await api.call("compute/pools/list", {"tenantId": "acme"}, created["token"])
    assert (status, answer["error"]["code"]) == (401, "UNAUTHENTICATED")
    assert (await api.ok("iam/credentials/revoke", body))["revoked"] is False
    await api.err(
        "iam/credentials/revoke",
        {"tenantId": "root", "credentialId": created["credentialId"]},
        "NOT_FOUND",
        "credentialId",
    )


async def test_only_root_manages_tenants(api: Api, db: Path) -> None:
    """tenants.create and tenants.delete are root's; another tenant gets PERMISSION_DENIED."""
    await api.tenant("acme")
    acme = await api.token_for("acme")
    before = snapshot(db)
    await api.err("iam/tenants/create", {"tenantId": "evil"}, "PERMISSION_DENIED", token=acme)
    await api.err("iam/tenants/delete", {"tenantId": "acme"}, "PERMISSION_DENIED", token=acme)
    assert snapshot(db) == before
    await api.err("iam/tenants/create", {"tenantId": "acme"}, "CONFLICT", "tenantId")
    await api.err(
        "iam/tenants/create",
        {"tenantId": "kid", "parentTenantId": "nope"},
        "NOT_FOUND",
        "parentTenantId",
    )


async def test_a_tenant_credential_acts_only_for_its_tenant(api: Api, db: Path) -> None:
    """A credential may not act for another tenant (PERMISSION_DENIED); root acts for any (fleet)."""
    await api.tenant("acme")
    await api.tenant("beta")
    acme = await api.token_for("acme")
    await api.err("compute/pools/list", {"tenantId": "beta"}, "PERMISSION_DENIED", "tenantId", acme)
    await api.err(
        "iam/credentials/create", {"tenantId": "beta"}, "PERMISSION_DENIED", "tenantId", acme
    )
    assert (await api.ok("compute/pools/list", {"tenantId": "beta"}))["items"] == []
    await api.err("compute/pools/list", {"tenantId": "nobody"}, "NOT_FOUND", "tenantId")


async def test_limited_credentials_cannot_mint_credentials(api: Api, db: Path) -> None:
    """Only an admin credential manages credentials, so a limited one cannot widen itself."""
    await api.tenant("acme")
    limited = await api.token_for(
        "acme", [{"effect": "allow", "actions": ["*"], "resources": ["*"]}]
    )
    before = snapshot(db)
    await api.err(
        "iam/credentials/create", {"tenantId": "acme"}, "PERMISSION_DENIED", token=limited
    )
    assert snapshot(db) == before


async def test_deny_wins_over_allow(api: Api) -> None:
    """Statements: deny wins, no allow means deny, wildcards match action segments."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "acme")
    body = {"tenantId": "acme", "poolId": pool}
    allow_all = {"effect": "allow", "actions": ["compute:*"], "resources": ["*"]}
    deny_h100 = {
        "effect": "deny",
        "actions": ["compute:pools:*"],
        "resources": ["compute-pool"],
        "conditions": {"gpuModel": ["H100"], "owned": [False]},
    }
    denied = await api.token_for("acme", [allow_all, deny_h100])
    await api.err("compute/pools/get", body, "NOT_FOUND", "poolId", denied)
    assert (await api.ok("compute/pools/list", {"tenantId": "acme"}, denied))["items"] == []
    allowed = await api.token_for("acme", [allow_all])
    await api.ok("compute/pools/get", body, allowed)
    nothing = await api.token_for(
        "acme", [{"effect": "allow", "actions": ["compute:sites:read"], "resources": ["*"]}]
    )
    await api.err("compute/pools/get", body, "NOT_FOUND", "poolId", nothing)
    await api.ok("compute/sites/list", {"tenantId": "acme"}, nothing)


async def test_conditions_on_region_sharing_and_class(api: Api) -> None:
    """Conditions match the pool's authz attributes: region, sharing, class, owned."""
    await api.tenant("acme")
    site = await api.site()
    pool = (await api.pool(site))["id"]
    await api.offer(pool, "acme")
    body = {"tenantId": "acme", "poolId": pool}

    async def reader(conditions: dict[str, list[object]]) -> str:
        return await api.token_for(
            "acme",
            [
                {
                    "effect": "allow",
                    "actions": ["compute:pools:read"],
                    "resources": ["compute-pool"],
                    "conditions": conditions,
                }
            ],
        )

    await api.ok(
        "compute/pools/get",
        body,
        await reader({"region": ["eu-central"], "sharing": ["exclusive"]}),
    )
    await api.ok(
        "compute/pools/get", body, await reader({"class": ["metal-host"], "owned": [False]})
    )
    await api.err(
        "compute/pools/get", body, "NOT_FOUND", token=await reader({"region": ["us-east"]})
    )
    await api.err("compute/pools/get", body, "NOT_FOUND", token=await reader({"owned": [True]}))


async def test_owner_may_see_but_not_manage_gets_permission_denied(api: Api, db: Path) -> None:
    """An owner credential that may read a pool but not share it gets PERMISSION_DENIED."""
    await api.tenant("acme")
    await api.tenant("beta")
    site = await api.site("acme", kind="custom")
    pool = (await api.pool(site, tenant_id="acme"))["id"]
    reader = await api.token_for(
        "acme",
        [{"effect": "allow", "actions": ["compute:pools:read"], "resources": ["compute-pool"]}],
    )
    before = snapshot(db)
    await api.err(
        "compute/pools/offer",
        {"tenantId": "acme", "poolId": pool, "toTenantId": "beta", "quota": {"gpu": 1}},
        "PERMISSION_DENIED",
        token=reader,
    )
    assert snapshot(db) == before


async def test_sites_platform_kinds_are_roots(api: Api, db: Path) -> None:
    """Only root creates shared/dedicated sites; any tenant may create its own custom site."""
    await api.tenant("acme")
    acme = await api.token_for("acme")
    before = snapshot(db)
    for kind in ("shared", "dedicated"):
        await api.err(
            "compute/sites/create",
            {"tenantId": "acme", "name": "x", "region": "eu", "kind": kind},
            "PERMISSION_DENIED",
            "kind",
            acme,
        )
    assert snapshot(db) == before
    site = await api.site("acme", kind="custom", token=acme)
    listed = await api.ok("compute/sites/list", {"tenantId": "acme"}, acme)
    assert [(s["id"], s["ownerTenantId"], s["kind"]) for s in listed["items"]] == [
        (site, "acme", "custom")
    ]
    await api.err(
        "compute/sites/create",
        {"tenantId": "acme", "name": "fra1", "region": "eu", "kind": "custom"},
        "CONFLICT",
        "name",
        acme,
    )
    assert (await api.ok("compute/sites/list", {"tenantId": "root"}))["items"] == []


async def test_root_statements_decide_acting_for_other_tenants(api: Api, db: Path) -> None:
    """Root acts for other tenants through compute-fleet, so its statements can forbid that."""
    await api.tenant("acme")
    own_only = await api.token_for(
        "root",
        [
            {
                "effect": "allow",
                "actions": ["compute:*"],
                "resources": ["compute-tenant", "compute-pool"],
            }
        ],
    )
    before = snapshot(db)
    await api.err(
        "compute/pools/list", {"tenantId": "acme"}, "PERMISSION_DENIED", "tenantId", own_only
    )
    await api.err(
        "compute/sites/create",
        {"tenantId": "acme", "name": "x", "region": "eu", "kind": "custom"},
        "PERMISSION_DENIED",
        "tenantId",
        own_only,
    )
    assert snapshot(db) == before
    assert (await api.ok("compute/pools/list", {"tenantId": "root"}, own_only))["items"] == []
    fleet_reader = await api.token_for(
        "root",
        [
            {"effect": "allow", "actions": ["compute:pools:read"], "resources": ["*"]},
            {"effect": "deny", "actions": ["compute:sites:*"], "resources": ["compute-fleet"]},
        ],
    )
    await api.ok("compute/pools/list", {"tenantId": "acme"}, fleet_reader)
    await api.err(
        "compute/sites/list", {"tenantId": "acme"}, "PERMISSION_DENIED", token=fleet_reader
    )


async def test_quotas_list_hides_pools_the_credential_cannot_read(api: Api) -> None:
    """A pool that is NOT_FOUND to a credential shows no quota rows either."""
    await api.tenant("acme")
    site = await api.site()
    h100 = (await api.pool(site, gpuModel="H100"))["id"]
    a100 = (await api.pool(site, gpuModel="A100"))["id"]
    await api.offer(h100, "acme")
    await api.offer(a100, "acme")
    only_a100 = await api.token_for(
        "acme",
        [
            {"effect": "allow", "actions": ["compute:*"], "resources": ["compute-tenant"]},
            {
                "effect": "allow",
                "actions": ["compute:*"],
                "resources": ["compute-pool"],
                "conditions": {"gpuModel": ["A100"]},
            },
        ],
    )
    listed = await api.ok("compute/quotas/list", {"tenantId": "acme"}, only_a100)
    assert {q["poolId"] for q in listed["items"]} == {a100}
    await api.err(
        "compute/quotas/list",
        {"tenantId": "acme", "poolId": h100},
        "NOT_FOUND",
        "poolId",
        only_a100,
    )
