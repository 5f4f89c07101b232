"""Budgets: a tenant's spending limit per meter."""

from typing import Annotated

from msgspec import Meta

from shared.schemas.common import Answer, TenantScoped
from shared.validation import whole

Meter = Annotated[str, Meta(max_length=64, pattern=whole(r"^gpu\.[a-z0-9-]{1,32}\.hours$"))]


class BudgetsSet(TenantScoped):
    meter: Meter
    limit: Annotated[float, Meta(ge=0, le=1e12)] | None


class BudgetsGet(TenantScoped):
    meter: Meter


class BudgetView(Answer):
    tenant_id: str
    meter: str
    limit: float | None
    spent: float
