"""IAM methods: tenants and credentials."""

from controlplane.api.method import Method
from controlplane.services import iam
from shared import schemas as s

METHODS = (
    Method(
        "/api/iam/tenants/create",
        s.TenantsCreate,
        s.TenantView,
        iam.create_tenant,
        "Create a tenant (root only).",
    ),
    Method(
        "/api/iam/tenants/delete",
        s.TenantsDelete,
        s.TenantDeleted,
        iam.delete_tenant,
        "Delete a tenant: archive its pools, withdraw offers to it, revoke its credentials (T1).",
    ),
    Method(
        "/api/iam/credentials/create",
        s.CredentialsCreate,
        s.CredentialCreated,
        iam.create_credential,
        "Create a credential; its token is shown once and stored only as a hash.",
    ),
    Method(
        "/api/iam/credentials/revoke",
        s.CredentialsRevoke,
        s.CredentialRevoked,
        iam.revoke_credential,
        "Revoke a credential.",
    ),
)
