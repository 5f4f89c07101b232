"""Pools: create, get, list, capacity, update, archive (P1–P9, L1–L3, U1–U3, A1–A2, E1).

Every mutation runs as one function inside the writer's transaction: the
checks, the rows, the version and the event commit together or not at all.
"""

from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import UNSET

from controlplane.capacity.plan import Change, plan_change
from controlplane.iam.decide import decide
from controlplane.services.call import Call
from controlplane.services.paging import page, position, scope
from controlplane.services.quotas import coverage, drop_to_in_use, grant
from controlplane.services.views import offers_by_pool, pool_view, pool_views
from controlplane.storage import events
from controlplane.storage import pools as pool_sql
from controlplane.storage import quotas as quota_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage import sites as site_sql
from controlplane.storage.db import Store, now
from controlplane.storage.ledger_types import LedgerRow
from controlplane.storage.sql import Database
from controlplane.storage.types import PoolRow, authz_at
from shared.errors import Conflict, InvalidInput, InvalidState, NotFound
from shared.ids import derived_id, new_id
from shared.policy import POOL_POLICY_VALIDATORS, Policy, validate_policy
from shared.policy.model import policy_warnings
from shared.schemas import (
    CapacityList,
    CapacityRow,
    PoolList,
    PoolPlan,
    PoolsArchive,
    PoolsCapacity,
    PoolsCreate,
    PoolsGet,
    PoolsList,
    PoolsUpdate,
    PoolView,
)

UNLIMITED_GPUS = {"gpu": 2147483647}  # P3: the owner's default quota
# P4: what a retry under the same key must repeat; column → API name.
IDEMPOTENT_FIELDS = {
    "site_id": "siteId",
    "class": "class",
    "sharing": "sharing",
    "agent": "agent",
    "provider_account_id": "providerAccountId",
}
ATTRIBUTES = {"class": "pool_class"}  # a column whose PoolRow attribute is named otherwise


def check_policy(
    policy: dict[str, Any],
    *,
    pool_class: str,
    sharing: str,
    gpu_model: str | None,
    site_kind: str,
    attestors: frozenset[str],
) -> Policy:
    """Every module's pool-policy validator (P6); INVALID_INPUT reading ``policy: ...``;
    returns the typed policy."""
    return validate_policy(
        policy,
        POOL_POLICY_VALIDATORS,
        pool_class=pool_class,
        sharing=sharing,
        gpu_model=gpu_model,
        site_kind=site_kind,
        attestors=attestors,
    )


def _with_warnings(view: PoolView) -> PoolView:
    """P9: create and update answer the stored policy's fields the code does not read."""
    return msgspec.structs.replace(view, warnings=policy_warnings(view.policy))


def _creation_fields(req: PoolsCreate) -> dict[str, Any]:
    """P1, P5: the defaults and the provider-class rules, before anything is read."""
    agent = req.agent
    if req.pool_class == "provider":
        if req.provider_account_id is UNSET:
            raise InvalidInput("a provider pool needs providerAccountId", field="providerAccountId")
        if agent is UNSET:
            agent = "none"
        if agent != "none":
            raise InvalidInput("a provider pool needs agent: none", field="agent")
    elif req.provider_account_id is not UNSET:
        raise InvalidInput("only provider pools take providerAccountId", field="providerAccountId")
    return {
        "site_id": req.site_id,
        "class": req.pool_class,
        "sharing": req.sharing,
        "agent": "bcd" if agent is UNSET else agent,
        "provider_account_id": None
        if req.provider_account_id is UNSET
        else req.provider_account_id,
    }


async def create_pool(store: Store, call: Call[PoolsCreate]) -> PoolView:
    principal, req = call.principal, call.body
    attestors = call.env.attestors
    fields = _creation_fields(req)
    policy = {} if req.policy is UNSET else req.policy
    owner_quota = UNLIMITED_GPUS if req.owner_quota is UNSET else req.owner_quota
    gpu_model = None if req.gpu_model is UNSET else req.gpu_model

    def txn(db: Database) -> PoolView:
        # The method's decision (R1) ran first: compute:pools:create, or a read of the keyed pool.
        if req.idempotency_key is UNSET:
            pool_id = new_id("pool")
        else:
            # P4: the id is derived, and a retry returns the stored pool without a second decision.
            pool_id = derived_id("pool", req.tenant_id, principal.tenant_id, req.idempotency_key)
            stored = pool_sql.pool_for_tenant(db, req.tenant_id, pool_id)
            if stored is not None:
                for column, name in IDEMPOTENT_FIELDS.items():
                    if getattr(stored, ATTRIBUTES.get(column, column)) != fields[column]:
                        raise Conflict(
                            "idempotencyKey was used with different parameters",
                            field="idempotencyKey",
                            differs=name,
                        )
                return pool_view(db, stored, req.tenant_id)
        site = site_sql.get_site(db, req.site_id)
        if site is None or site.owner_tenant_id != req.tenant_id:
            raise NotFound("site not found", field="siteId")
        check_policy(
            policy,
            pool_class=fields["class"],
            sharing=fields["sharing"],
            gpu_model=gpu_model,
            site_kind=site.kind,
            attestors=attestors,
        )
        at = now()
        row = {
            **fields,
            "id": pool_id,
            "owner_tenant_id": req.tenant_id,
            "gpu_model": gpu_model,
            "policy": msgspec.json.encode(policy).decode(),
            "created_at": at,
        }
        pool_sql.insert_pool(db, row)
        grant(db, pool_id, req.tenant_id, dict(owner_quota), at)
        pool = pool_sql.get_pool(db, pool_id)
        assert pool is not None
        pool_sql.put_authz(db, req.tenant_id, pool, site.region)
        events.append(
            db,
            "pool.created",
            pool_id=pool_id,
            data={
                "ownerTenantId": req.tenant_id,
                "siteId": req.site_id,
                "class": fields["class"],
                "gpuModel": gpu_model,
                "sharing": fields["sharing"],
                "agent": fields["agent"],
                "version": 1,
            },
            audience=[req.tenant_id],
        )
        return pool_view(db, pool, req.tenant_id)

    return _with_warnings(await store.write(txn))


def get_pool(db: Database, call: Call[PoolsGet]) -> PoolView:
    return pool_view(db, call.pool, call.body.tenant_id)


def list_pools(db: Database, call: Call[PoolsList]) -> PoolList:
    """L1, B1: owned or offered pools in id order, each decided as compute:pools:read on the
    pool; without limit every pool, else a page whose cursor moves past the pools left out.
    A page costs the same few reads whatever its size: its quota rows, the owner's offers."""
    principal, req = call.principal, call.body
    limit = None if req.limit is UNSET else req.limit
    after = position(db, scope("pools", req), req.cursor)
    found, cursor = page(
        db,
        scope("pools", req),
        pool_sql.visible_pool_rows(
            db,
            req.tenant_id,
            after,
            None if limit is None else limit + 1,
            authz=not principal.is_admin,  # its tenant's admin decides on no attributes
        ),
        limit,
        lambda row: str(row[0]),
    )
    rows = (
        found
        if principal.is_admin  # its tenant's admin reads every pool it sees: no attributes
        else [
            row
            for row in found
            if decide(principal, "compute:pools:read", "compute-pool", authz_at(row).attrs())
        ]
    )
    figures = quota_sql.quota_figures(db, req.tenant_id, after, rows[-1][0]) if rows else []
    offers = offers_by_pool(db, [row[0] for row in rows if row[1] == req.tenant_id])
    ends = pool_sql.offer_ends(
        db, req.tenant_id, [row[0] for row in rows if row[1] != req.tenant_id]
    )
    return PoolList(items=pool_views(rows, req.tenant_id, figures, offers, ends), next=cursor)


def pool_capacity(db: Database, call: Call[PoolsCapacity]) -> CapacityList:
    """L3, H6: one ledger row per resource, the same answer as capacity/byPool; `offered`
    (what the owner sold) only for the owner."""
    pool = call.pool  # decided as compute:capacity:read on it
    offered = (
        quota_sql.offered_maxima(db, pool.id, pool.owner_tenant_id) if pool.authz.owned else None
    )
    ledger = {row.resource: row for row in pool_sql.capacity_ledger(db, pool.id)}
    return CapacityList(
        items=[
            CapacityRow(
                pool_id=pool.id,
                resource=resource,
                total=row.total,
                schedulable=row.schedulable,
                allocated=row.allocated,
                available=row.available,
                releasing=row.releasing,
                offered=UNSET if offered is None else offered.get(resource, 0),
                coverage=UNSET
                if offered is None
                else coverage(row.schedulable, offered.get(resource, 0)),
            )
            for resource in sorted(ledger.keys() | (offered or {}).keys())
            # What was sold with no capacity behind it at all is the gap the ledger shows.
            for row in [ledger.get(resource) or LedgerRow(resource=resource)]
        ]
    )


def _refresh_authz(db: Database, pool: PoolRow, region: str) -> list[str]:
    """Rewrite the authz rows of the owner and every offered tenant; returns those tenants."""
    tenants = [pool.owner_tenant_id] + [
        offer.to_tenant_id for offer in pool_sql.offers_of(db, pool.id)
    ]
    for tenant in tenants:
        pool_sql.put_authz(db, tenant, pool, region)
    return tenants


@dataclass(frozen=True)
class Updated:
    """What pools/update makes of a pool (U1, U2), before anything is written: the real
    update writes it, a dry run (C1) plans it."""

    pool: PoolRow  # as it would be stored, its version still the current one
    model: Policy  # the new policy, typed
    region: str  # the site's, for the authz rows


def updated(db: Database, call: Call[PoolsUpdate]) -> Updated:
    """The checks of an update and the pool it would make (U1, U2, P6)."""
    req = call.body
    pool = call.pool  # owned, at the version asked (R3), decided in this transaction
    if pool.archived_at is not None:
        raise InvalidState("the pool is archived")
    policy = pool.policy if req.policy is UNSET else req.policy
    gpu_model = pool.gpu_model if req.gpu_model is UNSET else req.gpu_model
    site = site_sql.get_site(db, pool.site_id)
    assert site is not None
    model = check_policy(
        policy,
        pool_class=pool.pool_class,
        sharing=pool.sharing,
        gpu_model=gpu_model,
        site_kind=site.kind,
        attestors=call.env.attestors,
    )
    if model.singleTenant is True and not pool.single_tenant:
        offers = pool_sql.offers_of(db, pool.id)
        if len(offers) > 1 or any(o.include_descendants for o in offers):
            raise InvalidState(
                "singleTenant needs at most one offered tenant and no includeDescendants",
                field="policy.singleTenant",
            )
    new = msgspec.structs.replace(
        pool, gpu_model=gpu_model, policy_json=msgspec.json.encode(policy).decode()
    )
    return Updated(new, model, site.region)


async def update_pool(store: Store, call: Call[PoolsUpdate]) -> PoolView | PoolPlan:
    req = call.body
    if req.policy is UNSET and req.gpu_model is UNSET:
        raise InvalidInput("give policy, gpuModel or both", field="policy")
    if req.dry_run:
        return await store.read(lambda db: plan_update(db, call))

    def txn(db: Database) -> PoolView:
        change = updated(db, call)
        pool = change.pool
        at = now()
        pool_sql.update_pool(db, pool.id, pool.gpu_model, pool.policy_json, at)
        stored = pool_sql.get_pool(db, pool.id)
        assert stored is not None
        audience = _refresh_authz(db, stored, change.region)
        changed = [
            name
            for name, given in (("policy", req.policy), ("gpuModel", req.gpu_model))
            if given is not UNSET
        ]
        events.append(
            db,
            "pool.updated",
            pool_id=pool.id,
            data={"version": stored.version, "changed": changed, "gpuModel": pool.gpu_model},
            audience=audience,
        )
        return pool_view(db, stored, req.tenant_id)

    return _with_warnings(await store.write(txn))


def plan_update(db: Database, call: Call[PoolsUpdate]) -> PoolPlan:
    """C1: the update's plan, read in one snapshot and written nowhere: the pool as it would
    be (its current version: the one to apply it with, R3) and what it does to the fleet."""
    current = call.pool
    change = updated(db, call)
    view = _with_warnings(pool_view(db, change.pool, call.body.tenant_id))
    before = current.model
    plan = plan_change(
        db,
        Change(
            pool=current,
            before=before if before is not None else change.model,
            after=change.model,
            gpu_model=change.pool.gpu_model,
        ),
        [] if view.warnings is UNSET else view.warnings,
    )
    return PoolPlan(pool=view, plan=plan)


def archive_in_txn(db: Database, pool: PoolRow, *, reason: str | None = None) -> list[str]:
    """A1: remove every offer, drop offered quotas, remove their authz rows, emit pool.archived.

    A tenant deletion (T1) zeroes the offered quotas instead of dropping them to what is in use.
    """
    at = now()
    unoffered = []
    for offer in pool_sql.offers_of(db, pool.id):
        tenant = offer.to_tenant_id
        pool_sql.delete_offer(db, pool.id, tenant)
        if reason is None:
            drop_to_in_use(db, pool.id, tenant, at)
        else:
            quota_sql.zero_quotas(db, pool.id, tenant, at)
        pool_sql.delete_authz(db, tenant, pool.id)
        unoffered.append(tenant)
    pool_sql.archive_pool(db, pool.id, at)
    res_sql.mark_pool_gone(db, pool.id)
    data: dict[str, Any] = {"unofferedTenants": unoffered}
    if reason is not None:
        data["reason"] = reason
    events.append(
        db,
        "pool.archived",
        pool_id=pool.id,
        data=data,
        audience=[pool.owner_tenant_id, *unoffered],
    )
    return unoffered


async def archive_pool(store: Store, call: Call[PoolsArchive]) -> PoolView:
    req = call.body

    def txn(db: Database) -> PoolView:
        pool = call.pool  # owned, at the version asked (R3), decided in this transaction
        if pool.archived_at is not None:  # A2: archiving again returns it unchanged
            return pool_view(db, pool, req.tenant_id)
        archive_in_txn(db, pool)
        archived = pool_sql.get_pool(db, pool.id)
        assert archived is not None
        return pool_view(db, archived, req.tenant_id)

    return await store.write(txn)
