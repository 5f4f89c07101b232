"""Capacity (H6): the ledger of a pool's resources."""

from msgspec import UNSET, UnsetType

from shared.schemas.common import Answer, PoolScoped


class PoolsCapacity(PoolScoped):
    pass


class CapacityByPool(PoolScoped):
    pass


class CapacityRow(Answer):
    """H6, the capacity ledger: total over every node; schedulable over ready, schedulable
    nodes and healthy GPUs; allocated as booked; available = schedulable not booked;
    offered = quota maxima of tenants other than the owner (shown to the owner only);
    releasing = what ended reservations hold until their host confirms the release (D7)."""

    pool_id: str
    resource: str
    total: int
    schedulable: int
    allocated: int
    available: int
    releasing: int  # D7: within allocated: ended bookings the host has not yet released
    offered: int | UnsetType = UNSET
    # C5, the owner's only: schedulable ÷ offered; null when nothing is offered, 0 when
    # nothing is schedulable; under 1 the resource is oversold.
    coverage: float | UnsetType | None = UNSET


class CapacityList(Answer):
    items: list[CapacityRow]
