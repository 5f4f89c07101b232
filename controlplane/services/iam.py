"""IAM: bootstrap, authentication, tenants (with the T1 teardown) and credentials."""

from pathlib import Path

import msgspec
from msgspec import UNSET

from controlplane.iam.cache import CredentialCache
from controlplane.iam.decide import ROOT_TENANT, Principal
from controlplane.iam.tokens import new_token, token_hash
from controlplane.services.call import Call
from controlplane.services.offers import withdraw_offer
from controlplane.services.pools import archive_in_txn
from controlplane.services.reservations import end_all_of_tenant
from controlplane.storage import events
from controlplane.storage import iam as iam_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage.db import Store, now
from controlplane.storage.sql import Database
from shared.errors import Conflict, InvalidInput, InvalidState, NotFound, PermissionDenied
from shared.files import write_secret
from shared.ids import new_id
from shared.schemas import (
    CallerView,
    CredentialCreated,
    CredentialRevoked,
    CredentialsCreate,
    CredentialsRevoke,
    CredentialsWhoami,
    TenantDeleted,
    TenantsCreate,
    TenantsDelete,
    TenantView,
)


def bootstrap(store: Store, token_file: Path) -> bool:
    """On an empty database create tenant root and its admin credential; True if it did.

    The token file is written before the commit: if the commit fails, the next
    start finds the database still empty and writes a new token.
    """

    def txn(db: Database) -> bool:
        if db.execute("SELECT 1 FROM tenants LIMIT 1").fetchone() is not None:
            return False
        token = new_token()
        at = now()
        iam_sql.insert_tenant(db, ROOT_TENANT, None, "root", at)
        credential_id = new_id("cred")
        iam_sql.insert_credential(
            db, credential_id, ROOT_TENANT, "bootstrap", token_hash(token), None, at
        )
        events.append(
            db,
            "tenant.created",
            pool_id=None,
            data={"tenantId": ROOT_TENANT, "credentialId": credential_id},
            audience=[ROOT_TENANT],
        )
        write_secret(token_file, token)
        return True

    return store.transact(txn)


def authenticate(db: Database, token: str, cache: CredentialCache) -> Principal | None:
    """The principal of a live credential of a live tenant, or None."""
    hashed = token_hash(token)
    principal = cache.get(hashed)
    if principal is not None:
        return principal
    epoch = cache.epoch  # before the read: a revocation clearing the cache after it wins
    found = iam_sql.credential_by_hash(db, hashed)
    if found is None:
        return None
    principal = Principal(
        credential_id=found.id,
        tenant_id=found.tenant_id,
        statements=None if found.statements is None else msgspec.json.decode(found.statements),
    )
    cache.put(hashed, principal, epoch)
    return principal


def still_live(db: Database, token: str) -> bool:
    """Whether the credential is live in this transaction, past any cache: a mutation never
    commits after its credential's revocation was acknowledged (B5)."""
    return iam_sql.credential_by_hash(db, token_hash(token)) is not None


async def create_tenant(store: Store, call: Call[TenantsCreate]) -> TenantView:
    req = call.body
    parent = None if req.parent_tenant_id is UNSET else req.parent_tenant_id
    name = None if req.name is UNSET else req.name

    def txn(db: Database) -> TenantView:
        if iam_sql.tenant_id_taken(db, req.tenant_id):
            raise Conflict("that tenant id is taken", field="tenantId")
        if parent is not None and iam_sql.get_tenant(db, parent) is None:
            raise NotFound("parent tenant not found", field="parentTenantId")
        at = now()
        iam_sql.insert_tenant(db, req.tenant_id, parent, name, at)
        events.append(
            db,
            "tenant.created",
            pool_id=None,
            data={"tenantId": req.tenant_id, "parentTenantId": parent},
            audience=[ROOT_TENANT, req.tenant_id],
        )
        return TenantView(
            tenant_id=req.tenant_id, parent_tenant_id=parent, name=name, created_at=at
        )

    return await store.write(txn)


async def delete_tenant(store: Store, call: Call[TenantsDelete]) -> TenantDeleted:
    """T1: archive its pools, withdraw offers made to it, revoke its credentials."""
    req = call.body
    cache = call.env.credentials
    if req.tenant_id == ROOT_TENANT:
        raise InvalidInput("the root tenant cannot be deleted", field="tenantId")

    def txn(db: Database) -> TenantDeleted:
        if iam_sql.get_tenant(db, req.tenant_id) is None:
            raise NotFound("tenant not found", field="tenantId")
        children = iam_sql.live_children(db, req.tenant_id)
        if children:
            raise InvalidState(
                "delete the tenant's child tenants first", field="tenantId", children=children
            )
        archived = []
        for pool in pool_sql.pools_owned_by(db, req.tenant_id):
            if pool.archived_at is None:
                archive_in_txn(db, pool, reason="tenant deleted")
                archived.append(pool.id)
        withdrawn = []
        for offer in pool_sql.offers_to(db, req.tenant_id):
            offered = pool_sql.get_pool(db, offer.pool_id)
            assert offered is not None
            withdraw_offer(db, offered, req.tenant_id)
            withdrawn.append(offer.pool_id)
        end_all_of_tenant(db, req.tenant_id)
        at = now()
        revoked = iam_sql.revoke_all(db, req.tenant_id, at)
        iam_sql.mark_tenant_deleted(db, req.tenant_id, at)
        events.append(
            db,
            "tenant.deleted",
            pool_id=None,
            data={
                "tenantId": req.tenant_id,
                "archivedPools": archived,
                "withdrawnOffers": withdrawn,
            },
            audience=[ROOT_TENANT],
        )
        return TenantDeleted(
            tenant_id=req.tenant_id,
            archived_pools=archived,
            withdrawn_offers=withdrawn,
            revoked_credentials=revoked,
        )

    deleted = await store.write(txn)
    cache.clear()  # its credentials stop working before this answers
    return deleted


def _require_admin(principal: Principal) -> None:
    """Only an admin credential manages credentials, so a limited one cannot mint a wider one."""
    if not principal.is_admin:
        raise PermissionDenied("only an admin credential (no statements) manages credentials")


async def create_credential(store: Store, call: Call[CredentialsCreate]) -> CredentialCreated:
    principal, req = call.principal, call.body
    _require_admin(principal)
    statements = None if req.statements is UNSET else msgspec.json.encode(req.statements).decode()
    token = new_token()

    def txn(db: Database) -> CredentialCreated:
        credential_id = new_id("cred")
        name = None if req.name is UNSET else req.name
        iam_sql.insert_credential(
            db, credential_id, req.tenant_id, name, token_hash(token), statements, now()
        )
        events.append(
            db,
            "credential.created",
            pool_id=None,
            data={"credentialId": credential_id, "name": name, "admin": statements is None},
            audience=[req.tenant_id],
        )
        return CredentialCreated(credential_id=credential_id, tenant_id=req.tenant_id, token=token)

    return await store.write(txn)


def whoami(db: Database, call: Call[CredentialsWhoami]) -> CallerView:
    """Who the calling credential is: its tenant and id, root's or not, admin or not (M4)."""
    principal = call.principal
    return CallerView(
        tenant_id=principal.tenant_id,
        credential_id=principal.credential_id,
        root=principal.is_root,
        admin=principal.is_admin,
    )


async def revoke_credential(store: Store, call: Call[CredentialsRevoke]) -> CredentialRevoked:
    principal, req = call.principal, call.body
    cache = call.env.credentials
    _require_admin(principal)

    def txn(db: Database) -> CredentialRevoked:
        if not iam_sql.credential_exists(db, req.tenant_id, req.credential_id):
            raise NotFound("credential not found", field="credentialId")
        revoked = iam_sql.revoke_credential(db, req.tenant_id, req.credential_id, now()) > 0
        if revoked:
            events.append(
                db,
                "credential.revoked",
                pool_id=None,
                data={"credentialId": req.credential_id},
                audience=[req.tenant_id],
            )
        return CredentialRevoked(credential_id=req.credential_id, revoked=revoked)

    answer = await store.write(txn)
    cache.clear()  # the token stops working before this answers
    return answer
