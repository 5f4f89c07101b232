"""The placer under random request mixes: never more than a row's capacity, never an atom twice."""

import asyncio
import tempfile
from pathlib import Path

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from controlplane.capacity.liveness import Liveness
from controlplane.iam.decide import Principal
from controlplane.reconciler import reconcile_pass
from controlplane.services import iam, joining, pools, reservations, sites
from controlplane.storage.db import Store
from shared import schemas as s
from tests.nodes import DGX_POLICY, recorded
from tests.test_reservations import invariants

ROOT = Principal("cred", "root", None)
operations = st.lists(
    st.one_of(
        st.tuples(st.just("create"), st.integers(0, 5), st.integers(0, 300)),
        st.tuples(st.just("end"), st.integers(0, 50), st.just(0)),
        st.tuples(st.just("pass"), st.just(0), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


async def world(store: Store, tmp: Path) -> str:
    iam.bootstrap(store, tmp / "root.token")
    site = await sites.create_site(
        store, ROOT, s.SitesCreate(tenant_id="root", name="f", region="r", kind="shared")
    )
    pool = await pools.create_pool(
        store,
        ROOT,
        s.PoolsCreate(
            tenant_id="root",
            site_id=site.id,
            pool_class="metal-host",
            gpu_model="H100",
            policy=DGX_POLICY,
            owner_quota={"gpu": 1000, "vcpu": 100_000},
        ),
        frozenset({"join-token"}),
    )
    token = await joining.create_join_token(
        store, ROOT, s.JoinTokensCreate(tenant_id="root", pool_id=pool.id, max_uses=5)
    )
    for machine in ("a", "b"):  # two hosts: their own machine ids and GPU UUIDs
        dgx = recorded("dgx-h100-01")
        gpus = [msgspec.structs.replace(g, uuid=f"{g.uuid[:-1]}{machine}") for g in dgx.gpus]
        host = msgspec.structs.replace(dgx, machine_id=machine, gpus=gpus)
        join = s.NodesJoin(
            join_token=token.token, attestor="join-token", hostname=f"h{machine}", inventory=host
        )
        await joining.join_node(store, join)
    return pool.id


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_random_mixes_never_over_book(ops: list[tuple[str, int, int]]) -> None:
    """Creates, ends and placer passes in any order keep every booking within capacity."""
    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp) / "bc.db")
        try:
            asyncio.run(run(store, Path(tmp), ops))
        finally:
            store.close()


async def run(store: Store, tmp: Path, ops: list[tuple[str, int, int]]) -> None:
    pool = await world(store, tmp)
    made: list[str] = []
    for kind, a, b in ops:
        if kind == "create" and (a or b):
            asked = s.ReservationResources(
                **({"gpu": a} if a else {}), **({"vcpu": b} if b else {})
            )
            done = await reservations.create_reservation(
                store, ROOT, s.ReservationsCreate(tenant_id="root", pool_id=pool, resources=asked)
            )
            made.append(done.id)
        elif kind == "end" and made:
            await reservations.end_reservation(
                store, ROOT, s.ReservationsEnd(tenant_id="root", reservation_id=made[a % len(made)])
            )
        elif kind == "pass":
            await store.write(lambda db: reconcile_pass(db, Liveness(), 3600, True))
        invariants(store.path)
