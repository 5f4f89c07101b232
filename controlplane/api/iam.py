"""IAM methods: tenants and credentials."""

from controlplane.api.method import Method, Write, read, write
from controlplane.services import iam
from controlplane.services.access import Access
from shared import schemas as s

METHODS = (
    Method(
        "/api/iam/tenants/create",
        s.TenantsCreate,
        s.TenantView,
        write(iam.create_tenant),
        "Create a tenant (root only).",
        Access("iam:tenants:create", "fleet"),
    ),
    Method(
        "/api/iam/tenants/delete",
        s.TenantsDelete,
        s.TenantDeleted,
        Write(
            lambda store, rt, principal, body: iam.delete_tenant(
                store, principal, body, rt.credentials
            )
        ),
        "Delete a tenant: archive its pools, withdraw offers to it, revoke its credentials (T1).",
        Access("iam:tenants:delete", "fleet"),
    ),
    Method(
        "/api/iam/credentials/create",
        s.CredentialsCreate,
        s.CredentialCreated,
        write(iam.create_credential),
        "Create a credential; its token is shown once and stored only as a hash.",
        Access("iam:credentials:create", "tenant"),
    ),
    Method(
        "/api/iam/credentials/revoke",
        s.CredentialsRevoke,
        s.CredentialRevoked,
        Write(
            lambda store, rt, principal, body: iam.revoke_credential(
                store, principal, body, rt.credentials
            )
        ),
        "Revoke a credential.",
        Access("iam:credentials:revoke", "tenant"),
    ),
    Method(
        "/api/iam/credentials/whoami",
        s.CredentialsWhoami,
        s.CallerView,
        read(iam.whoami),
        "Who the calling credential is: its tenant and id, whether root's, whether admin.",
        Access("iam:credentials:read", "own-credential"),
    ),
)
