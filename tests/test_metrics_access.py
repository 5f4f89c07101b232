"""F4: /metrics answers a root credential's bearer token only (looked up off the event loop);
with --metrics-listen it is served there without a token and is no path of the API port; and
no request that has not authenticated reads the database (nodes/join apart)."""

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
import msgspec

from controlplane.api.keys import RUNTIME
from controlplane.api.routes import ALL_METHODS
from controlplane.storage.migrations import schema_version
from controlplane.storage.sql import PostgresDatabase, SqliteDatabase
from shared.ids import new_id
from tests.conftest import Api
from tests.daemons import Daemon, free_port
from tests.nodes import recorded, wire

SHAPE = {"code", "message", "details", "requestId"}
CREDENTIAL_SHAPED = "bct_" + "A" * 43  # of a credential's shape, no credential's
NODE_SHAPED = "bcn_" + "A" * 43  # of a node credential's shape, no node's
Seen = list[tuple[bool, str]]  # (on the event loop's thread, the statement)


@contextmanager
def statements_run() -> Iterator[Seen]:
    """Every statement any database connection runs while the block does (the writer, the
    loop's reader, the reader threads; SQLite or PostgreSQL), with whether it ran on the event
    loop's thread (the tests' main thread). The connections are real; only calls are seen."""
    seen: Seen = []
    patched: list[tuple[type, str, Any]] = []

    def counted(run: Callable[..., Any]) -> Callable[..., Any]:
        def call(self: Any, sql: str, *args: Any) -> Any:
            seen.append((threading.current_thread() is threading.main_thread(), sql))
            return run(self, sql, *args)

        return call

    for cls in (SqliteDatabase, PostgresDatabase):
        for name in ("execute", "executemany", "script"):
            original = cls.__dict__[name]
            patched.append((cls, name, original))
            setattr(cls, name, counted(original))
    try:
        yield seen
    finally:
        for cls, name, original in patched:
            setattr(cls, name, original)


def authorization(value: str | None) -> dict[str, str]:
    return {} if value is None else {"Authorization": value}


async def scrape(api: Api, header: str | None) -> tuple[int, Any]:
    response = await api.client.get("/metrics", headers=authorization(header))
    if response.content_type == "application/json":
        return response.status, await response.json()
    return response.status, await response.text()


def refused(status: int, body: Any, code: str, expected: int) -> None:
    """The usual error body, with that code and status."""
    assert status == expected, body
    assert set(body) == {"error"} and set(body["error"]) == SHAPE, body
    assert body["error"]["code"] == code, body


async def test_f4_metrics_answers_root_credentials_only(api: Api) -> None:
    """F4: /metrics without a token, with one that is garbage, unknown or revoked is 401
    UNAUTHENTICATED; a valid credential of another tenant is 403 PERMISSION_DENIED; a root
    credential reads the metrics."""
    await api.tenant("acme")
    acme = await api.token_for("acme")
    spare = await api.ok("iam/credentials/create", {"tenantId": "root"})
    revoke = {"tenantId": "root", "credentialId": spare["credentialId"]}
    await api.ok("iam/credentials/revoke", revoke)
    for header in (
        None,
        "Bearer",
        "Basic cm9vdDpyb290",
        "Bearer garbage",
        f"Bearer {NODE_SHAPED}",
        f"Bearer {CREDENTIAL_SHAPED}",
        f"Bearer {spare['token']}",
    ):
        refused(*await scrape(api, header), "UNAUTHENTICATED", 401)
    refused(*await scrape(api, f"Bearer {acme}"), "PERMISSION_DENIED", 403)
    status, text = await scrape(api, f"Bearer {api.token}")
    assert status == 200 and "bc_http_requests_total" in text, text


async def test_f4_a_scrape_looks_its_credential_up_off_the_event_loop(api: Api) -> None:
    """F4: a root token the credential cache does not hold is looked up on a reader thread,
    never on the event loop's; a scrape while the cache holds it reads nothing for it."""
    api.client.app[RUNTIME].credentials.clear()
    root = f"Bearer {api.token}"
    with statements_run() as first:
        assert (await scrape(api, root))[0] == 200
    with statements_run() as again:
        assert (await scrape(api, root))[0] == 200
    lookups = [on_loop for on_loop, sql in first if "FROM credentials" in sql]
    assert lookups == [False], first
    assert not [sql for on_loop, sql in first if on_loop], first
    assert not [sql for _, sql in again if "FROM credentials" in sql], again


async def test_f4_metrics_listen_serves_without_a_token_and_the_api_port_not_at_all(
    tmp_path: Path,
) -> None:
    """F4: with --metrics-listen, /metrics is served there without a token (nothing else is),
    and on the API port it is an unknown path: 404 NOT_FOUND as any other, root token or not."""
    port = free_port()
    daemon = Daemon(tmp_path, "--metrics-listen", f"127.0.0.1:{port}")
    daemon.start()
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/metrics") as response:
                assert response.status == 200
                assert "bc_http_requests_total" in await response.text()
            async with session.get(f"http://127.0.0.1:{port}/healthz") as response:
                assert response.status == 404
            async with session.get(f"{daemon.url}/nope") as response:
                unknown = (await response.json())["error"]
            for headers in ({}, {"Authorization": f"Bearer {daemon.token}"}):
                async with session.get(f"{daemon.url}/metrics", headers=headers) as response:
                    assert response.status == 404
                    error = (await response.json())["error"]
                assert (error["code"], error["message"]) == (unknown["code"], unknown["message"])
                assert error["details"] == {"path": "/metrics"}
    finally:
        daemon.kill()


# --- no request that has not authenticated reads the database ---------------------------------

POOL, NODE = new_id("pool"), new_id("node")
ACME = {"tenantId": "acme"}
# A body each method's schema takes, so the request would go on to its credential's lookup.
BODIES: dict[str, dict[str, Any]] = {
    "iam/tenants/create": ACME,
    "iam/tenants/delete": ACME,
    "iam/credentials/create": ACME,
    "iam/credentials/revoke": {**ACME, "credentialId": new_id("cred")},
    "iam/credentials/whoami": {},
    "compute/sites/create": {**ACME, "name": "fra1", "region": "eu", "kind": "custom"},
    "compute/sites/list": ACME,
    "compute/pools/list": ACME,
    "compute/pools/get": {**ACME, "poolId": POOL},
    "compute/pools/create": {**ACME, "siteId": new_id("site"), "class": "metal-host"},
    "compute/pools/capacity": {**ACME, "poolId": POOL},
    "compute/pools/offer": {**ACME, "poolId": POOL, "toTenantId": "globex", "quota": {"gpu": 1}},
    "compute/pools/unoffer": {**ACME, "poolId": POOL, "toTenantId": "globex"},
    "compute/pools/update": {**ACME, "poolId": POOL},
    "compute/pools/archive": {**ACME, "poolId": POOL},
    "compute/quotas/set": {**ACME, "poolId": POOL, "forTenantId": "globex", "quota": {"gpu": 1}},
    "compute/quotas/list": ACME,
    "compute/capacity/byPool": {**ACME, "poolId": POOL},
    "compute/events/list": ACME,
    "compute/joinTokens/create": {**ACME, "poolId": POOL},
    "compute/nodes/report": {"nodeId": NODE, "inventory": wire(recorded("dgx-h100-01"))},
    "compute/nodes/spec": {"nodeId": NODE},
    "compute/nodes/list": ACME,
    "compute/nodes/get": {**ACME, "nodeId": NODE},
    "compute/nodes/cordon": {**ACME, "nodeId": NODE, "reason": "x"},
    "compute/nodes/uncordon": {**ACME, "nodeId": NODE},
    "compute/nodes/drain": {**ACME, "nodeId": NODE, "reason": "x"},
    "compute/nodes/remove": {**ACME, "nodeId": NODE},
    "compute/reservations/create": {**ACME, "poolId": POOL, "resources": {"gpu": 1}},
    "compute/reservations/get": {**ACME, "reservationId": new_id("res")},
    "compute/reservations/list": ACME,
    "compute/reservations/end": {**ACME, "reservationId": new_id("res")},
    "compute/budgets/set": {**ACME, "meter": "gpu.h100.hours", "limit": 10},
    "compute/budgets/get": {**ACME, "meter": "gpu.h100.hours"},
}
# GET paths besides the methods: the operations endpoints, the console, an unknown path, and
# a method's path (405).
GETS = ("/healthz", "/readyz", "/metrics", "/api/openapi.json", "/ui/", "/", "/nope")
GETS += ("/api/compute/pools/list",)
NO_CREDENTIAL = (
    None,
    "Basic cm9vdDpyb290",
    "Bearer",
    "Bearer garbage",
    "Bearer bct_" + "!" * 43,
    f"Bearer {CREDENTIAL_SHAPED[:-1]}",
)


async def readiness_statements(api: Api) -> set[str]:
    """What the daemon's own readiness check runs (every second, beside the requests): its
    check, run here once."""
    with statements_run() as seen:
        await api.client.app[RUNTIME].db.read_short(schema_version)
    return {sql for _, sql in seen}


async def test_f4_no_request_without_a_credential_reads_the_database(api: Api) -> None:
    """F4: every method (but nodes/join, whose join token is its credential) and every other
    path, asked with no token, a garbage one or one of another kind of credential (a node's
    on a tenant's method, and the other way), runs no statement on any connection: refused
    or answered (/readyz from the daemon's own last check) before anything is read."""
    background = await readiness_statements(api)
    exempt = {m.path for m in ALL_METHODS if m.auth == "none"}
    assert exempt == {"/api/compute/nodes/join"}
    requests: list[tuple[str, str, bytes, str | None]] = []
    for method in ALL_METHODS:
        if method.path in exempt:
            continue
        body = msgspec.json.encode(BODIES[method.path.removeprefix("/api/")])
        msgspec.json.decode(body, type=method.request)  # the schema takes it
        other_kind = NODE_SHAPED if method.auth == "credential" else CREDENTIAL_SHAPED
        for header in (*NO_CREDENTIAL, f"Bearer {other_kind}"):
            requests.append(("POST", method.path, body, header))
    for path in GETS:
        for header in (*NO_CREDENTIAL, f"Bearer {NODE_SHAPED}"):
            requests.append(("GET", path, b"", header))
    requests.append(("POST", "/api/compute/nope/nope", b"{}", None))
    for verb, path, body, header in requests:
        headers = {"Content-Type": "application/json", **authorization(header)}
        with statements_run() as seen:
            response = await api.client.request(verb, path, data=body, headers=headers)
            await response.read()
        assert response.status < 500
        if verb == "POST" or path == "/metrics":
            assert response.status in (401, 404), (path, header, response.status)
        read = [sql for _, sql in seen if sql not in background]
        assert read == [], (verb, path, header, read)


async def test_f4_a_token_of_the_right_shape_costs_its_own_lookup_only(api: Api) -> None:
    """F4: a token of a credential's shape that is no credential's is looked up (that read is
    its authentication) and nothing else is read before it is refused."""
    background = await readiness_statements(api)
    with statements_run() as seen:
        status, _ = await api.call("compute/pools/list", ACME, token=CREDENTIAL_SHAPED)
    assert status == 401
    read = [sql for _, sql in seen if sql.startswith("SELECT") and sql not in background]
    assert len(read) == 1 and "FROM credentials" in read[0], read
