"""Typed rows of the tables the services read most: a pool (its policy decoded once, its
typed model parsed once), a pool with the tenant's authz row, and a reservation.

A stored policy is kept as its stored text (P9: unknown fields stay as given), decoded on
first use and cached: a row whose policy column no longer decodes as a JSON object (a
damaged row) still loads, and only a step that needs the policy itself fails, with
INVALID_STATE naming it (the reconciler quarantines the pool's nodes with that reason, R5);
a view shows such a policy as ``{}``. Its typed model is parsed on first use and cached; a
policy that no longer parses (a model grown stricter since it was stored, or damaged)
still loads, with ``model`` None. The policy accessors read the model when it parses and
fall back to the stored object (nothing, when damaged) when it does not.
A reservation's ``resources`` is likewise decoded on first read, so that one bad row
fails only its own step of the placer's pass (R5).
"""

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import msgspec
from msgspec import UNSET, Struct

from shared.errors import InvalidInput, InvalidState
from shared.policy import Policy, parse_policy
from shared.schemas.reservations import Placement


class PoolRow(Struct, frozen=True, kw_only=True, dict=True):
    """A row of ``pools``; ``pool_class`` is the ``class`` column."""

    id: str
    owner_tenant_id: str
    site_id: str
    pool_class: str
    gpu_model: str | None
    sharing: str
    agent: str
    policy_json: str  # the ``policy`` column as stored
    provider_account_id: str | None
    version: int
    archived_at: str | None
    created_at: str
    updated_at: str

    @cached_property
    def stored_policy(self) -> dict[str, Any] | None:
        """The stored policy object, decoded once; None when the column no longer decodes as
        a JSON object (a damaged row)."""
        return stored_policy(self.policy_json)

    @property
    def policy(self) -> dict[str, Any]:
        """The stored policy object, as given (P9); INVALID_STATE naming it when damaged, so
        that only the step that needs it fails (R5)."""
        return policy_of(self.id, self.stored_policy)

    @cached_property
    def model(self) -> Policy | None:
        """The typed policy, parsed once; None when the stored policy no longer parses (R5)."""
        found = self.stored_policy
        if found is None:
            return None
        try:
            return parse_policy(found)
        except InvalidInput:
            return None

    @property
    def _raw(self) -> dict[str, Any]:
        """What the accessors fall back to when the model does not parse."""
        return self.stored_policy or {}

    @property
    def replicas(self) -> int:
        """Time-slice replicas per GPU (1 when the policy sets none)."""
        model = self.model
        if model is None:
            return int(self._raw.get("replicas", 1))
        return 1 if model.replicas is UNSET else model.replicas

    @property
    def max_pending(self) -> str | None:
        """How long a reservation may wait unplaced (``maxPending``), as written."""
        model = self.model
        if model is None:
            raw = self._raw.get("maxPending")
            return None if raw is None else str(raw)
        return None if model.maxPending is UNSET else model.maxPending

    @property
    def single_tenant(self) -> bool:
        model = self.model
        if model is None:
            return self._raw.get("singleTenant") is True
        return model.singleTenant is True

    @property
    def join_attestors(self) -> list[str]:
        """The attestors a node may join with (``join-token`` when the policy names none)."""
        model = self.model
        if model is None:
            return list(self._raw.get("joinAttestors") or ["join-token"])
        return ["join-token"] if model.joinAttestors is UNSET else list(model.joinAttestors)

    @property
    def budget_check(self) -> str | None:
        """``admission.budgetCheck``: ``meter`` when admission checks the GPU-hour budget."""
        model = self.model
        if model is None:
            check = (self._raw.get("admission") or {}).get("budgetCheck")
            return None if check is None else str(check)
        if model.admission is UNSET or model.admission.budgetCheck is UNSET:
            return None
        return model.admission.budgetCheck


class PoolAuthz(Struct, frozen=True, kw_only=True):
    """A pool's attributes as a tenant's authz row holds them (what conditions match)."""

    gpu_model: str | None
    pool_class: str
    sharing: str
    region: str
    owned: bool

    def attrs(self) -> dict[str, Any]:
        """The attributes statements' conditions match, under their names there."""
        return {
            "gpuModel": self.gpu_model,
            "class": self.pool_class,
            "sharing": self.sharing,
            "region": self.region,
            "owned": self.owned,
        }


class VisiblePool(PoolRow, frozen=True, kw_only=True, dict=True):
    """A pool with the tenant's authz row for it (``pool_for_tenant``, ``visible_pools``)."""

    authz: PoolAuthz


class ReservationRow(Struct, frozen=True, kw_only=True, dict=True):
    """A row of ``reservations``. ``resources`` is decoded on first read and cached: a row
    whose stored resources do not decode still loads, and fails only the step that reads it
    (R5: the placer counts it and goes on with the others)."""

    id: str
    tenant_id: str
    pool_id: str
    resources_json: str  # the ``resources`` column as stored
    mig_profile: str | None
    state: str
    reason: str | None
    node_id: str | None
    expires_at: str | None
    created_at: str
    updated_at: str
    placed_at: str | None
    ended_at: str | None
    placement_json: str | None = None  # D4: what it holds on its node, once placed
    delivery_state: str | None = None  # D5-D7: pending … released, once placed
    delivery_reason: str | None = None
    delivery_at: str | None = None
    ends_at: str | None = None  # C4: when its duration runs out; None: until ended

    @cached_property
    def resources(self) -> dict[str, int]:
        """Per resource, the amount asked for."""
        return msgspec.json.decode(self.resources_json, type=dict[str, int])

    @cached_property
    def placement(self) -> Placement | None:
        """D4: the devices, CPUs and memory it holds, once placed."""
        if not self.placement_json:
            return None
        return msgspec.json.decode(self.placement_json, type=Placement)


def stored_policy(text: str) -> dict[str, Any] | None:
    """A stored policy column as its object; None when it no longer decodes as one."""
    try:
        found = msgspec.json.decode(text)
    except msgspec.DecodeError:
        return None
    return found if isinstance(found, dict) else None


def policy_of(pool_id: str, stored: dict[str, Any] | None) -> dict[str, Any]:
    """A pool's decoded policy (``stored_policy``), or INVALID_STATE naming the pool's policy
    when it is damaged: the reason its nodes are quarantined with (R5)."""
    if stored is None:
        raise InvalidState(
            f"pool {pool_id}: its stored policy no longer decodes as a JSON object",
            field="policy",
        )
    return stored


def pool_row(row: Mapping[str, Any]) -> PoolRow:
    return PoolRow(**_pool_fields(row))


# A row of ``storage.pools``'s visible-pool statement: the pool's columns in table order
# (``POOL_COLUMNS`` of them), then the tenant's authz row (``authz_at``).
POOL_COLUMNS = 13


def authz_at(row: Sequence[Any]) -> PoolAuthz:
    """The tenant's authz columns of a visible-pool row."""
    gpu_model, pool_class, sharing, region, owned = row[POOL_COLUMNS:]
    return PoolAuthz(
        gpu_model=gpu_model,
        pool_class=pool_class,
        sharing=sharing,
        region=region,
        owned=bool(owned),
    )


def visible_pool_of(row: Sequence[Any]) -> VisiblePool:
    """A row of ``storage.pools``'s visible-pool statement, by position: no dict per row."""
    (pool_id, owner, site, pool_class, gpu_model, sharing, agent, policy, provider) = row[:9]
    (version, archived_at, created_at, updated_at) = row[9:POOL_COLUMNS]
    return VisiblePool(
        id=pool_id,
        owner_tenant_id=owner,
        site_id=site,
        pool_class=pool_class,
        gpu_model=gpu_model,
        sharing=sharing,
        agent=agent,
        policy_json=policy,
        provider_account_id=provider,
        version=version,
        archived_at=archived_at,
        created_at=created_at,
        updated_at=updated_at,
        authz=authz_at(row),
    )


def authz_of(row: Mapping[str, Any]) -> PoolAuthz:
    """The ``authz_*`` columns of a joined row."""
    return PoolAuthz(
        gpu_model=row["authz_gpu_model"],
        pool_class=row["authz_class"],
        sharing=row["authz_sharing"],
        region=row["authz_region"],
        owned=bool(row["authz_owned"]),
    )


def _pool_fields(row: Mapping[str, Any]) -> dict[str, Any]:
    return {
        "id": row["id"],
        "owner_tenant_id": row["owner_tenant_id"],
        "site_id": row["site_id"],
        "pool_class": row["class"],
        "gpu_model": row["gpu_model"],
        "sharing": row["sharing"],
        "agent": row["agent"],
        "policy_json": row["policy"],
        "provider_account_id": row["provider_account_id"],
        "version": row["version"],
        "archived_at": row["archived_at"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
    }


def reservation_row(row: Mapping[str, Any]) -> ReservationRow:
    return ReservationRow(
        id=row["id"],
        tenant_id=row["tenant_id"],
        pool_id=row["pool_id"],
        resources_json=row["resources"],
        mig_profile=row["mig_profile"],
        state=row["state"],
        reason=row["reason"],
        node_id=row["node_id"],
        expires_at=row["expires_at"],
        created_at=row["created_at"],
        updated_at=row["updated_at"],
        placed_at=row["placed_at"],
        ended_at=row["ended_at"],
        placement_json=row["placement"],
        delivery_state=row["delivery_state"],
        delivery_reason=row["delivery_reason"],
        delivery_at=row["delivery_at"],
        ends_at=row["ends_at"],
    )


def reservation_columns(row: ReservationRow) -> dict[str, Any]:
    """The row as the columns store it (``resources`` as JSON text)."""
    columns = msgspec.structs.asdict(row)
    columns["resources"] = columns.pop("resources_json")
    columns["placement"] = columns.pop("placement_json")
    return columns
