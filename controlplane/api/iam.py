"""IAM methods: tenants and credentials."""

from controlplane.api.method import Method, write
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
        write(iam.delete_tenant),
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
        write(iam.revoke_credential),
        "Revoke a credential.",
    ),
)
