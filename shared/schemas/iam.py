"""IAM: tenants, credentials and their statements."""

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from shared.ids import ID_BODY
from shared.schemas.common import Answer, Request, TenantId, TenantScoped
from shared.schemas.pools import GpuModel, PoolClass, Sharing
from shared.schemas.sites import Region
from shared.validation import whole

CredentialId = Annotated[str, Meta(max_length=57, pattern=whole(rf"^cred_{ID_BODY}{{26,52}}$"))]
DisplayName = Annotated[str, Meta(min_length=1, max_length=200)]
# An IAM action: service:group:verb, where any part may be "*".
ActionPattern = Annotated[
    str, Meta(max_length=128, pattern=whole(r"^(\*|[a-z]+(:(\*|[a-zA-Z]+)){0,2}(:\*)?)$"))
]
ResourceType = Literal["compute-fleet", "compute-tenant", "compute-pool", "*"]


class Conditions(Struct, forbid_unknown_fields=True, rename={"pool_class": "class"}):
    """Conditions on the pool's authz attributes; each lists the values that match."""

    gpuModel: list[GpuModel] | UnsetType = UNSET
    pool_class: list[PoolClass] | UnsetType = UNSET
    sharing: list[Sharing] | UnsetType = UNSET
    region: list[Region] | UnsetType = UNSET
    owned: list[bool] | UnsetType = UNSET


class Statement(Struct, forbid_unknown_fields=True):
    effect: Literal["allow", "deny"]
    actions: Annotated[list[ActionPattern], Meta(min_length=1, max_length=64)]
    resources: Annotated[list[ResourceType], Meta(min_length=1, max_length=8)]
    conditions: Conditions | UnsetType = UNSET


class TenantsCreate(TenantScoped):
    parent_tenant_id: TenantId | UnsetType = UNSET
    name: DisplayName | UnsetType = UNSET


class TenantsDelete(TenantScoped):
    pass


class CredentialsCreate(TenantScoped):
    name: DisplayName | UnsetType = UNSET
    statements: Annotated[list[Statement], Meta(max_length=64)] | UnsetType = UNSET


class CredentialsRevoke(TenantScoped):
    credential_id: CredentialId


class CredentialsWhoami(Request):
    """No fields: the answer is about the credential that calls."""


class TenantView(Answer):
    tenant_id: str
    parent_tenant_id: str | None
    name: str | None
    created_at: str


class TenantDeleted(Answer):
    tenant_id: str
    archived_pools: list[str]
    withdrawn_offers: list[str]
    revoked_credentials: int


class CredentialCreated(Answer):
    credential_id: str
    tenant_id: str
    token: str


class CredentialRevoked(Answer):
    credential_id: str
    revoked: bool


class CallerView(Answer):
    """Who the calling credential is (iam/credentials/whoami)."""

    tenant_id: str
    credential_id: str
    root: bool  # the root tenant's: it may act for any tenant (compute-fleet)
    admin: bool  # no statements: every action on its tenant and the pools it owns or is offered
