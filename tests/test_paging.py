"""B1: every list pages by keyset (limit 1…1000, an opaque cursor, `next` null at the end) in a
stable order; R1: items hidden from the credential are skipped without stalling a walk."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

from controlplane.services.paging import seal
from controlplane.storage.sql import Database
from tests.conftest import Api, execute

A100_ONLY = [
    {"effect": "allow", "actions": ["compute:*"], "resources": ["compute-tenant"]},
    {
        "effect": "allow",
        "actions": ["compute:*"],
        "resources": ["compute-pool"],
        "conditions": {"gpuModel": ["A100"]},
    },
]


async def walk(
    api: Api, path: str, body: dict[str, Any], token: str | None = None, limit: int = 2
) -> tuple[list[Any], list[int], list[str]]:
    """Every item of a list read `limit` a page through `next`, each page's size, and every
    `next` given."""
    items: list[Any] = []
    sizes: list[int] = []
    nexts: list[str] = []
    cursor: dict[str, Any] = {}
    for _ in range(50):  # bounded: a walk that never ends fails
        answer = await api.ok(f"compute/{path}", {**body, "limit": limit, **cursor}, token)
        items += answer["items"]
        sizes.append(len(answer["items"]))
        if answer["next"] is None:
            return items, sizes, nexts
        nexts.append(answer["next"])
        cursor = {"cursor": answer["next"]}
    raise AssertionError(f"{path} did not reach the end")


async def test_b1_every_list_walks_two_a_page_each_item_once_in_a_stable_order(api: Api) -> None:
    """B1: sites, pools, quotas and reservations walked two a page give every item exactly
    once in key order, the same items a single page gives, and `next` is null on the last
    page; events page by the same position as `after` or `cursor`, and `next` is never null."""
    root = {"tenantId": "root"}
    sites = [await api.site(name=f"fra{i}") for i in range(3)]
    listed, sizes, _ = await walk(api, "sites/list", root)
    assert [s["id"] for s in listed] == sorted(sites) and sizes == [2, 1]
    assert listed == (await api.ok("compute/sites/list", {**root, "limit": 1000}))["items"]

    pools = [(await api.pool(sites[0]))["id"] for _ in range(4)]
    listed, sizes, _ = await walk(api, "pools/list", root)
    assert [p["id"] for p in listed] == sorted(pools) and sizes == [2, 2]
    everything = await api.ok("compute/pools/list", root)  # the seed's contract: every pool
    assert everything == {"items": listed, "next": None}

    first = min(pools)
    await api.ok(
        "compute/quotas/set",
        {**root, "poolId": first, "forTenantId": "root", "quota": {"vcpu": 8, "memoryGiB": 64}},
    )
    listed, sizes, _ = await walk(api, "quotas/list", root)
    keys = [(q["poolId"], q["resource"]) for q in listed]
    assert keys == sorted([(p, "gpu") for p in pools] + [(first, "vcpu"), (first, "memoryGiB")])
    assert sizes == [2, 2, 2]
    assert listed == (await api.ok("compute/quotas/list", root))["items"]
    one_pool, sizes, _ = await walk(api, "quotas/list", {**root, "poolId": first})
    assert [q["resource"] for q in one_pool] == ["gpu", "memoryGiB", "vcpu"] and sizes == [2, 1]

    made = [
        await api.ok(
            "compute/reservations/create", {**root, "poolId": pool, "resources": {"gpu": 1}}
        )
        for pool in (pools[0], pools[1], pools[0], pools[2], pools[0])
    ]
    ended = {made[0]["id"], made[3]["id"]}
    for reservation_id in ended:
        await api.ok("compute/reservations/end", {**root, "reservationId": reservation_id})
    listed, sizes, _ = await walk(api, "reservations/list", root)
    assert [r["id"] for r in listed] == sorted(r["id"] for r in made) and sizes == [2, 2, 1]
    pending, _, _ = await walk(api, "reservations/list", {**root, "states": ["pending", "pending"]})
    assert [r["id"] for r in pending] == sorted(r["id"] for r in made if r["id"] not in ended)
    in_pool, _, _ = await walk(
        api, "reservations/list", {**root, "poolId": pools[0], "states": ["ended", "pending"]}
    )
    assert [r["id"] for r in in_pool] == sorted(r["id"] for r in made if r["poolId"] == pools[0])

    log = (await api.ok("compute/events/list", {**root, "limit": 1000}))["items"]
    seen: list[Any] = []
    position: dict[str, Any] = {}
    for _ in range(50):
        page = await api.ok("compute/events/list", {**root, "limit": 2, **position})
        if not page["items"]:
            break
        seen += page["items"]
        position = {"cursor": str(page["next"])}  # the position as a string…
    assert seen == log and [e["seq"] for e in seen] == list(range(1, len(log) + 1))
    # …or as given, or as `after`: the same place; the end of the log still has a next.
    end = {"items": [], "next": log[-1]["seq"]}
    assert await api.ok("compute/events/list", {**root, "cursor": log[-1]["seq"]}) == end
    assert await api.ok("compute/events/list", {**root, "after": log[-1]["seq"]}) == end


async def test_b1_a_page_of_100_unless_told_1_to_1000_and_only_the_lists_own_cursors(
    api: Api, db: Path
) -> None:
    """B1: without limit reservations/list answers 100 items and a next, then the rest; the
    seed's pools/list answers every pool with next null, and pages only when asked to. A
    limit outside 1…1000, or a cursor its list did not give (made up, altered, cut short, or
    another list's: the list's name is sealed in), is INVALID_INPUT naming the field;
    events/list takes `after` or `cursor`, not both."""
    root = {"tenantId": "root"}
    site = await api.site()
    pool = (await api.pool(site))["id"]
    many = [f"pool_{i:026d}" for i in range(101)]
    execute(
        db,
        "INSERT INTO pools (id, owner_tenant_id, site_id, class, gpu_model, sharing, agent, "
        "policy, version, created_at, updated_at) VALUES "
        + ", ".join(
            "(?, 'root', ?, 'metal-host', 'H100', 'exclusive', 'bcd', '{}', 1, 'x', 'x')"
            for _ in many
        ),
        [value for pool_id in many for value in (pool_id, site)],
    )
    execute(
        db,
        "INSERT INTO pool_authz (tenant_id, pool_id, gpu_model, class, sharing, region, owned) "
        "VALUES "
        + ", ".join("('root', ?, 'H100', 'metal-host', 'exclusive', 'eu', 1)" for _ in many),
        many,
    )
    every = await api.ok("compute/pools/list", root)
    assert [p["id"] for p in every["items"]] == sorted([*many, pool]) and every["next"] is None
    paged = await api.ok("compute/pools/list", {**root, "limit": 100})
    assert paged["items"] == every["items"][:100]
    rest = await api.ok("compute/pools/list", {**root, "limit": 100, "cursor": paged["next"]})
    assert rest == {"items": every["items"][100:], "next": None}

    reservations = [f"res_{i:026d}" for i in range(101)]
    execute(
        db,
        "INSERT INTO reservations (id, tenant_id, pool_id, resources, state, created_at, "
        "updated_at) VALUES "
        + ", ".join("(?, 'root', ?, '{}', 'ended', 'x', 'x')" for _ in reservations),
        [value for reservation_id in reservations for value in (reservation_id, pool)],
    )
    first = await api.ok("compute/reservations/list", root)
    assert [r["id"] for r in first["items"]] == reservations[:100]
    rest = await api.ok("compute/reservations/list", {**root, "cursor": first["next"]})
    assert [r["id"] for r in rest["items"]] == reservations[100:] and rest["next"] is None

    for path in ("pools", "reservations", "sites", "quotas", "events", "nodes"):
        for limit in (0, 1001):
            await api.err(
                f"compute/{path}/list", {**root, "limit": limit}, "INVALID_INPUT", "limit"
            )
        for cursor in ("nope", "", 1.5, None):
            await api.err(
                f"compute/{path}/list", {**root, "cursor": cursor}, "INVALID_INPUT", "cursor"
            )
    pools_next, reservations_next = paged["next"], first["next"]
    for path in ("reservations", "sites", "quotas", "events", "nodes"):  # another list's cursor
        await api.err(
            f"compute/{path}/list", {**root, "cursor": pools_next}, "INVALID_INPUT", "cursor"
        )
    middle = len(pools_next) // 2  # a bit of the ciphertext, not of base64's padding
    other = "A" if pools_next[middle] != "A" else "B"
    altered = [
        pools_next[:middle] + other + pools_next[middle + 1 :],
        pools_next[:-4],
        pools_next + "AAAA",
        reservations_next,
        site,
    ]
    for cursor in altered:
        await api.err("compute/pools/list", {**root, "cursor": cursor}, "INVALID_INPUT", "cursor")
    for cursor in (-1, 2**63, "12a", "1" * 19):
        await api.err("compute/events/list", {**root, "cursor": cursor}, "INVALID_INPUT", "cursor")
    await api.err(
        "compute/events/list", {**root, "after": 1, "cursor": "1"}, "INVALID_INPUT", "cursor"
    )


async def test_b1_r1_a_walk_skips_what_the_credential_may_not_read_without_stalling(
    api: Api,
) -> None:
    """B1, R1: a credential that may read only A100 pools walks pools/list, quotas/list and
    reservations/list one a page: it gets the A100 items and nothing else, and the cursor
    moves past every hidden item (one page per item read, some of them empty). §3: no `next`
    shows the id of an item read, hidden ones least of all: cursors are sealed."""
    await api.tenant("acme")
    admin = await api.token_for("acme")
    site = await api.site()
    models = ["H100", "A100", "H100", "A100", "H100"]
    pools = [(await api.pool(site, gpuModel=model))["id"] for model in models]
    ids = list(pools)
    for pool in pools:
        await api.offer(pool, "acme", {"gpu": 4})
        made = await api.ok(
            "compute/reservations/create",
            {"tenantId": "acme", "poolId": pool, "resources": {"gpu": 1}},
            admin,
        )
        ids.append(made["id"])
    a100 = sorted(p for p, model in zip(pools, models, strict=True) if model == "A100")
    narrow = await api.token_for("acme", A100_ONLY)
    acme = {"tenantId": "acme"}
    listed, sizes, pool_nexts = await walk(api, "pools/list", acme, narrow, limit=1)
    assert [p["id"] for p in listed] == a100 and sizes.count(0) == 3 and len(sizes) == 5
    listed, sizes, quota_nexts = await walk(api, "quotas/list", acme, narrow, limit=1)
    assert [q["poolId"] for q in listed] == a100 and len(sizes) == 5
    listed, sizes, reservation_nexts = await walk(api, "reservations/list", acme, narrow, limit=1)
    assert sorted(r["poolId"] for r in listed) == a100 and len(sizes) == 5
    everything, _, _ = await walk(api, "reservations/list", acme, admin, limit=1)
    assert sorted(r["poolId"] for r in everything) == sorted(pools)
    # The last item read of an empty page is a hidden one: its cursor shows no id. (Replicas
    # seal with the one key stored in the database, so one process shows it for all.)
    nexts = [*pool_nexts, *quota_nexts, *reservation_nexts]
    assert len(nexts) == 12
    assert not [(n, i) for n in nexts for i in ids if i in n or i[-26:] in n]


def test_b1_list_pages_walk_an_index_from_the_cursor_and_sort_nothing(tmp_path: Path) -> None:
    """B1: the page statements of reservations/list (every state, some states, of a pool),
    quotas/list, sites/list, pools/list and nodes/list (a pool, several) each read an index
    range from the cursor and stop at the limit: no temporary sort of the tenant's history."""
    from controlplane.storage import nodes, pools, quotas, reservations, sites
    from controlplane.storage.db import Store

    store = Store(tmp_path / "bc.db")
    try:
        conn = store.reader.conn  # type: ignore[attr-defined]
        pool = "pool_" + "0" * 26
        pages: dict[str, Callable[[Database], object]] = {
            "reservations_tenant_page (tenant_id=? AND state=? AND id>?)": lambda db: (
                reservations.of_tenant(db, "acme", None, None, "res_x", 101),
                reservations.of_tenant(db, "acme", None, ["pending", "placed"], "", 101),
            ),
            "reservations_tenant_pool_page (tenant_id=? AND pool_id=? AND state=? AND id>?)": (
                lambda db: reservations.of_tenant(db, "acme", pool, None, "", 101)
            ),
            "quotas_tenant_page (tenant_id=? AND (pool_id,resource)>(?,?))": lambda db: (
                quotas.visible_quota_rows(db, "acme", None, (pool, "gpu"), 101)
            ),
            "sites_owner_page (owner_tenant_id=? AND id>?)": lambda db: sites.list_sites(
                db, "acme", "site_x", 101
            ),
            "PRIMARY KEY (tenant_id=? AND pool_id>?)": lambda db: pools.visible_pool_rows(
                db, "acme", pool, 101
            ),
            "nodes_pool_page (pool_id=? AND id>?)": lambda db: (
                nodes.nodes_of_pools(db, [pool], None, "node_x", 101),
                nodes.nodes_of_pools(db, [pool, "pool_y", "pool_z"], ["ready"], "", 101),
            ),
        }
        for index, read in pages.items():
            ran: list[str] = []
            conn.set_trace_callback(ran.append)
            with store.snapshot() as db:
                read(db)
            conn.set_trace_callback(None)
            statements = [sql for sql in ran if "LIMIT" in sql]
            assert statements, ran
            for statement in statements:
                plan = conn.execute(f"EXPLAIN QUERY PLAN {statement}").fetchall()
                details = " | ".join(str(row[-1]) for row in plan)
                assert index in details, details
                assert "SCAN" not in details and "TEMP B-TREE" not in details, details
    finally:
        store.close()


def test_b1_h7_a_nodes_page_over_more_pools_than_one_statement_merges_takes_them_all(
    tmp_path: Path,
) -> None:
    """B1, H7: nodes/list's page is an arm a pool; a tenant with more pools than SQLite takes
    in one compound SELECT (500) gets its page read a batch of arms at a time, still the first
    `limit` live nodes in id order across every pool."""
    from controlplane.storage.db import Store
    from controlplane.storage.nodes import nodes_of_pools
    from controlplane.storage.paging import MAX_ARMS

    store = Store(tmp_path / "bc.db")
    try:
        first, last = "pool_" + "0" * 26, "pool_" + "z" * 26

        def world(db: Any) -> None:
            db.execute("INSERT INTO tenants (id, created_at) VALUES ('acme', 'x')")
            db.execute(
                "INSERT INTO sites (id, owner_tenant_id, name, region, kind, created_at) "
                "VALUES ('site_a', 'acme', 'fra1', 'eu', 'custom', 'x')"
            )
            for pool in (first, last):
                db.execute(
                    "INSERT INTO pools (id, owner_tenant_id, site_id, class, sharing, agent, "
                    "policy, version, created_at, updated_at) VALUES (?, 'acme', 'site_a', "
                    "'metal-host', 'exclusive', 'bcd', '{}', 1, 'x', 'x')",
                    [pool],
                )
            for n, pool in enumerate([last, first, last, first]):
                db.execute(
                    "INSERT INTO nodes (id, pool_id, hostname, state, created_at) "
                    "VALUES (?, ?, 'h', 'ready', 'x')",
                    [f"node_{n}", pool],
                )

        store.transact(world)
        many = [first, *(f"pool_y{n:025d}" for n in range(MAX_ARMS)), last]
        with store.snapshot() as db:
            page = nodes_of_pools(db, many, None, "node_0", 2)
        assert [node.id for node in page] == ["node_1", "node_2"]
    finally:
        store.close()


def test_b1_a_pools_page_costs_the_same_reads_whatever_its_size(tmp_path: Path) -> None:
    """B1: a pools/list page of owned pools reads its pools, the caller's quota rows and the
    offers with their quotas once for the whole page, not once per pool (no N+1)."""
    from controlplane.iam.decide import Principal
    from controlplane.services.call import Call, Env
    from controlplane.services.pools import list_pools
    from controlplane.storage.db import Store
    from shared.schemas import PoolsList

    store = Store(tmp_path / "bc.db")
    try:

        def world(db: Any) -> None:
            db.execute("INSERT INTO tenants (id, created_at) VALUES ('acme', 'x'), ('beta', 'x')")
            db.execute(
                "INSERT INTO sites (id, owner_tenant_id, name, region, kind, created_at) "
                "VALUES ('site_a', 'acme', 'fra1', 'eu', 'custom', 'x')"
            )
            for n in range(6):
                pool = f"pool_{n:026d}"
                db.execute(
                    "INSERT INTO pools (id, owner_tenant_id, site_id, class, gpu_model, sharing, "
                    "agent, policy, version, created_at, updated_at) VALUES (?, 'acme', 'site_a', "
                    "'metal-host', 'H100', 'exclusive', 'bcd', '{}', 1, 'x', 'x')",
                    [pool],
                )
                db.execute(
                    "INSERT INTO pool_authz (tenant_id, pool_id, gpu_model, class, sharing, "
                    "region, owned) VALUES ('acme', ?, 'H100', 'metal-host', 'exclusive', 'eu', 1)",
                    [pool],
                )
                db.execute(
                    "INSERT INTO pool_offers (pool_id, to_tenant_id, include_descendants, "
                    "priority, created_at, updated_at) VALUES (?, 'beta', 0, ?, 'x', 'x')",
                    [pool, n],
                )
                db.execute(
                    "INSERT INTO quotas (pool_id, tenant_id, resource, max, used, updated_at) "
                    "VALUES (?, 'beta', 'gpu', ?, 0, 'x'), (?, 'acme', 'gpu', 8, 0, 'x')",
                    [pool, n + 1, pool],
                )

        store.transact(world)
        conn = store.reader.conn  # type: ignore[attr-defined]
        owner = Principal("cred", "acme", None)
        reads: dict[int, int] = {}
        with store.snapshot() as db:  # the connection's first page learns the cursor key
            list_pools(db, Call(owner, PoolsList(tenant_id="acme", limit=1), Env()))
        for limit in (1, 5):
            ran: list[str] = []
            conn.set_trace_callback(ran.append)
            with store.snapshot() as db:
                answer = list_pools(
                    db, Call(owner, PoolsList(tenant_id="acme", limit=limit), Env())
                )
            conn.set_trace_callback(None)
            reads[limit] = len(ran)
            assert len(answer.items) == limit
            assert [
                (o.to_tenant_id, o.quota, o.priority) for p in answer.items for o in p.offers or []
            ] == [("beta", {"gpu": n + 1}, n) for n in range(limit)]
        assert reads[1] == reads[5], reads
    finally:
        store.close()


async def test_b1_a_cursor_pages_only_the_tenant_and_filters_it_was_given_for(api: Api) -> None:
    """A cursor is sealed with its list's tenant and filters: one from tenant acme's walk, or
    from one pool's reservations, is INVALID_INPUT on `cursor` for root or for another pool;
    and every cursor is as long as every other (the key's length stays sealed)."""
    await api.tenant("acme")
    acme = await api.token_for("acme")
    site = await api.site()
    pools = [(await api.pool(site))["id"] for _ in range(2)]
    keyed = await api.pool(site, idempotencyKey="a-key-that-makes-a-long-derived-id")
    for pool in pools:
        await api.offer(pool, "acme", {"gpu": 4})
        for _ in range(2):
            body = {"tenantId": "acme", "poolId": pool, "resources": {"gpu": 1}}
            await api.ok("compute/reservations/create", body, acme)
    _, _, of_acme = await walk(api, "pools/list", {"tenantId": "acme"}, acme, limit=1)
    await api.err(
        "compute/pools/list", {"tenantId": "root", "cursor": of_acme[0]}, "INVALID_INPUT", "cursor"
    )
    first = {"tenantId": "acme", "poolId": pools[0]}
    _, _, of_first = await walk(api, "reservations/list", first, acme, limit=1)
    other = {"tenantId": "acme", "poolId": pools[1], "cursor": of_first[0]}
    await api.err("compute/reservations/list", other, "INVALID_INPUT", "cursor", acme)
    _, _, of_root = await walk(api, "pools/list", {"tenantId": "root"}, limit=1)
    assert len({len(cursor) for cursor in of_root + of_acme + of_first}) == 1
    secret = bytes(32)
    keys = [pools[0], keyed["id"], f"{pools[0]}/hugepages1Gi"]  # a ULID, a derived id, a quota's
    assert len({len(key) for key in keys}) == 3
    assert len({len(seal(secret, "pools", key)) for key in keys}) == 1
