"""Commands for tenants, credentials and sites."""

from typing import Any

import click

from controlplane.cli.core import (
    JsonValue,
    call,
    cli,
    emit,
    fields,
    items,
    tenant_of,
    tenant_option,
)

# --- IAM -------------------------------------------------------------------------


@cli.group()
def tenants() -> None:
    """Create and delete tenants (root only)."""


@tenants.command("create")
@tenant_option
@click.option("--parent", help="parentTenantId")
@click.option("--name", help="display name")
def tenants_create(tenant: str | None, parent: str | None, name: str | None) -> None:
    """Create a tenant."""
    body = {"tenantId": tenant_of(tenant), "parentTenantId": parent, "name": name}
    emit(call("iam/tenants/create", body), fields(["tenantId", "parentTenantId", "name"]))


@tenants.command("delete")
@tenant_option
def tenants_delete(tenant: str | None) -> None:
    """Delete a tenant: archive its pools, withdraw its offers, revoke its credentials."""
    answer = call("iam/tenants/delete", {"tenantId": tenant_of(tenant)})
    keys = ["tenantId", "archivedPools", "withdrawnOffers", "revokedCredentials"]
    emit(answer, fields(keys))


@cli.group()
def credentials() -> None:
    """Create and revoke API credentials."""


@credentials.command("create")
@tenant_option
@click.option("--name", help="display name")
@click.option("--statements", type=JsonValue(list), help="IAM statements: JSON or @file.json")
def credentials_create(tenant: str | None, name: str | None, statements: Any) -> None:
    """Create a credential; its token is shown once."""
    body = {"tenantId": tenant_of(tenant), "name": name, "statements": statements}
    emit(call("iam/credentials/create", body), fields(["credentialId", "tenantId", "token"]))


@credentials.command("revoke")
@tenant_option
@click.argument("credential_id")
def credentials_revoke(tenant: str | None, credential_id: str) -> None:
    """Revoke a credential."""
    body = {"tenantId": tenant_of(tenant), "credentialId": credential_id}
    emit(call("iam/credentials/revoke", body), fields(["credentialId", "revoked"]))


# --- sites -----------------------------------------------------------------------

SITE_ROW = (
    ["ID", "NAME", "REGION", "KIND", "OWNER"],
    ["id", "name", "region", "kind", "ownerTenantId"],
)


@cli.group()
def sites() -> None:
    """Sites: where pools' machines are."""


@sites.command("create")
@tenant_option
@click.option("--name", required=True)
@click.option("--region", required=True)
@click.option("--kind", type=click.Choice(["shared", "dedicated", "custom"]), default="custom")
def sites_create(tenant: str | None, name: str, region: str, kind: str) -> None:
    """Create a site."""
    body = {"tenantId": tenant_of(tenant), "name": name, "region": region, "kind": kind}
    emit(call("compute/sites/create", body), fields(SITE_ROW[1]))


@sites.command("list")
@tenant_option
def sites_list(tenant: str | None) -> None:
    """List the sites a tenant sees."""
    answer = call("compute/sites/list", {"tenantId": tenant_of(tenant)})
    emit(answer, items(SITE_ROW[0], lambda s: [s[k] for k in SITE_ROW[1]]))
