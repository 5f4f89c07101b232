"""Request and answer bases, the error body, and the identifiers every noun shares."""

from typing import Annotated, Any

from msgspec import Meta, Struct

from shared.ids import ID_BODY
from shared.validation import whole

TenantId = Annotated[str, Meta(max_length=128, pattern=whole(r"^[A-Za-z0-9._:-]{1,128}$"))]
PoolId = Annotated[str, Meta(max_length=57, pattern=whole(rf"^pool_{ID_BODY}{{26,52}}$"))]
IdempotencyKey = Annotated[
    str, Meta(max_length=128, pattern=whole(r"^[A-Za-z0-9._~:/+=-]{1,128}$"))
]


class Request(Struct, forbid_unknown_fields=True, rename="camel", kw_only=True):
    """Every request body: a JSON object with unknown fields refused."""


class TenantScoped(Request):
    tenant_id: TenantId


class PoolScoped(TenantScoped):
    pool_id: PoolId


# R3: a pool mutation may name the pool's version as last read; a stale one is CONFLICT.
PoolVersion = Annotated[
    int,
    Meta(ge=1, le=2**63 - 1, description="The pool's version as last read (R3); stale: CONFLICT."),
]


class Answer(Struct, rename="camel", kw_only=True, omit_defaults=True):
    """Every answer body; UNSET fields are left out."""


class ErrorDetail(Struct):
    code: str
    message: str
    details: dict[str, Any]
    requestId: str


class ErrorBody(Struct):
    error: ErrorDetail
