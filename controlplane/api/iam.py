"""IAM methods: tenants and credentials."""

from controlplane.api.method import Method, Read, Write
from controlplane.services import iam
from controlplane.services.access import Access
from shared import schemas as s

METHODS = (
    Method(
        "/api/iam/tenants/create",
        s.TenantsCreate,
        s.TenantView,
        Write(iam.create_tenant),
        "Create a tenant (root only).",
        Access("iam:tenants:create", "fleet"),
    ),
    Method(
        "/api/iam/tenants/delete",
        s.TenantsDelete,
        s.TenantDeleted,
        Write(iam.delete_tenant),
        "Delete a tenant: archive its pools, withdraw offers to it, revoke its credentials (T1).",
        Access("iam:tenants:delete", "fleet"),
    ),
    Method(
        "/api/iam/credentials/create",
        s.CredentialsCreate,
        s.CredentialCreated,
        Write(iam.create_credential),
        "Create a credential; its token is shown once and stored only as a hash.",
        Access("iam:credentials:create", "tenant"),
    ),
    Method(
        "/api/iam/credentials/revoke",
        s.CredentialsRevoke,
        s.CredentialRevoked,
        Write(iam.revoke_credential),
        "Revoke a credential.",
        Access("iam:credentials:revoke", "tenant"),
    ),
    Method(
        "/api/iam/credentials/whoami",
        s.CredentialsWhoami,
        s.CallerView,
        Read(iam.whoami),
        "Who the calling credential is: its tenant and id, whether root's, whether admin.",
        Access("iam:credentials:read", "own-credential"),
    ),
)
