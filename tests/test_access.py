"""R1: every method of the table makes its own IAM decision, also inside the caller's tenant."""

import asyncio
import dataclasses
import time
from pathlib import Path
from typing import Any

import pytest

from controlplane.api.keys import RUNTIME
from controlplane.api.method import Method
from controlplane.api.routes import ALL_METHODS
from controlplane.services.access import Access
from tests.conftest import Api, all_tables, execute
from tests.nodes import joined, recorded, twin, wire

ALLOW_ALL: dict[str, Any] = {"effect": "allow", "actions": ["*"], "resources": ["*"]}


# Written by the daemon's own loop, whatever the callers do: the leader's lease renewal and
# each replica's liveness and behind stamps.
BACKGROUND_TABLES = ("leader_lease", "replica_behind", "node_liveness")


def everything(db: Path | str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table the requests write: a refused call must change none of them."""
    rows = all_tables(db)
    return {table: rows[table] for table in rows if table not in BACKGROUND_TABLES}


def all_but(action: str) -> list[dict[str, Any]]:
    """A credential allowed everything except one action."""
    return [ALLOW_ALL, {"effect": "deny", "actions": [action], "resources": ["*"]}]


async def world(api: Api) -> dict[str, Any]:
    """Tenant acme with a pool of its own (a joined DGX H100, a placed reservation, an offer to
    globex), root's budget meter, and one object of every kind a method can name."""
    await api.tenant("acme")
    await api.tenant("globex")
    await api.tenant("doomed")
    admin = await api.token_for("acme")
    site = await api.site("acme", kind="custom", token=admin)
    pool = (await api.pool(site, "acme", admin))["id"]
    await api.ok(
        "compute/pools/offer",
        {"tenantId": "acme", "poolId": pool, "toTenantId": "globex", "quota": {"vcpu": 8}},
        admin,
    )
    token = await api.ok(
        "compute/joinTokens/create", {"tenantId": "acme", "poolId": pool, "maxUses": 5}, admin
    )
    node = await joined(api, token["token"], recorded("dgx-h100-01"))
    other = await joined(api, token["token"], twin("dgx-h100-01", 2))
    reservation = await api.ok(
        "compute/reservations/create",
        {"tenantId": "acme", "poolId": pool, "resources": {"gpu": 1}, "idempotencyKey": "k1"},
        admin,
    )
    assert reservation["state"] == "placed", reservation
    credential = await api.ok("iam/credentials/create", {"tenantId": "acme", "name": "spare"})
    return {
        "admin": admin,
        "site": site,
        "pool": pool,
        "node": node,
        "other": other,
        "reservation": reservation["id"],
        "credential": credential["credentialId"],
    }


def bodies(w: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A valid body for every credential method, acting for acme (root for fleet methods)."""
    acme = {"tenantId": "acme"}
    pool = {**acme, "poolId": w["pool"]}
    return {
        "/api/iam/tenants/create": {"tenantId": "newco"},
        "/api/iam/tenants/delete": {"tenantId": "doomed"},
        "/api/iam/credentials/create": {**acme, "name": "more"},
        "/api/iam/credentials/revoke": {**acme, "credentialId": w["credential"]},
        "/api/iam/credentials/whoami": {},
        "/api/compute/sites/create": {**acme, "name": "b2", "region": "eu", "kind": "custom"},
        "/api/compute/sites/list": acme,
        "/api/compute/pools/list": acme,
        "/api/compute/pools/get": pool,
        "/api/compute/pools/create": {**acme, "siteId": w["site"], "class": "metal-host"},
        "/api/compute/pools/capacity": pool,
        "/api/compute/pools/offer": {**pool, "toTenantId": "globex", "quota": {"vcpu": 4}},
        "/api/compute/pools/unoffer": {**pool, "toTenantId": "globex"},
        "/api/compute/pools/update": {**pool, "policy": {"maxPending": "1h"}},
        "/api/compute/pools/archive": pool,
        "/api/compute/quotas/set": {**pool, "forTenantId": "acme", "quota": {"vcpu": 16}},
        "/api/compute/quotas/list": acme,
        "/api/compute/capacity/byPool": pool,
        "/api/compute/events/list": acme,
        "/api/compute/joinTokens/create": pool,
        "/api/compute/nodes/list": pool,
        "/api/compute/nodes/get": {**acme, "nodeId": w["node"]["nodeId"]},
        "/api/compute/nodes/cordon": {**acme, "nodeId": w["node"]["nodeId"], "reason": "r"},
        "/api/compute/nodes/uncordon": {**acme, "nodeId": w["node"]["nodeId"]},
        "/api/compute/nodes/drain": {**acme, "nodeId": w["node"]["nodeId"], "reason": "r"},
        "/api/compute/nodes/remove": {**acme, "nodeId": w["node"]["nodeId"], "force": True},
        "/api/compute/reservations/create": {**pool, "resources": {"gpu": 1}},
        "/api/compute/reservations/get": {**acme, "reservationId": w["reservation"]},
        "/api/compute/reservations/list": acme,
        "/api/compute/reservations/end": {**acme, "reservationId": w["reservation"]},
        "/api/compute/budgets/set": {**acme, "meter": "gpu.h100.hours", "limit": 10},
        "/api/compute/budgets/get": {**acme, "meter": "gpu.h100.hours"},
    }


def test_r1_a_method_cannot_be_registered_without_its_decision() -> None:
    """R1: the method table has no default decision; every method names its action."""
    with pytest.raises(TypeError):
        Method("/api/x/y/z", object, object, object, "summary")  # type: ignore[call-arg, arg-type]
    assert all(isinstance(m.access, Access) for m in ALL_METHODS)
    (access,) = [f for f in dataclasses.fields(Method) if f.name == "access"]
    assert access.default is dataclasses.MISSING
    for method in ALL_METHODS:
        service, _, _ = method.access.action.split(":")
        assert service in ("compute", "iam"), method.path


async def test_r1_every_method_refuses_a_credential_denied_its_action(api: Api, db: Path) -> None:
    """R1: walking every registered method with a credential allowed everything but that
    method's action: each answers NOT_FOUND or PERMISSION_DENIED and changes nothing, while a
    read by the same credential shape without the deny is answered."""
    w = await world(api)
    table = bodies(w)
    credential_methods = [m for m in ALL_METHODS if m.auth == "credential"]
    assert {m.path for m in credential_methods} == set(table), "a method without a walk body"
    for method in credential_methods:
        acting = "root" if method.access.on == "fleet" else "acme"
        denied = await api.token_for(acting, all_but(method.access.action))
        before = everything(db)
        status, answer = await api.call(
            method.path.removeprefix("/api/"), table[method.path], denied
        )
        assert status in (403, 404), (method.path, status, answer)
        assert answer["error"]["code"] in ("NOT_FOUND", "PERMISSION_DENIED"), method.path
        if status == 403:  # refused by this deny, not by another rule (admin-only credentials)
            assert answer["error"]["details"].get("action") == method.access.action, answer
        assert everything(db) == before, method.path
    # The same walk's reads, with nothing denied, are answered: the refusals above were the deny.
    allowed = await api.token_for("acme", [ALLOW_ALL])
    for method in credential_methods:
        if method.access.on != "fleet" and method.path.endswith(("/get", "/list", "/capacity")):
            await api.ok(method.path.removeprefix("/api/"), table[method.path], allowed)


async def test_r1_node_credentials_reach_only_their_own_node(api: Api) -> None:
    """R1: nodes/report and nodes/spec with one node's credential for another node: NOT_FOUND."""
    w = await world(api)
    node, other = w["node"], w["other"]
    headers = {"Authorization": f"Bearer {node['token']}"}
    for path, body in (
        ("nodes/report", {"nodeId": other["nodeId"], "inventory": wire(twin("dgx-h100-01", 2))}),
        ("nodes/spec", {"nodeId": other["nodeId"]}),
    ):
        response = await api.client.post(f"/api/compute/{path}", json=body, headers=headers)
        assert response.status == 404, path
        assert (await response.json())["error"]["details"]["field"] == "nodeId"


async def test_r1_reservations_and_budgets_decide_inside_the_tenant(api: Api, db: Path) -> None:
    """R1: a credential denied compute:reservations:*, or allowed only compute:pools:read, or only
    A100 pools, can neither get nor end the tenant's H100 reservation, nor list it or its pool's
    events; budgets/get decides compute:budgets:read."""
    w = await world(api)
    get = {"tenantId": "acme", "reservationId": w["reservation"]}
    a100_only = [{**ALLOW_ALL, "conditions": {"gpuModel": ["A100"]}}]
    for statements in (
        [ALLOW_ALL, {"effect": "deny", "actions": ["compute:reservations:*"], "resources": ["*"]}],
        [{"effect": "allow", "actions": ["compute:pools:read"], "resources": ["*"]}],
        [*a100_only, {**ALLOW_ALL, "resources": ["compute-tenant"]}],
    ):
        token = await api.token_for("acme", statements)
        before = everything(db)
        await api.err("compute/reservations/get", get, "NOT_FOUND", "reservationId", token)
        await api.err("compute/reservations/end", get, "NOT_FOUND", "reservationId", token)
        assert everything(db) == before
    narrow = await api.token_for(
        "acme", [*a100_only, {**ALLOW_ALL, "resources": ["compute-tenant"]}]
    )
    listed = await api.ok("compute/reservations/list", {"tenantId": "acme"}, narrow)
    assert listed["items"] == []
    events = await api.ok("compute/events/list", {"tenantId": "acme"}, narrow)
    assert events["items"], "tenant events without a pool stay visible"
    assert all(e["poolId"] is None for e in events["items"])
    full = await api.ok("compute/events/list", {"tenantId": "acme"}, w["admin"])
    assert any(e["poolId"] == w["pool"] for e in full["items"])
    assert events["next"] == full["next"], "the cursor moves past the items left out"
    no_budgets = await api.token_for("acme", all_but("compute:budgets:read"))
    await api.err(
        "compute/budgets/get",
        {"tenantId": "acme", "meter": "gpu.h100.hours"},
        "PERMISSION_DENIED",
        token=no_budgets,
    )
    # The admin still reads and ends it: the decisions above were the statements'.
    assert (await api.ok("compute/reservations/end", get, w["admin"]))["state"] == "ended"


async def test_r1_a_tenant_reads_and_ends_its_reservation_after_the_offer_is_gone(
    api: Api,
) -> None:
    """R1: a reservation is decided on its pool as it is now, so an offered tenant whose offer
    was withdrawn can still read and end what it holds there."""
    w = await world(api)
    globex = await api.token_for("globex")
    held = await api.ok(
        "compute/reservations/create",
        {"tenantId": "globex", "poolId": w["pool"], "resources": {"vcpu": 2}},
        globex,
    )
    assert held["state"] == "placed", held
    await api.ok(
        "compute/pools/unoffer",
        {"tenantId": "acme", "poolId": w["pool"], "toTenantId": "globex"},
        w["admin"],
    )
    body = {"tenantId": "globex", "reservationId": held["id"]}
    assert (await api.ok("compute/reservations/get", body, globex))["state"] == "placed"
    assert (await api.ok("compute/reservations/end", body, globex))["state"] == "ended"


def test_r1_the_action_catalogue_is_published_in_the_readme() -> None:
    """R1: the README's action table has one row per registered method, as the table decides."""
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    for method in ALL_METHODS:
        decision = method.access.describe()
        if method.access.auth == "credential":
            decision = f"`{decision}`"
        assert f"| `{method.path.removeprefix('/api/')}` | {decision} |" in readme, method.path


async def test_r1_every_operation_describes_its_decision(api: Api) -> None:
    """R1: the OpenAPI document gives each operation's decision in its description."""
    document = await (await api.client.get("/api/openapi.json")).json()
    for method in ALL_METHODS:
        operation = document["paths"][method.path]["post"]
        assert operation["description"] == f"Authorization: {method.access.describe()}."


async def test_r1_lists_never_show_a_pool_the_credential_may_not_read(api: Api) -> None:
    """R1, L1: a credential allowed everything but compute:pools:read on H100 pools sees no
    trace of acme's H100 pool in events/list, reservations/list or quotas/list, as pools/get
    answers NOT_FOUND and pools/list leaves it out."""
    w = await world(api)
    hidden = {
        "effect": "deny",
        "actions": ["compute:pools:read"],
        "resources": ["compute-pool"],
        "conditions": {"gpuModel": ["H100"]},
    }
    token = await api.token_for("acme", [ALLOW_ALL, hidden])
    acme = {"tenantId": "acme"}
    await api.err("compute/pools/get", {**acme, "poolId": w["pool"]}, "NOT_FOUND", "poolId", token)
    assert (await api.ok("compute/pools/list", acme, token))["items"] == []
    events = (await api.ok("compute/events/list", acme, token))["items"]
    assert events and all(e["poolId"] != w["pool"] for e in events)
    assert (await api.ok("compute/reservations/list", acme, token))["items"] == []
    assert (await api.ok("compute/quotas/list", acme, token))["items"] == []


async def test_b5_a_write_queued_behind_its_credentials_revocation_is_refused(
    api: Api, db: Path
) -> None:
    """B5, R1: a mutation authenticated on the reader but queued on the writer behind the
    revocation of its credential is refused inside its transaction (UNAUTHENTICATED), never
    committed after the revocation was acknowledged."""
    await api.tenant("acme")
    created = await api.ok("iam/credentials/create", {"tenantId": "acme"})
    store = api.client.app[RUNTIME].db
    busy = asyncio.ensure_future(store.write(lambda _: time.sleep(0.5)))  # the writer is busy
    await asyncio.sleep(0.05)
    revoke = asyncio.ensure_future(
        api.call(
            "iam/credentials/revoke",
            {"tenantId": "acme", "credentialId": created["credentialId"]},
        )
    )
    await asyncio.sleep(0.1)  # the revocation is queued first
    body = {"tenantId": "acme", "name": "late", "region": "eu", "kind": "custom"}
    status, answer = await api.call("compute/sites/create", body, created["token"])
    await busy
    assert (await revoke)[0] == 200
    assert (status, answer["error"]["code"]) == (401, "UNAUTHENTICATED"), answer
    assert execute(db, "SELECT count(*) FROM sites WHERE name = 'late'") == [(0,)]
