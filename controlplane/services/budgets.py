"""GPU-hour budgets: what a tenant has spent on a meter, and the budget methods."""

import time

from controlplane.capacity.meters import gpu_equivalents, meter_of
from controlplane.services.access import act_for
from controlplane.services.call import Call
from controlplane.storage import budgets as budget_sql
from controlplane.storage import pools as pool_sql
from controlplane.storage.db import Store, epoch, now
from controlplane.storage.sql import Database
from shared.schemas import (
    BudgetsGet,
    BudgetsSet,
    BudgetView,
)


def spent_hours(db: Database, tenant_id: str, meter: str, at: float) -> float:
    """Hours spent on a meter: ended bookings (stored) plus live ones so far."""
    stored = budget_sql.budget(db, tenant_id, meter)
    spent = stored.spent_hours if stored else 0.0
    for booking in budget_sql.placed_gpu_hours(db, tenant_id):
        pool = pool_sql.get_pool(db, booking.pool_id)
        if pool is None or meter_of(pool.gpu_model) != meter:
            continue
        share = gpu_equivalents(
            booking.resource, booking.amount, booking.mig_profile, pool.replicas
        )
        spent += share * max(0.0, at - epoch(booking.placed_at)) / 3600
    return spent


async def set_budget(store: Store, call: Call[BudgetsSet]) -> BudgetView:
    principal, req = call.principal, call.body

    def txn(db: Database) -> BudgetView:
        act_for(db, principal, req.tenant_id, "compute:budgets:set")
        budget_sql.put_budget(db, req.tenant_id, req.meter, req.limit, now())
        spent = spent_hours(db, req.tenant_id, req.meter, time.time())
        return BudgetView(
            tenant_id=req.tenant_id, meter=req.meter, limit=req.limit, spent=round(spent, 6)
        )

    return await store.write(txn)


def get_budget(db: Database, call: Call[BudgetsGet]) -> BudgetView:
    req = call.body
    stored = budget_sql.budget(db, req.tenant_id, req.meter)
    spent = spent_hours(db, req.tenant_id, req.meter, time.time())
    limit = stored.limit_hours if stored else None
    return BudgetView(tenant_id=req.tenant_id, meter=req.meter, limit=limit, spent=round(spent, 6))
