"""Typed rows of the ledger tables services read: offers, quotas, bookings, budgets, sites,
tenants, credentials and events. Each is read once into a frozen struct, by its column names
(``from_row``, for ``SELECT *``) or by position where the statement names its columns.

An event's ``data`` is kept as its stored JSON text and decoded on first read, so a damaged
value fails only the answer that shows it (R5).
"""

from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any, Self

import msgspec
from msgspec import Struct


class OfferRow(Struct, frozen=True, kw_only=True):
    """A row of ``pool_offers``."""

    pool_id: str
    to_tenant_id: str
    include_descendants: bool
    priority: int
    created_at: str
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return cls(
            pool_id=row["pool_id"],
            to_tenant_id=row["to_tenant_id"],
            include_descendants=bool(row["include_descendants"]),
            priority=row["priority"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )


class QuotaRow(Struct, frozen=True, kw_only=True):
    """A row of ``quotas``: the tenant's maximum of a resource on a pool, and what it uses."""

    pool_id: str
    tenant_id: str
    resource: str
    max: int
    used: int
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return cls(
            pool_id=row["pool_id"],
            tenant_id=row["tenant_id"],
            resource=row["resource"],
            max=row["max"],
            used=row["used"],
            updated_at=row["updated_at"],
        )


class BookingRow(Struct, frozen=True, kw_only=True):
    """A row of ``bookings``: what a reservation holds of one resource on its node."""

    reservation_id: str
    node_id: str
    resource: str
    amount: int

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return cls(
            reservation_id=row["reservation_id"],
            node_id=row["node_id"],
            resource=row["resource"],
            amount=row["amount"],
        )


class MeteredBooking(Struct, frozen=True, kw_only=True):
    """A live reservation's GPU booking with what its GPU hours are counted from."""

    pool_id: str
    placed_at: str
    mig_profile: str | None
    resource: str
    amount: int

    @classmethod
    def of(cls, row: Sequence[Any]) -> Self:
        """By position: pool_id, placed_at, mig_profile, resource, amount."""
        pool_id, placed_at, mig_profile, resource, amount = row
        return cls(
            pool_id=pool_id,
            placed_at=placed_at,
            mig_profile=mig_profile,
            resource=resource,
            amount=amount,
        )


class BudgetRow(Struct, frozen=True, kw_only=True):
    """A row of ``budgets``: a tenant's GPU-hour limit on a meter and what ended bookings spent."""

    tenant_id: str
    meter: str
    limit_hours: float | None
    spent_hours: float
    updated_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return cls(
            tenant_id=row["tenant_id"],
            meter=row["meter"],
            limit_hours=row["limit_hours"],
            spent_hours=row["spent_hours"],
            updated_at=row["updated_at"],
        )


class SiteRow(Struct, frozen=True, kw_only=True):
    """A row of ``sites``."""

    id: str
    owner_tenant_id: str
    name: str
    region: str
    kind: str
    created_at: str

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return cls(
            id=row["id"],
            owner_tenant_id=row["owner_tenant_id"],
            name=row["name"],
            region=row["region"],
            kind=row["kind"],
            created_at=row["created_at"],
        )


class TenantRow(Struct, frozen=True, kw_only=True):
    """A row of ``tenants``."""

    id: str
    parent_id: str | None
    name: str | None
    created_at: str
    deleted_at: str | None

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Self:
        return cls(
            id=row["id"],
            parent_id=row["parent_id"],
            name=row["name"],
            created_at=row["created_at"],
            deleted_at=row["deleted_at"],
        )


class CredentialRow(Struct, frozen=True, kw_only=True):
    """What authentication reads of a live credential: its id, tenant and statements JSON."""

    id: str
    tenant_id: str
    statements: str | None  # None: the tenant's admin

    @classmethod
    def of(cls, row: Sequence[Any]) -> Self:
        """By position: id, tenant_id, statements."""
        credential_id, tenant_id, statements = row
        return cls(id=credential_id, tenant_id=tenant_id, statements=statements)


class EventRow(Struct, frozen=True, kw_only=True, dict=True):
    """A row of ``events``; ``data`` is decoded on first read and cached."""

    seq: int
    id: str
    type: str
    at: str
    pool_id: str | None
    data_json: str  # the ``data`` column as stored

    @classmethod
    def of(cls, row: Sequence[Any]) -> Self:
        """By position: seq, id, type, at, pool_id, data."""
        seq, event_id, event_type, at, pool_id, data = row
        return cls(seq=seq, id=event_id, type=event_type, at=at, pool_id=pool_id, data_json=data)

    @cached_property
    def data(self) -> dict[str, Any]:
        return msgspec.json.decode(self.data_json, type=dict[str, Any])
