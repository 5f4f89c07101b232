"""Helpers for node tests: recorded hosts as inventories, pools with join tokens, joining."""

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from agent.inventory import collect_inventory
from controlplane.capacity.liveness import Liveness
from controlplane.reconciler import PassStats, reconcile_pass
from controlplane.storage.db import Store
from controlplane.storage.sql import Database
from shared.inventory import Inventory
from tests.conftest import Api, execute

T = TypeVar("T")
FIXTURES = Path(__file__).resolve().parent.parent / "agent" / "fixtures" / "host-fixtures.json"
DGX_POLICY = {"hostReserve": {"vcpu": 8, "memoryGiB": 64}, "overcommit": {"vcpu": 2}}


def one_pass(
    db: Path, liveness: Liveness | None = None, may_mark_lost: bool = True, lost_after: float = 3600
) -> PassStats:
    """One reconciler pass on the database file, as the running daemon makes one."""
    store = Store(db)
    try:
        return store.transact(
            lambda d: reconcile_pass(d, liveness or Liveness(), lost_after, may_mark_lost)
        )
    finally:
        store.close()


def counting_writes(store: Store, fn: Callable[[Database], T]) -> tuple[T, int]:
    """Run ``fn`` in one transaction; also the rows the database itself saw written
    (SQLite's total_changes; PostgreSQL's counters of this very transaction)."""
    if store.postgres:
        return store.transact(
            lambda db: (
                fn(db),
                int(
                    db.execute(
                        "SELECT coalesce(sum(n_tup_ins + n_tup_upd + n_tup_del), 0) "
                        "FROM pg_stat_xact_user_tables"
                    ).fetchone()[0]
                ),
            )
        )
    conn = store._writer_db.conn  # type: ignore[attr-defined]
    before = conn.total_changes
    result = store.transact(fn)
    return result, conn.total_changes - before


def recorded(host: str) -> Inventory:
    """A recorded host's inventory, taken by the agent's own code through the fake NVML."""
    return collect_inventory(fixture=FIXTURES, fixture_host=host)


def twin(host: str, n: int) -> Inventory:
    """Another machine like a recorded host: its own machine id, hostname and GPU UUIDs."""
    base = recorded(host)
    gpus = [msgspec.structs.replace(g, uuid=f"{g.uuid[:-2]}{n:02d}") for g in base.gpus]
    return msgspec.structs.replace(
        base, machine_id=f"m{n:02d}", hostname=f"{base.hostname}-{n:02d}", gpus=gpus
    )


def wire(inventory: Inventory) -> Any:
    return msgspec.to_builtins(inventory)


async def pool_with_token(api: Api, max_uses: int = 5, **pool: Any) -> tuple[str, str]:
    """A root pool on a shared site and a join token for it."""
    sites = (await api.ok("compute/sites/list", {"tenantId": "root"}))["items"]
    site = sites[0]["id"] if sites else await api.site()
    created = await api.pool(site, **pool)
    token = await api.ok(
        "compute/joinTokens/create",
        {"tenantId": "root", "poolId": created["id"], "maxUses": max_uses},
    )
    return created["id"], token["token"]


async def join(api: Api, token: str, inventory: Inventory) -> tuple[int, Any]:
    response = await api.client.post(
        "/api/compute/nodes/join",
        json={
            "joinToken": token,
            "attestor": "join-token",
            "hostname": inventory.hostname,
            "inventory": wire(inventory),
        },
    )
    return response.status, await response.json()


async def joined(
    api: Api, token: str, inventory: Inventory, applied: bool = True
) -> dict[str, Any]:
    """A joined node; with ``applied`` its agent has applied its NodeSpec cleanly, as a real
    agent's first cycle does, so it is ready (H1)."""
    status, answer = await join(api, token, inventory)
    assert status == 200, answer
    if applied:
        await apply_spec(api, dict(answer), inventory)
    return dict(answer)


async def apply_spec(
    api: Api, node: dict[str, Any], inventory: Inventory, status: str = "applied", **outcomes: str
) -> dict[str, Any]:
    """What an agent does after a report: fetch the spec and report every unit ``status`` (or
    as ``outcomes`` says by unit id). Returns the spec."""
    headers = {"Authorization": f"Bearer {node['token']}"}
    response = await api.client.post(
        "/api/compute/nodes/spec", json={"nodeId": node["nodeId"]}, headers=headers
    )
    spec = await response.json()
    assert response.status == 200, spec
    units = [{"id": u["id"], "status": outcomes.get(u["id"], status)} for u in spec["units"]]
    response = await api.client.post(
        "/api/compute/nodes/report",
        json={
            "nodeId": node["nodeId"],
            "inventory": wire(inventory),
            "applied": {"version": spec["version"], "units": units},
        },
        headers=headers,
    )
    assert response.status == 200, await response.json()
    return dict(spec)


async def host_confirms(
    api: Api, node: dict[str, Any], inventory: Inventory, **states: str
) -> dict[str, Any]:
    """What an agent does with its bookings (D5-D7): fetch the spec and report each live
    booking delivered and each ended one released, or as ``states`` says by reservation id
    (``"failed:gpu busy"`` carries a reason). Returns the spec."""
    headers = {"Authorization": f"Bearer {node['token']}"}
    response = await api.client.post(
        "/api/compute/nodes/spec", json={"nodeId": node["nodeId"]}, headers=headers
    )
    spec = await response.json()
    assert response.status == 200, spec
    bookings = []
    for booking in spec["bookings"]:
        rid = booking["reservationId"]
        state, _, reason = states.get(
            rid, "delivered" if booking["state"] == "live" else "released"
        ).partition(":")
        bookings.append({"reservationId": rid, "state": state, "reason": reason or None})
    response = await api.client.post(
        "/api/compute/nodes/report",
        json={"nodeId": node["nodeId"], "inventory": wire(inventory), "bookings": bookings},
        headers=headers,
    )
    assert response.status == 200, await response.json()
    return dict(spec)


async def held(
    api: Api, pool: str, tenant: str, resources: dict[str, int], token: str | None = None
) -> dict[str, Any]:
    """A placed reservation of ``tenant`` on ``pool``: what is in use (R6)."""
    answer = await api.ok(
        "compute/reservations/create",
        {"tenantId": tenant, "poolId": pool, "resources": resources},
        token,
    )
    assert answer["state"] == "placed", answer
    return dict(answer)


async def nothing_sellable(api: Api, pool: str) -> None:
    """H6: the pool's ledger counts its nodes in total but none of it as schedulable."""
    ledger = await api.ok("compute/pools/capacity", {"tenantId": "root", "poolId": pool})
    assert ledger["items"], "total counts every node of the pool"
    assert all(r["schedulable"] == 0 and r["available"] == 0 for r in ledger["items"]), ledger


def rows_of(node: dict[str, Any]) -> dict[str, tuple[int, int, float]]:
    return {r["resource"]: (r["capacity"], r["allocated"], r["ratio"]) for r in node["resources"]}


NODE_TABLES = ("nodes", "node_resources", "node_devices", "join_tokens", "events")


def node_snapshot(db: Path) -> dict[str, Any]:
    return {t: sorted(execute(db, f"SELECT * FROM {t}"), key=repr) for t in NODE_TABLES}


async def report(api: Api, node: dict[str, Any], inventory: Any) -> tuple[int, Any]:
    response = await api.client.post(
        "/api/compute/nodes/report",
        json={"nodeId": node["nodeId"], "inventory": wire(inventory)},
        headers={"Authorization": f"Bearer {node['token']}"},
    )
    return response.status, await response.json()


def dry_run(
    monkeypatch: Any, state_dir: Path, root: Path, *extra: str
) -> tuple[list[str], Callable[..., Any]]:
    """``better-compute-agent run --dry-run --once`` on the recorded DGX H100 with the spec
    the state directory keeps, its cycle against a control plane left out (tested on its
    own); the argv and a function that invokes it (with more arguments) and returns click's
    result."""
    from click.testing import CliRunner

    import agent.main

    class Cycled:
        def __init__(self, *_: Any, **__: Any) -> None:
            pass

        def run(self, *_: Any, **__: Any) -> None:
            pass

    monkeypatch.setattr(agent.main, "Agent", Cycled)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    token = state_dir.parent / "join.token"
    token.write_text("bcj_x")
    root.mkdir()
    argv = [
        "run",
        "--controlplane",
        "http://127.0.0.1:9",
        "--join-token-file",
        str(token),
        "--state-dir",
        str(state_dir),
        "--fixture",
        str(FIXTURES),
        "--fixture-host",
        "dgx-h100-01",
        "--root",
        str(root),
        "--dry-run",
        "--once",
        *extra,
    ]
    return argv, lambda *more: CliRunner().invoke(agent.main.cli, [*argv, *more])
