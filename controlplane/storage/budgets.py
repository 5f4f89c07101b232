"""SQL for GPU-hour budgets: a tenant's limit on a meter, what ended bookings spent, and the
live GPU bookings still spending."""

from controlplane.storage.ledger_types import BudgetRow, MeteredBooking
from controlplane.storage.rows import one
from controlplane.storage.sql import Database


def budget(db: Database, tenant_id: str, meter: str) -> BudgetRow | None:
    found = one(db, "SELECT * FROM budgets WHERE tenant_id = ? AND meter = ?", [tenant_id, meter])
    return None if found is None else BudgetRow.from_row(found)


def put_budget(db: Database, tenant_id: str, meter: str, limit: float | None, at: str) -> None:
    db.execute(
        "INSERT INTO budgets (tenant_id, meter, limit_hours, spent_hours, updated_at) VALUES (?, ?, ?, 0, ?) "
        "ON CONFLICT (tenant_id, meter) DO UPDATE SET limit_hours = excluded.limit_hours, "
        "updated_at = excluded.updated_at",
        [tenant_id, meter, limit, at],
    )


def add_spent(db: Database, tenant_id: str, meter: str, hours: float, at: str) -> None:
    db.execute(
        "INSERT INTO budgets (tenant_id, meter, limit_hours, spent_hours, updated_at) VALUES (?, ?, NULL, ?, ?) "
        "ON CONFLICT (tenant_id, meter) DO UPDATE SET "
        "spent_hours = budgets.spent_hours + excluded.spent_hours, "
        "updated_at = excluded.updated_at",
        [tenant_id, meter, hours, at],
    )


def placed_gpu_hours(db: Database, tenant_id: str) -> list[MeteredBooking]:
    """The GPU bookings of the tenant's placed and active reservations."""
    found = db.execute(
        "SELECT r.pool_id, r.placed_at, r.mig_profile, b.resource, b.amount FROM reservations r "
        "JOIN bookings b ON b.reservation_id = r.id "
        "WHERE r.tenant_id = ? AND r.state IN ('placed', 'active') AND b.resource LIKE 'gpu%'",
        [tenant_id],
    )
    return [MeteredBooking.of(row) for row in found]
