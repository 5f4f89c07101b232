"""The placer under random mixes of requests, node lifecycle and the hosts' deliveries and
releases: never more than a row's capacity, never an atom twice, no GPU, MIG instance, slot
or pinned CPU in two live-or-releasing bookings, nothing placed where it may not be (H2,
H3, H4, H5, D7, D8)."""

import asyncio
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.api.dispatch import invoke
from controlplane.api.routes import ALL_METHODS
from controlplane.capacity.liveness import Liveness
from controlplane.iam.decide import Principal
from controlplane.reconciler import reconcile_pass
from controlplane.services import iam, reports
from controlplane.services.call import Caller, Env
from controlplane.storage.db import Store
from shared import cpulist
from shared import schemas as s
from shared.inventory import Inventory
from tests.conftest import execute
from tests.nodes import recorded
from tests.test_reservations import invariants

ROOT = Principal("cred", "root", None)
# No vCPU overcommit: vCPUs are pinned as exclusive cores (D3).
PINNED_POLICY = {"hostReserve": {"vcpu": 8, "memoryGiB": 64}}
METHODS = {
    method.path.rsplit("/", 2)[-2] + "/" + method.path.rsplit("/", 1)[-1]: method
    for method in ALL_METHODS
}


async def call(store: Store, method: str, caller: Caller, body: Any) -> Any:
    """A method in process, decided as a request is (``group/verb``, e.g. ``pools/create``)."""
    return await invoke(METHODS[method], store, Env(Liveness()), caller, body)


operations = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.integers(0, 5), st.integers(0, 300)),
        st.tuples(st.just("end"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("pass"), st.just(0), st.just(0)),
        st.tuples(st.just("slots"), st.integers(1, 6), st.just(0)),
        st.tuples(st.just("cordon"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("uncordon"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("drain"), st.integers(0, 2), st.sampled_from([0, 3600])),
        st.tuples(st.just("remove"), st.integers(0, 2), st.just(0)),
        st.tuples(st.just("health"), st.integers(0, 2), st.integers(0, 7)),
        st.tuples(st.just("spec"), st.integers(0, 3), st.just(0)),
        st.tuples(st.just("apply"), st.integers(0, 2), st.just(0)),
        # the host's agent on its bookings: 0 all delivered and released, 1 a busy GPU fails
        # the first live one, 2 a release blocked (D5-D7)
        st.tuples(st.just("deliver"), st.integers(0, 2), st.integers(0, 2)),
    ),
    min_size=1,
    max_size=30,
)


@dataclass
class Host:
    node: dict[str, Any]  # the node's authenticated row, as the report handler gets it
    token: str
    inventory: Inventory
    removed: bool = False


@dataclass
class World:
    pool: str  # exclusive, two DGX H100
    shared: str  # timeslice, one L40S: its sharing units are drain-gated (H4)
    hosts: list[Host] = field(default_factory=list)


async def report(store: Store, host: Host, applied: bool) -> None:
    """The host's agent reports its inventory, and with ``applied`` its spec applied cleanly."""
    body: dict[str, Any] = {"node_id": host.node.id, "inventory": host.inventory}
    if applied:
        spec = await call(store, "nodes/spec", host.node, s.NodesSpec(node_id=host.node.id))
        booked = set(spec.booked_gpus)  # as the agent does: a drain unit on a booked GPU waits
        units = [
            {
                "id": u.id,
                "status": "waiting-drain"
                if u.needs == "drain" and booked & set(u.gpus)
                else "applied",
            }
            for u in spec.units
        ]
        body["applied"] = {"version": spec.version, "units": units}
    await call(store, "nodes/report", host.node, s.NodesReport(**body))
    with store.snapshot() as db:
        host.node = reports.authenticate_node(db, host.token) or host.node


async def deliver(store: Store, host: Host, how: int) -> None:
    """The host's agent on its spec's bookings: delivered and released, except that with
    ``how`` 1 the first live one fails (a busy GPU) and with 2 the first release is blocked."""
    spec = await call(store, "nodes/spec", host.node, s.NodesSpec(node_id=host.node.id))
    told: list[s.BookingReport] = []
    for booking in spec.bookings:
        state = "delivered" if booking.state == "live" else "released"
        reason = None
        if how == 1 and state == "delivered" and not told:
            state, reason = "failed", "gpu busy: pid 4242"
        elif how == 2 and state == "released" and all(t.state != "release-blocked" for t in told):
            state, reason = "release-blocked", "pids 4242 still on the GPU"
        told.append(
            s.BookingReport(reservation_id=booking.reservation_id, state=state, reason=reason)
        )
    report = s.NodesReport(node_id=host.node.id, inventory=host.inventory, bookings=told)
    await call(store, "nodes/report", host.node, report)
    with store.snapshot() as db:
        host.node = reports.authenticate_node(db, host.token) or host.node


def exclusive_end_to_end(db: Path) -> None:
    """D8: no GPU, MIG instance, slot or pinned CPU is in two live-or-releasing bookings, and
    what each says it holds is what its atoms are."""
    held = execute(
        db,
        "SELECT id, node_id, placement FROM reservations WHERE state IN ('placed', 'active') "
        "OR delivery_state IN ('releasing', 'release-blocked')",
    )
    seen: dict[tuple[str, str], str] = {}
    for reservation, node, text in held:
        placement = msgspec.json.decode(text)
        pinned = placement["cpus"] if placement["cpuQuota"] is None else ""
        things = [
            *(f"gpu {g['uuid']}" for g in placement["gpus"]),
            *(f"mig {m['uuid']}" for m in placement["migInstances"]),
            *(f"slot {x['gpuIndex']}/{x['slot']}" for x in placement["slots"]),
            *(f"cpu {c}" for c in cpulist.parse(pinned)),
        ]
        for thing in things:
            assert (node, thing) not in seen, (thing, reservation, seen.get((node, thing)))
            seen[(node, thing)] = reservation
        atoms = {
            d
            for (d,) in execute(
                db, "SELECT device_id FROM node_devices WHERE reservation_id = ?", (reservation,)
            )
        }
        assert {g["uuid"] for g in placement["gpus"]} <= atoms, (reservation, atoms)
        cpus = {
            c
            for (c,) in execute(
                db, "SELECT cpu FROM node_cpus WHERE reservation_id = ?", (reservation,)
            )
        }
        assert cpus == set(cpulist.parse(pinned)), (reservation, cpus, pinned)


async def root_pool(store: Store, site_id: str, **fields: Any) -> s.PoolView:
    """A metal-host pool of root's on the site."""
    body = s.PoolsCreate(tenant_id="root", site_id=site_id, pool_class="metal-host", **fields)
    return await call(store, "pools/create", ROOT, body)


async def world(store: Store, tmp: Path) -> World:
    iam.bootstrap(store, tmp / "root.token")
    site = await call(
        store,
        "sites/create",
        ROOT,
        s.SitesCreate(tenant_id="root", name="f", region="r", kind="shared"),
    )
    pool = await root_pool(
        store,
        site.id,
        gpu_model="H100",
        policy=PINNED_POLICY,
        owner_quota={"gpu": 1000, "vcpu": 100_000},
    )
    shared = await root_pool(
        store,
        site.id,
        gpu_model="L40S",
        sharing="timeslice",
        policy={"replicas": 4},
        owner_quota={"gpu.slot": 1000},
    )
    token = await call(
        store,
        "joinTokens/create",
        ROOT,
        s.JoinTokensCreate(tenant_id="root", pool_id=pool.id, max_uses=5),
    )
    shared_token = await call(
        store, "joinTokens/create", ROOT, s.JoinTokensCreate(tenant_id="root", pool_id=shared.id)
    )
    made = World(pool.id, shared.id)
    for machine in ("a", "b"):  # two hosts: their own machine ids and GPU UUIDs
        dgx = recorded("dgx-h100-01")
        gpus = [msgspec.structs.replace(g, uuid=f"{g.uuid[:-1]}{machine}") for g in dgx.gpus]
        host = msgspec.structs.replace(dgx, machine_id=machine, gpus=gpus)
        join = s.NodesJoin(
            join_token=token.token, attestor="join-token", hostname=f"h{machine}", inventory=host
        )
        joined = await call(store, "nodes/join", None, join)
        with store.snapshot() as db:
            row = reports.authenticate_node(db, joined.token)
        assert row is not None
        made.hosts.append(Host(row, joined.token, host))
        await report(store, made.hosts[-1], applied=True)
    l40s = recorded("l40s-node-03")
    join = s.NodesJoin(
        join_token=shared_token.token, attestor="join-token", hostname="l40s", inventory=l40s
    )
    joined = await call(store, "nodes/join", None, join)
    with store.snapshot() as db:
        row = reports.authenticate_node(db, joined.token)
    assert row is not None
    made.hosts.append(Host(row, joined.token, l40s))
    await report(store, made.hosts[-1], applied=True)
    return made


def placed(db: Path) -> set[str]:
    return {r for (r,) in execute(db, "SELECT id FROM reservations WHERE state = 'placed'")}


def newly_placed_only_where_allowed(db: Path, before: set[str]) -> None:
    """H2, H4, H5: a reservation placed by this step is on a ready, schedulable node and holds
    only healthy, un-held atoms."""
    for reservation in placed(db) - before:
        node = execute(
            db,
            "SELECT n.state, n.cordon_reason, n.drain_state, n.removed_at FROM reservations r "
            "JOIN nodes n ON n.id = r.node_id WHERE r.id = ?",
            (reservation,),
        )
        assert node == [("ready", None, None, None)], (reservation, node)
        atoms = execute(
            db,
            "SELECT unhealthy, held FROM node_devices WHERE reservation_id = ?",
            (reservation,),
        )
        assert all(a == (0, 0) for a in atoms), (reservation, atoms)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_random_mixes_never_over_book(ops: list[tuple[str, int, int]]) -> None:
    """Creates, ends, passes, cordons, drains, removals, GPU health flips, spec changes and
    the hosts' deliveries and releases in any order keep every booking within capacity,
    exclusive end to end (D8), and never place where it may not."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bc.db")
        try:
            asyncio.run(run(store, Path(tmp), ops))
        finally:
            store.close()


async def run(store: Store, tmp: Path, ops: list[tuple[str, int, int]]) -> None:
    w = await world(store, tmp)
    made: list[str] = []
    for kind, a, b in ops:
        before = placed(store.path)
        host = w.hosts[a % len(w.hosts)]
        node = {"tenant_id": "root", "node_id": host.node.id}
        if kind == "create" and (a or b):
            asked = s.ReservationResources(
                **({"gpu": a} if a else {}), **({"vcpu": b} if b else {})
            )
            done = await call(
                store,
                "reservations/create",
                ROOT,
                s.ReservationsCreate(tenant_id="root", pool_id=w.pool, resources=asked),
            )
            made.append(done.id)
        elif kind == "slots":
            asked = s.ReservationResources(gpu_slot=a)
            done = await call(
                store,
                "reservations/create",
                ROOT,
                s.ReservationsCreate(tenant_id="root", pool_id=w.shared, resources=asked),
            )
            made.append(done.id)
        elif kind == "end" and made:
            await call(
                store,
                "reservations/end",
                ROOT,
                s.ReservationsEnd(tenant_id="root", reservation_id=made[a % len(made)]),
            )
        elif kind == "pass":
            await store.write(lambda db: reconcile_pass(db, Liveness(), 3600, True))
        elif host.removed:
            pass
        elif kind == "cordon":
            await call(store, "nodes/cordon", ROOT, s.NodesCordon(**node, reason="r"))
        elif kind == "uncordon":
            await call(store, "nodes/uncordon", ROOT, s.NodesUncordon(**node))
        elif kind == "drain":
            ask = s.NodesDrain(**node, reason="r", deadline_seconds=b)
            await call(store, "nodes/drain", ROOT, ask)
        elif kind == "remove":
            await call(store, "nodes/remove", ROOT, s.NodesRemove(**node, force=True))
            host.removed = True
        elif kind == "health":
            gpus = list(host.inventory.gpus)
            b %= len(gpus)
            flipped = "healthy" if gpus[b].health != "healthy" else "unhealthy"
            gpus[b] = msgspec.structs.replace(gpus[b], health=flipped)
            host.inventory = msgspec.structs.replace(host.inventory, gpus=gpus)
            await report(store, host, applied=False)
        elif kind == "spec" and a % 2:
            await call(  # a sharing change: drain-gated on the L40S
                store,
                "pools/update",
                ROOT,
                s.PoolsUpdate(tenant_id="root", pool_id=w.shared, policy={"replicas": 2 + 2 * a}),
            )
        elif kind == "spec":
            policy = {"hostReserve": {"vcpu": 8 + a, "memoryGiB": 64}}
            await call(
                store,
                "pools/update",
                ROOT,
                s.PoolsUpdate(tenant_id="root", pool_id=w.pool, policy=policy),
            )
        elif kind == "apply":
            await report(store, host, applied=True)
        elif kind == "deliver":
            await deliver(store, host, b)
        invariants(store.path)
        exclusive_end_to_end(store.path)
        newly_placed_only_where_allowed(store.path, before)
