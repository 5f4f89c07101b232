"""Access checks: acting for a tenant, seeing or managing a pool, and the decision every
method of the table declares (``Access``) and makes before its service runs (R1)."""

from dataclasses import dataclass
from typing import Any, Literal

from msgspec import UNSET, UnsetType

from controlplane.iam.decide import Principal, decide
from controlplane.services.call import Caller, Found
from controlplane.storage import iam as iam_sql
from controlplane.storage import nodes as node_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage import reservations as res_sql
from controlplane.storage.node_types import NodeHead
from controlplane.storage.sql import Database
from controlplane.storage.types import ReservationRow, VisiblePool
from shared.errors import Conflict, NotFound, PermissionDenied
from shared.ids import derived_id


def act_for(db: Database, principal: Principal, tenant_id: str, action: str) -> None:
    """The credential may act for ``tenant_id``, which must exist.

    A credential acts for its own tenant. Root's act for any tenant through
    ``compute-fleet``, so a root credential's statements decide that too.
    """
    if principal.tenant_id == tenant_id:
        return
    if not principal.acts_for(tenant_id) or not decide(principal, action, "compute-fleet"):
        raise PermissionDenied("this credential may not act for that tenant", field="tenantId")
    if iam_sql.get_tenant(db, tenant_id) is None:
        raise NotFound("tenant not found", field="tenantId")


def authz_attrs(pool: VisiblePool) -> dict[str, Any]:
    """The attributes statements' conditions match, from the pool's authz row for the tenant."""
    return pool.authz.attrs()


def pool_not_found() -> NotFound:
    return NotFound("pool not found", field="poolId")


def visible_pool(
    db: Database, principal: Principal, tenant_id: str, pool_id: str, action: str
) -> VisiblePool:
    """The pool as ``tenant_id`` may read it, or NOT_FOUND (L2): never reveal existence."""
    pool = pool_sql.pool_for_tenant(db, tenant_id, pool_id)
    if pool is None or not decide(principal, action, "compute-pool", authz_attrs(pool)):
        raise pool_not_found()
    return pool


def owned_pool(
    db: Database,
    principal: Principal,
    tenant_id: str,
    pool_id: str,
    action: str,
    version: int | UnsetType = UNSET,
) -> VisiblePool:
    """A pool ``tenant_id`` owns, for an owner-only action: anyone else gets NOT_FOUND (O1, U1, A1).

    An owner whose credential may see the pool but not take the action gets
    PERMISSION_DENIED: the pool's existence is no secret to it. A ``version`` the caller
    last read that is no longer the pool's is CONFLICT (R3), checked in the mutation's
    own transaction.
    """
    pool = pool_sql.pool_for_tenant(db, tenant_id, pool_id)
    if pool is None or not pool.authz.owned:
        raise pool_not_found()
    attrs = authz_attrs(pool)
    if not decide(principal, action, "compute-pool", attrs):
        if decide(principal, "compute:pools:read", "compute-pool", attrs):
            raise PermissionDenied(f"{action} is not allowed on this pool", action=action)
        raise pool_not_found()
    if version is not UNSET and version != pool.version:
        raise Conflict(
            f"stale version: the pool is at version {pool.version}, not {version}",
            field="version",
            current=pool.version,
        )
    return pool


# --- the method table's decision (R1) -------------------------------------------

# Where a method's resource is found in its body, and so what its action is decided on.
Scope = Literal[
    "fleet",  # the whole fleet: root's credentials only (compute-fleet)
    "tenant",  # the tenant named by tenantId (compute-tenant)
    "pool",  # the pool poolId, visible to tenantId (compute-pool; NOT_FOUND when not)
    "owned-pool",  # the pool poolId, owned by tenantId (compute-pool; NOT_FOUND to anyone else)
    "owned-pools",  # as owned-pool with a poolId; without one every pool tenantId owns (items)
    "reservation",  # the reservation reservationId of tenantId, decided on its pool (compute-pool)
    "node",  # the node nodeId, decided on its pool, owner only (compute-pool)
    "own-node",  # a node credential, for its own nodeId only
    "own-credential",  # the calling credential itself, decided on its own tenant (compute-tenant)
    "attestor",  # no credential: the join attestor named in the body decides (nodes/join)
]
RESOURCE_OF_SCOPE: dict[Scope, str] = {
    "fleet": "compute-fleet",
    "tenant": "compute-tenant",
    "pool": "compute-pool",
    "owned-pool": "compute-pool",
    "owned-pools": "compute-pool",
    "reservation": "compute-pool",
    "node": "compute-pool",
    "own-node": "the calling node",
    "own-credential": "compute-tenant",
    "attestor": "the join attestor",
}


@dataclass(frozen=True)
class Access:
    """The IAM decision a method makes before its service runs: an action on the resource
    its body names. Every method in the table declares one, so none can skip it (R1).

    ``items``: a list, whose service decides every item again on its own pool with
    ``readable_pools`` (L1, R1); the flag publishes that in the catalogue.
    ``keyed``: an idempotent create; a retry whose key already made an object is decided
    as a read of that object, not as a second create (P4).
    """

    action: str
    on: Scope
    items: bool = False
    keyed: Literal["pool", "res"] | None = None

    @property
    def auth(self) -> Literal["credential", "node", "none"]:
        """The kind of credential the method takes."""
        if self.on == "own-node":
            return "node"
        return "none" if self.on == "attestor" else "credential"

    def describe(self) -> str:
        """The decision in the seed's notation: ``compute:pools:read @ compute-pool``."""
        if self.on == "attestor":
            return "no credential: the join attestor decides"
        if self.on == "own-node":
            return "node credential, its own node only"
        text = f"{self.action} @ {RESOURCE_OF_SCOPE[self.on]}"
        if self.on == "fleet":
            text += " (root only)"
        elif self.on == "owned-pool" or self.on == "node":
            text += " (owner only)"
        elif self.on == "owned-pools":
            text += " (owner only; without poolId: compute-tenant, every pool it owns + items)"
        elif self.on == "own-credential":
            text += " (the caller's own tenant; no tenantId)"
        if self.keyed is not None:
            text += " (a retry of its idempotencyKey: a read of what the key made)"
        return text + (" + items" if self.items else "")


def authorize(db: Database, caller: Caller, access: Access, body: Any) -> Found:
    """The method's decision, in the transaction or snapshot its service runs in; what it
    found on the way (the pool, the reservation, the node) is returned for the service.

    PERMISSION_DENIED when the credential may not act at that level at all; NOT_FOUND for
    anything inside a tenant the caller may not see (DESIGN §3).
    """
    action = access.action
    if access.on == "attestor":
        return None
    if access.on == "own-node":
        assert isinstance(caller, NodeHead)
        if caller.id != body.node_id:
            raise NotFound("node not found", field="nodeId")
        return caller
    assert isinstance(caller, Principal)
    principal = caller
    if access.on == "own-credential":
        require_on_tenant(principal, action)
        return None
    if access.on == "fleet":
        if not principal.is_root or not decide(principal, action, "compute-fleet"):
            raise PermissionDenied(f"{action} is for the root tenant's credentials", action=action)
        return None
    act_for(db, principal, body.tenant_id, action)
    if access.keyed is not None and body.idempotency_key is not UNSET:
        keyed_id = derived_id(
            access.keyed, body.tenant_id, principal.tenant_id, body.idempotency_key
        )
        if access.keyed == "pool":
            stored = pool_sql.pool_for_tenant(db, body.tenant_id, keyed_id)
            if stored is not None:
                # A retry may see the pool only as a read would: never reveal it otherwise.
                if not decide(principal, "compute:pools:read", "compute-pool", authz_attrs(stored)):
                    raise NotFound("pool not found", field="idempotencyKey")
                return stored
        else:
            reservation = res_sql.get(db, keyed_id)
            if reservation is not None:
                _reservation_pool(db, principal, reservation, "compute:reservations:read")
                return reservation
    if access.on == "tenant" or (access.on == "owned-pools" and body.pool_id is UNSET):
        require_on_tenant(principal, action)
        return None
    if access.on == "pool":
        return visible_pool(db, principal, body.tenant_id, body.pool_id, action)
    if access.on == "owned-pool" or access.on == "owned-pools":
        # R3: a version the caller last read is checked here, in the mutation's transaction.
        version = getattr(body, "version", UNSET)
        return owned_pool(db, principal, body.tenant_id, body.pool_id, action, version)
    if access.on == "reservation":
        reservation = res_sql.get(db, body.reservation_id)
        if reservation is None or reservation.tenant_id != body.tenant_id:
            raise NotFound("reservation not found", field="reservationId")
        _reservation_pool(db, principal, reservation, action)
        return reservation
    assert access.on == "node"
    node = node_sql.get_node(db, body.node_id)  # a removed one too: remove is idempotent
    if node is None:
        raise NotFound("node not found", field="nodeId")
    try:
        owned_pool(db, principal, body.tenant_id, node.pool_id, action)
    except NotFound:
        raise NotFound("node not found", field="nodeId") from None
    return node


def require_on_tenant(principal: Principal, action: str) -> None:
    """A tenant-level decision: on the tenant, or for root on the fleet (the seed's
    ``@ compute-fleet or @ compute-tenant``); a refusal is PERMISSION_DENIED."""
    if decide(principal, action, "compute-tenant"):
        return
    if principal.is_root and decide(principal, action, "compute-fleet"):
        return
    raise PermissionDenied(f"{action} is not allowed on this tenant", action=action)


def _reservation_pool(
    db: Database, principal: Principal, reservation: ReservationRow, action: str
) -> None:
    """A reservation is decided on its pool as the pool is now, also once the tenant's offer
    is gone (it may still read and end what it holds there); NOT_FOUND when refused."""
    found = pool_sql.attrs_for(db, reservation.tenant_id, [reservation.pool_id])
    if not decide(principal, action, "compute-pool", found[reservation.pool_id].attrs()):
        raise NotFound("reservation not found", field="reservationId")


def readable_pools(
    db: Database, principal: Principal, tenant_id: str, pool_ids: set[str], action: str
) -> set[str]:
    """The pools among ``pool_ids`` whose items a list may show: the credential may read the
    pool (L1) and take the list's action on it, so a list never reveals a pool that
    pools/get would answer NOT_FOUND (R1)."""
    if principal.is_admin:
        return pool_ids
    rows = {
        pool_id: authz.attrs()
        for pool_id, authz in pool_sql.attrs_for(db, tenant_id, pool_ids).items()
    }
    return {
        pool_id
        for pool_id in pool_ids
        if decide(principal, "compute:pools:read", "compute-pool", rows.get(pool_id))
        and decide(principal, action, "compute-pool", rows.get(pool_id))
    }
