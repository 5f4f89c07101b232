"""Reservations: admission (IAM, quota, budget) and the placer, in one transaction each.

A reservation names one pool and asks for atoms by its sharing mode (S1) plus
rows. Admission counts it against the tenant's quota rows at once (`used`
follows live reservations); the placer books atoms and rows on one ready host
node, never more than a row's capacity or an atom twice. Pending reservations
are retried by every reconciler pass until the pool's `maxPending` (Expired),
and fail with PoolGone once the pool is archived or no longer offered (O6, A1).
"""

import re
import time

import msgspec
from msgspec import UNSET

from controlplane.capacity.bookings import count_used, finish, place, reservation_event
from controlplane.capacity.meters import meter_of
from controlplane.capacity.placer import ATOMS
from controlplane.services.access import pool_not_found, readable_pools
from controlplane.services.budgets import spent_hours
from controlplane.services.call import Call
from controlplane.services.paging import page, position, scope
from controlplane.storage import budgets as budget_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import quotas as quota_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import Store, now, timestamp
from controlplane.storage.sql import Database
from controlplane.storage.types import PoolRow, ReservationRow
from shared.errors import Conflict, InvalidInput
from shared.ids import derived_id, new_id
from shared.mig import profiles_for
from shared.schemas import (
    Delivery,
    ReservationList,
    ReservationsCreate,
    ReservationsEnd,
    ReservationsGet,
    ReservationsList,
    ReservationView,
)

_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def view(row: ReservationRow) -> ReservationView:
    return ReservationView(
        id=row.id,
        tenant_id=row.tenant_id,
        pool_id=row.pool_id,
        resources=row.resources,
        mig_profile=row.mig_profile,
        state=row.state,
        reason=row.reason,
        node_id=row.node_id,
        created_at=row.created_at,
        updated_at=row.updated_at,
        placed_at=row.placed_at,
        ended_at=row.ended_at,
        expires_at=row.expires_at,
        ends_at=row.ends_at,
        placement=row.placement,
        delivery=(
            None
            if row.delivery_state is None
            else Delivery(
                state=row.delivery_state,  # type: ignore[arg-type]
                reason=row.delivery_reason,
                at=row.delivery_at or row.updated_at,
            )
        ),
    )


def check_request(pool: PoolRow, resources: dict[str, int], mig_profile: str | None) -> None:
    """S1: the atoms the pool's sharing mode offers; diskGiB only in vps-host pools."""
    if not resources:
        raise InvalidInput("ask for at least one resource", field="resources")
    atom = ATOMS[pool.sharing]
    for name in ("gpu", "gpu.mig", "gpu.slot"):
        if name in resources and name != atom:
            raise InvalidInput(
                f"a {pool.sharing} pool offers {atom}, not {name}", field=f"resources.{name}"
            )
    if "diskGiB" in resources and pool.pool_class != "vps-host":
        raise InvalidInput("diskGiB is a resource of vps-host pools", field="resources.diskGiB")
    if atom == "gpu.mig" and "gpu.mig" in resources:
        if mig_profile is None:
            raise InvalidInput("gpu.mig needs a migProfile", field="migProfile")
        if pool.gpu_model and mig_profile not in profiles_for(pool.gpu_model):
            raise InvalidInput(
                f"profile {mig_profile} does not exist on {pool.gpu_model}", field="migProfile"
            )
    elif mig_profile is not None:
        raise InvalidInput("migProfile goes with gpu.mig", field="migProfile")


# --- GPU hours --------------------------------------------------------------


# --- state changes ------------------------------------------------------------


# --- the API --------------------------------------------------------------------


def _max_pending(max_pending: str | None) -> float | None:
    match = _DURATION.match(max_pending or "")
    return int(match[1]) * _SECONDS[match[2]] if match else None


def _ends_at(db: Database, pool: PoolRow, req: ReservationsCreate) -> str | None:
    """C4: when a reservation with ``durationSeconds`` ends: never after the end of the offer
    it is made under (C3)."""
    if req.duration_seconds is UNSET:
        return None
    ends_at = timestamp(time.time() + req.duration_seconds)
    offer = pool_sql.offer_to(db, pool.id, req.tenant_id)
    if offer is not None and offer.not_after is not None and ends_at > offer.not_after:
        raise InvalidInput(
            f"durationSeconds would end the reservation at {ends_at}, after its offer "
            f"ends at {offer.not_after}",
            field="durationSeconds",
            offerEndsAt=offer.not_after,
        )
    return ends_at


def end_timed_up(db: Database, row: ReservationRow) -> bool:
    """C4: a reservation whose duration ran out ends TimeUp: its quota back at once, its
    bookings released as the host confirms (D7)."""
    finish(db, row, "ended", "TimeUp", f"its duration ran out at {row.ends_at}")
    return True


async def create_reservation(store: Store, call: Call[ReservationsCreate]) -> ReservationView:
    principal, req = call.principal, call.body
    resources: dict[str, int] = msgspec.to_builtins(req.resources)
    mig_profile = None if req.mig_profile is UNSET else req.mig_profile

    def txn(db: Database) -> ReservationView:
        # The method's decision (R1) ran first: create on the pool, or a read of the keyed one.
        if req.idempotency_key is UNSET:
            reservation_id = new_id("res")
        else:
            # A retry returns what the first call made, whatever the pool has become since.
            reservation_id = derived_id(
                "res", req.tenant_id, principal.tenant_id, req.idempotency_key
            )
            stored = call.found  # what the key made, if the decision found it (P4)
            if isinstance(stored, ReservationRow):
                same = stored.pool_id == req.pool_id and stored.resources == resources
                if not same or stored.mig_profile != mig_profile:
                    raise Conflict(
                        "idempotencyKey was used with different parameters", field="idempotencyKey"
                    )
                return view(stored)
        pool = call.pool  # visible to the tenant, decided in this transaction
        # A1: an archived pool takes no new work; for everyone it is NOT_FOUND here.
        if pool.archived_at is not None:
            raise pool_not_found()
        check_request(pool, resources, mig_profile)
        at = now()
        ends_at = _ends_at(db, pool, req)
        wait = _max_pending(pool.max_pending)
        row = ReservationRow(
            id=reservation_id,
            tenant_id=req.tenant_id,
            pool_id=pool.id,
            resources_json=msgspec.json.encode(resources).decode(),
            mig_profile=mig_profile,
            state="pending",
            reason=None,
            node_id=None,
            expires_at=timestamp(time.time() + wait) if wait else None,
            created_at=at,
            updated_at=at,
            placed_at=None,
            ended_at=None,
            ends_at=ends_at,
        )
        refusal = None
        for resource, amount in resources.items():
            quota = quota_sql.quota(db, pool.id, req.tenant_id, resource)
            maximum, used = (quota.max, quota.used) if quota else (0, 0)  # no row grants 0
            if used + amount > maximum:
                refusal = (
                    "QuotaExceeded",
                    f"{resource}: {used} in use + {amount} asked > {maximum}",
                )
                break
        meter = meter_of(pool.gpu_model)
        if refusal is None and meter and pool.budget_check == "meter":
            budget = budget_sql.budget(db, req.tenant_id, meter)
            limit = None if budget is None else budget.limit_hours
            if limit is not None and spent_hours(db, req.tenant_id, meter, time.time()) >= limit:
                refusal = ("BudgetExhausted", f"{meter} budget of {limit} h is spent")
        if refusal is not None:
            row = msgspec.structs.replace(row, state="failed", reason=refusal[0], ended_at=at)
            res_sql.insert(db, row)
            row = res_sql.get(db, reservation_id) or row
            reservation_event(
                db, "failed", row, pool.owner_tenant_id, reason=refusal[0], message=refusal[1]
            )
            return view(row)
        res_sql.insert(db, row)
        count_used(db, row, 1, at)
        reservation_event(db, "created", row, pool.owner_tenant_id)
        call.env.counters.placement(place(db, row, pool))
        stored = res_sql.get(db, reservation_id)
        assert stored is not None
        return view(stored)

    return await store.write(txn)


def get_reservation(db: Database, call: Call[ReservationsGet]) -> ReservationView:
    return view(call.reservation)  # the tenant's own, as the decision (R1) found it


def list_reservations(db: Database, call: Call[ReservationsList]) -> ReservationList:
    """B1: the tenant's reservations in id order, a page at a time."""
    principal, req = call.principal, call.body
    found, cursor = page(
        db,
        scope("reservations", req),
        res_sql.of_tenant(
            db,
            req.tenant_id,
            None if req.pool_id is UNSET else req.pool_id,
            None if req.states is UNSET else req.states,
            position(db, scope("reservations", req), req.cursor),
            req.limit + 1,
        ),
        req.limit,
        lambda row: row.id,
    )
    # R1: only reservations in pools the credential may read them in; the cursor moves past
    # the ones left out.
    allowed = readable_pools(
        db, principal, req.tenant_id, {row.pool_id for row in found}, "compute:reservations:read"
    )
    return ReservationList(
        items=[view(row) for row in found if row.pool_id in allowed],
        next=cursor,
    )


async def end_reservation(store: Store, call: Call[ReservationsEnd]) -> ReservationView:
    """End a live reservation (its bookings and quota go back); ending an ended one returns it."""

    def txn(db: Database) -> ReservationView:
        row = call.reservation  # the tenant's own, decided in this transaction (R1)
        if row.state not in res_sql.LIVE:
            return view(row)
        return view(finish(db, row, "ended", None, "ended by the tenant"))

    return await store.write(txn)


def end_all_of_tenant(db: Database, tenant_id: str) -> int:
    """T1: a deleted tenant's live reservations end."""
    live = res_sql.live_of_tenant(db, tenant_id)
    for row in live:
        finish(db, row, "ended", "TenantDeleted", "the tenant was deleted")
    return len(live)
