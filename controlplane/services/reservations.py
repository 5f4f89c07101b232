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
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec
import sqlite_utils
from msgspec import UNSET

from controlplane.iam.decide import Principal
from controlplane.services.access import act_for, pool_not_found, readable_pools
from controlplane.storage import events
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.db import Store, now, timestamp
from shared.errors import Conflict, InvalidInput, NotFound
from shared.ids import derived_id, new_id
from shared.mig import profiles_for
from shared.schemas import (
    BudgetsGet,
    BudgetsSet,
    BudgetView,
    ReservationList,
    ReservationsCreate,
    ReservationsEnd,
    ReservationsGet,
    ReservationsList,
    ReservationView,
)

ATOMS = {"exclusive": "gpu", "mig": "gpu.mig", "timeslice": "gpu.slot", "mps": "gpu.slot"}
PLACE_CANDIDATES = 32
_DURATION = re.compile(r"^(\d+)([smhd])$")
_SECONDS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def view(row: dict[str, Any]) -> ReservationView:
    return ReservationView(
        id=row["id"],
        tenant_id=row["tenant_id"],
        pool_id=row["pool_id"],
        resources=msgspec.json.decode(row["resources"]),
        mig_profile=row["mig_profile"],
        state=row["state"],
        reason=row["reason"],
        node_id=row["node_id"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        placed_at=row["placed_at"],
        ended_at=row["ended_at"],
        expires_at=row["expires_at"],
    )


def _epoch(at: str) -> float:
    return datetime.fromisoformat(at.replace("Z", "+00:00")).timestamp()


def check_request(pool: dict[str, Any], resources: dict[str, int], mig_profile: str | None) -> None:
    """S1: the atoms the pool's sharing mode offers; diskGiB only in vps-host pools."""
    if not resources:
        raise InvalidInput("ask for at least one resource", field="resources")
    atom = ATOMS[pool["sharing"]]
    for name in ("gpu", "gpu.mig", "gpu.slot"):
        if name in resources and name != atom:
            raise InvalidInput(
                f"a {pool['sharing']} pool offers {atom}, not {name}", field=f"resources.{name}"
            )
    if "diskGiB" in resources and pool["class"] != "vps-host":
        raise InvalidInput("diskGiB is a resource of vps-host pools", field="resources.diskGiB")
    if atom == "gpu.mig" and "gpu.mig" in resources:
        if mig_profile is None:
            raise InvalidInput("gpu.mig needs a migProfile", field="migProfile")
        if pool["gpu_model"] and mig_profile not in profiles_for(pool["gpu_model"]):
            raise InvalidInput(
                f"profile {mig_profile} does not exist on {pool['gpu_model']}", field="migProfile"
            )
    elif mig_profile is not None:
        raise InvalidInput("migProfile goes with gpu.mig", field="migProfile")


# --- GPU hours --------------------------------------------------------------


def meter_of(gpu_model: str | None) -> str | None:
    return f"gpu.{gpu_model.lower()}.hours" if gpu_model else None


def gpu_equivalents(resource: str, amount: int, profile: str | None, replicas: int) -> float:
    """A whole GPU counts 1; a MIG instance its share of the 7 compute slices; a slot 1/replicas."""
    if resource == "gpu":
        return float(amount)
    if resource == "gpu.mig" and profile:
        slices = int(profile.split("g.", 1)[0].split(".")[-1])
        return amount * slices / 7
    if resource == "gpu.slot":
        return amount / max(1, replicas)
    return 0.0


def spent_hours(db: sqlite_utils.Database, tenant_id: str, meter: str, at: float) -> float:
    """Hours spent on a meter: ended bookings (stored) plus live ones so far."""
    stored = res_sql.budget(db, tenant_id, meter)
    spent = stored["spent_hours"] if stored else 0.0
    for booking in res_sql.placed_gpu_hours(db, tenant_id):
        pool = pool_sql.get_pool(db, booking["pool_id"])
        if pool is None or meter_of(pool["gpu_model"]) != meter:
            continue
        policy = msgspec.json.decode(pool["policy"])
        share = gpu_equivalents(
            booking["resource"],
            booking["amount"],
            booking["mig_profile"],
            policy.get("replicas", 1),
        )
        spent += share * max(0.0, at - _epoch(booking["placed_at"])) / 3600
    return spent


# --- state changes ------------------------------------------------------------


def _event(
    db: sqlite_utils.Database, kind: str, row: dict[str, Any], owner: str, **data: Any
) -> None:
    events.append(
        db,
        f"reservation.{kind}",
        pool_id=row["pool_id"],
        data={
            "reservationId": row["id"],
            "tenantId": row["tenant_id"],
            "state": row["state"],
            **data,
        },
        audience=[row["tenant_id"], owner],
    )


def _give_back_quota(db: sqlite_utils.Database, row: dict[str, Any], at: str) -> None:
    for resource, amount in msgspec.json.decode(row["resources"]).items():
        res_sql.add_used(db, row["pool_id"], row["tenant_id"], resource, -amount, at)


def finish(
    db: sqlite_utils.Database, row: dict[str, Any], state: str, reason: str | None, message: str
) -> dict[str, Any]:
    """End or fail a live reservation: release its bookings, its quota and meter its GPU hours."""
    at = now()
    pool = pool_sql.get_pool(db, row["pool_id"])
    assert pool is not None
    booked = res_sql.release(db, row["id"])
    if row["state"] in res_sql.LIVE:
        _give_back_quota(db, row, at)
    meter = meter_of(pool["gpu_model"])
    if row["placed_at"] and meter:
        replicas = msgspec.json.decode(pool["policy"]).get("replicas", 1)
        share = sum(
            gpu_equivalents(b["resource"], b["amount"], row["mig_profile"], replicas)
            for b in booked
        )
        hours = share * max(0.0, time.time() - _epoch(row["placed_at"])) / 3600
        if hours:
            res_sql.add_spent(db, row["tenant_id"], meter, hours, at)
    fields = {"state": state, "reason": reason, "updated_at": at, "ended_at": at}
    res_sql.update(db, row["id"], fields)
    done = {**row, **fields}
    _event(
        db,
        "ended" if state == "ended" else "failed",
        done,
        pool["owner_tenant_id"],
        reason=reason,
        message=message,
    )
    return done


def place(db: sqlite_utils.Database, row: dict[str, Any], pool: dict[str, Any]) -> bool:
    """Book the reservation on the first ready host node it fits (atoms and rows); False if none."""
    resources: dict[str, int] = msgspec.json.decode(row["resources"])
    atom = ATOMS[pool["sharing"]]
    wanted_atoms = resources.get(atom, 0)
    rows_asked = {r: a for r, a in resources.items() if r not in ("gpu", "gpu.mig", "gpu.slot")}
    after = ""
    while True:  # keyset pages of candidates, until one fits or the pool has no more
        if wanted_atoms:
            candidates = res_sql.nodes_with_free_atoms(
                db, pool["id"], atom, row["mig_profile"], wanted_atoms, PLACE_CANDIDATES, after
            )
        else:
            candidates = res_sql.ready_nodes(db, pool["id"], PLACE_CANDIDATES, after)
        if not candidates:
            return False
        for node_id in candidates:
            if _book_on(db, row, pool, node_id, atom, wanted_atoms, rows_asked):
                return True
        after = candidates[-1]


def _book_on(
    db: sqlite_utils.Database,
    row: dict[str, Any],
    pool: dict[str, Any],
    node_id: str,
    atom: str,
    wanted_atoms: int,
    rows_asked: dict[str, int],
) -> bool:
    """Book the reservation on this node if its rows have room; False (nothing written) if not."""
    free = res_sql.free_rows(db, node_id)
    if any(free.get(resource, 0) < amount for resource, amount in rows_asked.items()):
        return False
    if wanted_atoms:
        booked = res_sql.book_atoms(db, node_id, atom, row["mig_profile"], wanted_atoms, row["id"])
        if booked != wanted_atoms:  # the candidate query said they were free in this transaction
            raise RuntimeError(f"booked {booked} of {wanted_atoms} {atom} atoms on {node_id}")
        res_sql.insert_booking(db, row["id"], node_id, atom, wanted_atoms)
    for resource, amount in rows_asked.items():
        if not res_sql.book_row(db, node_id, resource, amount):
            raise RuntimeError(f"{resource} on {node_id} was free a moment ago in this transaction")
        res_sql.insert_booking(db, row["id"], node_id, resource, amount)
    at = now()
    fields = {
        "state": "placed",
        "node_id": node_id,
        "placed_at": at,
        "updated_at": at,
        "reason": None,
    }
    res_sql.update(db, row["id"], fields)
    _event(db, "placed", {**row, **fields}, pool["owner_tenant_id"], nodeId=node_id)
    return True


def activate(
    db: sqlite_utils.Database, row: dict[str, Any], seen_since: Callable[[str], float | None]
) -> bool:
    """placed → active once the node holding the booking has reported since it was placed:
    the host is known to be up with the booking on it. True if it moved."""
    seen = seen_since(row["node_id"])
    if seen is None or seen < _epoch(row["placed_at"]):
        return False
    fields = {"state": "active", "updated_at": now()}
    res_sql.update(db, row["id"], fields)
    pool = pool_sql.get_pool(db, row["pool_id"])
    assert pool is not None
    _event(db, "active", {**row, **fields}, pool["owner_tenant_id"], nodeId=row["node_id"])
    return True


def retry_pending(db: sqlite_utils.Database, row: dict[str, Any], at: str) -> bool:
    """The placer's pass over one pending reservation: PoolGone, Expired, or another try to
    place it; True if it moved."""
    pool = pool_sql.get_pool(db, row["pool_id"])
    assert pool is not None
    offered = pool_sql.authz_row_exists(db, row["tenant_id"], pool["id"])
    if pool["archived_at"] is not None or not offered or row["reason"] == "PoolGone":
        message = "the pool is archived" if pool["archived_at"] else "the pool is no longer offered"
        finish(db, row, "failed", "PoolGone", message)
        return True
    if row["expires_at"] and row["expires_at"] <= at:
        finish(db, row, "failed", "Expired", "not placed within the pool's maxPending")
        return True
    return place(db, row, pool)


# --- the API --------------------------------------------------------------------


def _max_pending(policy: dict[str, Any]) -> float | None:
    match = _DURATION.match(str(policy.get("maxPending", "")))
    return int(match[1]) * _SECONDS[match[2]] if match else None


async def create_reservation(
    store: Store, principal: Principal, req: ReservationsCreate
) -> ReservationView:
    resources: dict[str, int] = msgspec.to_builtins(req.resources)
    mig_profile = None if req.mig_profile is UNSET else req.mig_profile

    def txn(db: sqlite_utils.Database) -> ReservationView:
        # The method's decision (R1) ran first: create on the pool, or a read of the keyed one.
        if req.idempotency_key is UNSET:
            reservation_id = new_id("res")
        else:
            # A retry returns what the first call made, whatever the pool has become since.
            reservation_id = derived_id(
                "res", req.tenant_id, principal.tenant_id, req.idempotency_key
            )
            stored = res_sql.get(db, reservation_id)
            if stored is not None:
                same = (
                    stored["pool_id"] == req.pool_id
                    and msgspec.json.decode(stored["resources"]) == resources
                )
                if not same or stored["mig_profile"] != mig_profile:
                    raise Conflict(
                        "idempotencyKey was used with different parameters", field="idempotencyKey"
                    )
                return view(stored)
        pool = pool_sql.pool_for_tenant(db, req.tenant_id, req.pool_id)
        # A1: an archived pool takes no new work; for everyone it is NOT_FOUND here.
        if pool is None or pool["archived_at"] is not None:
            raise pool_not_found()
        check_request(pool, resources, mig_profile)
        policy = msgspec.json.decode(pool["policy"])
        at = now()
        wait = _max_pending(policy)
        row: dict[str, Any] = {
            "id": reservation_id,
            "tenant_id": req.tenant_id,
            "pool_id": pool["id"],
            "resources": msgspec.json.encode(resources).decode(),
            "mig_profile": mig_profile,
            "state": "pending",
            "reason": None,
            "expires_at": timestamp(time.time() + wait) if wait else None,
            "created_at": at,
            "updated_at": at,
        }
        refusal = None
        for resource, amount in resources.items():
            quota = res_sql.quota(db, pool["id"], req.tenant_id, resource)
            maximum, used = (quota["max"], quota["used"]) if quota else (0, 0)  # no row grants 0
            if used + amount > maximum:
                refusal = (
                    "QuotaExceeded",
                    f"{resource}: {used} in use + {amount} asked > {maximum}",
                )
                break
        meter = meter_of(pool["gpu_model"])
        if (
            refusal is None
            and meter
            and (policy.get("admission") or {}).get("budgetCheck") == "meter"
        ):
            budget = res_sql.budget(db, req.tenant_id, meter)
            limit = None if budget is None else budget["limit_hours"]
            if limit is not None and spent_hours(db, req.tenant_id, meter, time.time()) >= limit:
                refusal = ("BudgetExhausted", f"{meter} budget of {limit} h is spent")
        if refusal is not None:
            row.update(state="failed", reason=refusal[0], ended_at=at)
            res_sql.insert(db, row)
            row = res_sql.get(db, reservation_id) or row
            _event(
                db, "failed", row, pool["owner_tenant_id"], reason=refusal[0], message=refusal[1]
            )
            return view(row)
        res_sql.insert(db, row)
        for resource, amount in resources.items():
            res_sql.add_used(db, pool["id"], req.tenant_id, resource, amount, at)
        _event(db, "created", row, pool["owner_tenant_id"])
        place(db, row, pool)
        stored = res_sql.get(db, reservation_id)
        assert stored is not None
        return view(stored)

    return await store.write(txn)


def _own_reservation(
    db: sqlite_utils.Database, tenant_id: str, reservation_id: str
) -> dict[str, Any]:
    """The reservation the method's decision (R1) found; NOT_FOUND for anyone else's."""
    row = res_sql.get(db, reservation_id)
    if row is None or row["tenant_id"] != tenant_id:
        raise NotFound("reservation not found", field="reservationId")
    return row


def get_reservation(
    db: sqlite_utils.Database, principal: Principal, req: ReservationsGet
) -> ReservationView:
    return view(_own_reservation(db, req.tenant_id, req.reservation_id))


def list_reservations(
    db: sqlite_utils.Database, principal: Principal, req: ReservationsList
) -> ReservationList:
    found = res_sql.of_tenant(
        db,
        req.tenant_id,
        None if req.pool_id is UNSET else req.pool_id,
        None if req.states is UNSET else req.states,
    )
    # R1: only reservations in pools the credential may read them in.
    allowed = readable_pools(
        db, principal, req.tenant_id, {row["pool_id"] for row in found}, "compute:reservations:read"
    )
    return ReservationList(items=[view(row) for row in found if row["pool_id"] in allowed])


async def end_reservation(
    store: Store, principal: Principal, req: ReservationsEnd
) -> ReservationView:
    """End a live reservation (its bookings and quota go back); ending an ended one returns it."""

    def txn(db: sqlite_utils.Database) -> ReservationView:
        row = _own_reservation(db, req.tenant_id, req.reservation_id)
        if row["state"] not in res_sql.LIVE:
            return view(row)
        return view(finish(db, row, "ended", None, "ended by the tenant"))

    return await store.write(txn)


def end_all_of_tenant(db: sqlite_utils.Database, tenant_id: str) -> int:
    """T1: a deleted tenant's live reservations end."""
    live = res_sql.live_of_tenant(db, tenant_id)
    for row in live:
        finish(db, row, "ended", "TenantDeleted", "the tenant was deleted")
    return len(live)


async def set_budget(store: Store, principal: Principal, req: BudgetsSet) -> BudgetView:
    def txn(db: sqlite_utils.Database) -> BudgetView:
        act_for(db, principal, req.tenant_id, "compute:budgets:set")
        res_sql.put_budget(db, req.tenant_id, req.meter, req.limit, now())
        spent = spent_hours(db, req.tenant_id, req.meter, time.time())
        return BudgetView(
            tenant_id=req.tenant_id, meter=req.meter, limit=req.limit, spent=round(spent, 6)
        )

    return await store.write(txn)


def get_budget(db: sqlite_utils.Database, principal: Principal, req: BudgetsGet) -> BudgetView:
    stored = res_sql.budget(db, req.tenant_id, req.meter)
    spent = spent_hours(db, req.tenant_id, req.meter, time.time())
    limit = stored["limit_hours"] if stored else None
    return BudgetView(tenant_id=req.tenant_id, meter=req.meter, limit=limit, spent=round(spent, 6))
