"""Typed rows of the ledger tables services read: offers, quotas, bookings, budgets, sites,
tenants, credentials and events. Each is read once into a frozen struct, by its column names
(``Row.from_row``, for ``SELECT *``) or in field order (``Row.of``) where the statement
names its columns.

An event's ``data`` is kept as its stored JSON text and decoded on first read, so a damaged
value fails only the answer that shows it (R5).
"""

from collections.abc import Mapping
from functools import cached_property
from typing import Any, Self

import msgspec

from controlplane.storage.rows import Row


class OfferRow(Row, frozen=True, kw_only=True):
    """A row of ``pool_offers``."""

    pool_id: str
    to_tenant_id: str
    include_descendants: bool
    priority: int
    created_at: str
    updated_at: str
    not_after: str | None  # C3: when the offer ends; None: until unoffered

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return super().from_row({**row, "include_descendants": bool(row["include_descendants"])})


class QuotaRow(Row, frozen=True, kw_only=True):
    """A row of ``quotas``: the tenant's maximum of a resource on a pool, and what it uses."""

    pool_id: str
    tenant_id: str
    resource: str
    max: int
    used: int
    updated_at: str


class BookingRow(Row, frozen=True, kw_only=True):
    """A row of ``bookings``: what a reservation holds of one resource on its node."""

    reservation_id: str
    node_id: str
    resource: str
    amount: int


class MeteredBooking(Row, frozen=True, kw_only=True):
    """A live reservation's GPU booking with what its GPU hours are counted from."""

    pool_id: str
    placed_at: str
    mig_profile: str | None
    resource: str
    amount: int


class BudgetRow(Row, frozen=True, kw_only=True):
    """A row of ``budgets``: a tenant's GPU-hour limit on a meter and what ended bookings spent."""

    tenant_id: str
    meter: str
    limit_hours: float | None
    spent_hours: float
    updated_at: str


class SiteRow(Row, frozen=True, kw_only=True):
    """A row of ``sites``."""

    id: str
    owner_tenant_id: str
    name: str
    region: str
    kind: str
    created_at: str


class TenantRow(Row, frozen=True, kw_only=True):
    """A row of ``tenants``."""

    id: str
    parent_id: str | None
    name: str | None
    created_at: str
    deleted_at: str | None


class CredentialRow(Row, frozen=True, kw_only=True):
    """What authentication reads of a live credential: its id, tenant and statements JSON."""

    id: str
    tenant_id: str
    statements: str | None  # None: the tenant's admin


class EventRow(Row, frozen=True, kw_only=True, dict=True):
    """A row of ``events``; ``data`` is decoded on first read and cached."""

    seq: int
    id: str
    type: str
    at: str
    pool_id: str | None
    data_json: str  # the ``data`` column as stored

    @cached_property
    def data(self) -> dict[str, Any]:
        return msgspec.json.decode(self.data_json, type=dict[str, Any])


class LedgerRow(Row, frozen=True, kw_only=True):
    """One resource of a pool's capacity ledger (H6): over every node, over ready and
    schedulable ones, booked, and schedulable not booked (0 where nothing stands behind it)."""

    resource: str
    total: int = 0
    schedulable: int = 0
    allocated: int = 0
    available: int = 0
    releasing: int = 0  # D7: within allocated, until the host confirms the release
