"""F8: cached answers live as long as what they show. Each scope of the database (the catalog,
the quota figures in use, the fleet) has its own generation, moved by the database itself in
the writing transaction; a cached read is dropped only by a write to a scope it shows."""

from pathlib import Path
from typing import Any

import msgspec

from controlplane.api.keys import RUNTIME
from controlplane.services.views import POOL_VIEW
from controlplane.storage.db import Store, generation
from controlplane.storage.migrations import SCOPED_TABLES
from tests.conftest import Api, execute
from tests.nodes import DGX_POLICY, held, joined, pool_with_token, recorded, report

# Tables no cached read shows, so in no scope: the event log (events/list is never cached),
# the cursor key and the generations themselves (beside PostgreSQL's schema version and the
# liveness stamps, which are no migration's tables).
UNSCOPED = {"events", "event_audience", "cursor_key", "generations", "leader_lease"}


def tables(db: Path | str) -> set[str]:
    listing = (
        "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        if str(db).startswith("postgresql")
        else "SELECT name FROM sqlite_master WHERE type = 'table'"
    )
    return {name for (name,) in execute(db, listing)} - {"node_liveness", "schema_version"}


def pool_view_at(db: Path | str) -> int:
    store = Store(db)
    try:
        with store.snapshot() as reader:
            return generation(reader, POOL_VIEW)
    finally:
        store.close()


async def fleet(api: Api) -> tuple[str, dict[str, Any], str]:
    """A ready DGX node in a root pool offered to acme, and acme's credential."""
    pool, token = await pool_with_token(api, policy=DGX_POLICY, ownerQuota={"gpu": 8})
    node = await joined(api, token, recorded("dgx-h100-01"))
    await api.tenant("acme")
    await api.offer(pool, "acme", {"gpu": 4})
    return pool, node, await api.token_for("acme")


async def test_f8_every_table_is_in_a_scope_or_shown_by_no_cached_read(db: Path | str) -> None:
    """F8: a table that no trigger moves a generation for is one no cached read shows: a new
    table must be given a scope (or a reason here)."""
    pool_view_at(db)  # the store migrates the database
    scoped = {t for names in SCOPED_TABLES.values() for t in names} | {"quotas"}
    assert tables(db) - scoped == UNSCOPED


async def test_f8_a_changed_report_keeps_cached_pool_answers(api: Api, db: Path | str) -> None:
    """F8: a report that changed its node's rows moves the fleet's generation only: pools/list
    and pools/get, the owner's and an offered tenant's, still answer from the cache."""
    pool, node, acme = await fleet(api)
    answers = api.client.app[RUNTIME].answers
    reads = [
        ("compute/pools/list", {"tenantId": "root"}, None),
        ("compute/pools/get", {"tenantId": "root", "poolId": pool}, None),
        ("compute/pools/list", {"tenantId": "acme"}, acme),
    ]
    first = [await api.ok(path, body, token) for path, body, token in reads]
    hits = answers.hits
    before = execute(db, "SELECT memory_total_bytes FROM nodes")
    grown = recorded("dgx-h100-01")
    grown = msgspec.structs.replace(grown, memory_total_bytes=grown.memory_total_bytes * 2)
    status, answer = await report(api, node, grown)
    assert status == 200, answer
    assert execute(db, "SELECT memory_total_bytes FROM nodes") != before  # the report wrote
    assert [await api.ok(path, body, token) for path, body, token in reads] == first
    assert answers.hits == hits + len(reads)


async def test_f8_offers_quotas_and_updates_drop_cached_pool_answers(api: Api) -> None:
    """F8: an offer, a quota and a pool update are the catalog's: the next pools/get and
    pools/list are made afresh and show the change."""
    pool, _node, acme = await fleet(api)
    answers = api.client.app[RUNTIME].answers
    get = {"tenantId": "root", "poolId": pool}
    listing = {"tenantId": "acme"}

    async def fresh() -> tuple[Any, Any]:
        await api.ok("compute/pools/get", get)
        await api.ok("compute/pools/list", listing, acme)  # both cached now
        hits = answers.hits
        shown = (
            await api.ok("compute/pools/get", get),
            await api.ok("compute/pools/list", listing, acme),
        )
        return shown, hits

    await api.tenant("beta")
    await fresh()
    await api.offer(pool, "beta", {"gpu": 1})
    (owner, _), hits = await fresh()
    assert answers.hits == hits + 2
    await api.offer(pool, "beta", {"gpu": 2})
    owner = await api.ok("compute/pools/get", get)
    assert {o["toTenantId"]: o["quota"] for o in owner["offers"]}["beta"] == {"gpu": 2}
    quota = {"tenantId": "root", "poolId": pool, "forTenantId": "acme", "quota": {"gpu": 3}}
    await api.ok("compute/quotas/set", quota)
    tenant = await api.ok("compute/pools/list", listing, acme)
    assert [q["max"] for q in tenant["items"][0]["quotas"]] == [3]
    await api.ok("compute/pools/update", {**get, "gpuModel": "H200"})
    assert (await api.ok("compute/pools/get", get))["version"] == 2
    assert (await api.ok("compute/pools/list", listing, acme))["items"][0]["gpuModel"] == "H200"


async def test_f8_a_booking_moves_the_quota_figures_a_pool_shows(api: Api) -> None:
    """F8: a pool view shows what its quotas have in use; a placed reservation moves it, so
    the cached pools/get and pools/list are dropped and show the new figure, never a stale one."""
    pool, _node, acme = await fleet(api)
    get = {"tenantId": "acme", "poolId": pool}
    for _ in range(2):
        assert [q["used"] for q in (await api.ok("compute/pools/get", get, acme))["quotas"]] == [0]
        await api.ok("compute/pools/list", {"tenantId": "acme"}, acme)
    await held(api, pool, "acme", {"gpu": 2}, acme)
    assert [q["used"] for q in (await api.ok("compute/pools/get", get, acme))["quotas"]] == [2]
    listed = await api.ok("compute/pools/list", {"tenantId": "acme"}, acme)
    assert [(q["used"], q["available"]) for q in listed["items"][0]["quotas"]] == [(2, 2)]


async def test_f8_a_write_to_any_table_a_pool_view_shows_moves_its_generation(
    api: Api, db: Path | str
) -> None:
    """F8: a row written in any catalog table, or a quota's maximum or figure in use, moves
    the generation pool answers are made at, in the writing transaction; a row written in a
    fleet table, or a quota row rewritten as it was, does not."""
    pool, node, acme = await fleet(api)
    await held(api, pool, "acme", {"gpu": 1}, acme)
    await api.ok("compute/budgets/set", {"tenantId": "acme", "meter": "gpu.h100.hours", "limit": 9})
    # A pinned CPU (D3) as the placer writes one where vCPUs are not overcommitted.
    execute(
        db,
        "INSERT INTO node_cpus (node_id, cpu, reservation_id) "
        "SELECT node_id, 100, id FROM reservations WHERE node_id = ?",
        (node["nodeId"],),
    )
    first_column = {
        "tenants": "id",
        "credentials": "id",
        "sites": "id",
        "pools": "id",
        "pool_offers": "pool_id",
        "pool_authz": "tenant_id",
        "budgets": "meter",
        "nodes": "id",
        "node_resources": "node_id",
        "node_devices": "node_id",
        "join_tokens": "id",
        "reservations": "id",
        "bookings": "reservation_id",
        "node_cpus": "node_id",
    }
    for scope, names in SCOPED_TABLES.items():
        for table in names:
            assert execute(db, f"SELECT count(*) FROM {table}")[0][0] > 0, table
            column = first_column[table]
            before = pool_view_at(db)
            execute(db, f"UPDATE {table} SET {column} = {column}")
            assert (pool_view_at(db) > before) == (scope == "catalog"), table
    for change, moves in (
        ("used = used", False),
        ("updated_at = 'x'", False),
        ("used = used + 1", True),
        ("max = max + 1", True),
    ):
        before = pool_view_at(db)
        execute(db, f"UPDATE quotas SET {change}")
        assert (pool_view_at(db) > before) == moves, change
