"""IAM methods: tenants and credentials."""

from controlplane.api.method import Method, Write, write
from controlplane.services import iam
from shared import schemas as s

METHODS = (
    Method(
        "/api/iam/tenants/create",
        s.TenantsCreate,
        s.TenantView,
        write(iam.create_tenant),
        "Create a tenant (root only).",
    ),
    Method(
        "/api/iam/tenants/delete",
        s.TenantsDelete,
        s.TenantDeleted,
        Write(
            lambda rt, principal, body: iam.delete_tenant(rt.db, principal, body, rt.credentials)
        ),
        "Delete a tenant: archive its pools, withdraw offers to it, revoke its credentials (T1).",
    ),
    Method(
        "/api/iam/credentials/create",
        s.CredentialsCreate,
        s.CredentialCreated,
        write(iam.create_credential),
        "Create a credential; its token is shown once and stored only as a hash.",
    ),
    Method(
        "/api/iam/credentials/revoke",
        s.CredentialsRevoke,
        s.CredentialRevoked,
        Write(
            lambda rt, principal, body: iam.revoke_credential(
                rt.db, principal, body, rt.credentials
            )
        ),
        "Revoke a credential.",
    ),
)
