"""Commands for tenants, credentials (and whoami) and sites."""

from typing import Any

import click

from controlplane.cli.calls import call, every
from controlplane.cli.group import cli
from controlplane.cli.ids import CREDENTIAL, whole
from controlplane.cli.output import emit, fields, items, shown, table, yes
from controlplane.cli.params import (
    JsonValue,
    page_size_option,
    tenant_of,
    tenant_option,
    watch_option,
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
    tenant_id = tenant_of(tenant)
    body = {"tenantId": tenant_id, "credentialId": whole(CREDENTIAL, credential_id, tenant_id)}
    emit(call("iam/credentials/revoke", body), fields(["credentialId", "revoked"]))


def show_caller(answer: Any) -> None:
    table(
        None,
        [
            ["tenant:", answer["tenantId"]],
            ["credential:", answer["credentialId"]],
            ["root:", yes(answer["root"])],
            ["admin:", yes(answer["admin"])],
        ],
    )


@cli.command("whoami")
def whoami() -> None:
    """Who the token is: its tenant, its credential, whether it is root's (acts for every
    tenant) and whether it is its tenant's admin (no statements)."""
    emit(call("iam/credentials/whoami", {}), show_caller)


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
@page_size_option
@watch_option
def sites_list(tenant: str | None, page_size: int | None, watch: bool) -> None:
    """List the sites a tenant sees."""
    body = {"tenantId": tenant_of(tenant)}
    render = items(SITE_ROW[0], lambda s: [s[k] for k in SITE_ROW[1]])
    shown(lambda: every("compute/sites/list", body, page_size), render, watch, body["tenantId"])
