"""Access checks every service shares: acting for a tenant, and seeing or managing a pool."""

from typing import Any

import sqlite_utils

from controlplane.iam.decide import Principal, decide
from controlplane.storage import iam as iam_sql
from controlplane.storage import pools as pool_sql
from shared.errors import NotFound, PermissionDenied


def act_for(db: sqlite_utils.Database, principal: Principal, tenant_id: str, action: str) -> None:
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


def require(principal: Principal, action: str, resource: str, **attrs: Any) -> None:
    """A tenant-level decision; a refusal is PERMISSION_DENIED since nothing is hidden."""
    if not decide(principal, action, resource, attrs or None):
        raise PermissionDenied(f"{action} is not allowed on {resource}", action=action)


def authz_attrs(pool: dict[str, Any]) -> dict[str, Any]:
    """The attributes statements' conditions match, from the pool's authz row for the tenant."""
    return {
        "gpuModel": pool["authz_gpu_model"],
        "class": pool["authz_class"],
        "sharing": pool["authz_sharing"],
        "region": pool["authz_region"],
        "owned": bool(pool["authz_owned"]),
    }


def pool_not_found() -> NotFound:
    return NotFound("pool not found", field="poolId")


def visible_pool(
    db: sqlite_utils.Database, principal: Principal, tenant_id: str, pool_id: str, action: str
) -> dict[str, Any]:
    """The pool as ``tenant_id`` may read it, or NOT_FOUND (L2): never reveal existence."""
    pool = pool_sql.pool_for_tenant(db, tenant_id, pool_id)
    if pool is None or not decide(principal, action, "compute-pool", authz_attrs(pool)):
        raise pool_not_found()
    return pool


def owned_pool(
    db: sqlite_utils.Database, principal: Principal, tenant_id: str, pool_id: str, action: str
) -> dict[str, Any]:
    """A pool ``tenant_id`` owns, for an owner-only action: anyone else gets NOT_FOUND (O1, U1, A1).

    An owner whose credential may see the pool but not take the action gets
    PERMISSION_DENIED: the pool's existence is no secret to it.
    """
    pool = pool_sql.pool_for_tenant(db, tenant_id, pool_id)
    if pool is None or not pool["authz_owned"]:
        raise pool_not_found()
    attrs = authz_attrs(pool)
    if not decide(principal, action, "compute-pool", attrs):
        if decide(principal, "compute:pools:read", "compute-pool", attrs):
            raise PermissionDenied(f"{action} is not allowed on this pool", action=action)
        raise pool_not_found()
    return pool
