"""Reservation and budget methods."""

from controlplane.api.method import Method, Read, Write
from controlplane.services import budgets, reservations
from controlplane.services.access import Access
from shared import schemas as s

METHODS = (
    Method(
        "/api/compute/reservations/create",
        s.ReservationsCreate,
        s.ReservationView,
        Write(reservations.create_reservation),
        "Ask a pool for atoms and rows: admitted against quota (and budget), placed when it fits.",
        Access("compute:reservations:create", "pool", keyed="res"),
    ),
    Method(
        "/api/compute/reservations/get",
        s.ReservationsGet,
        s.ReservationView,
        Read(reservations.get_reservation),
        "One of the tenant's reservations.",
        Access("compute:reservations:read", "reservation"),
    ),
    Method(
        "/api/compute/reservations/list",
        s.ReservationsList,
        s.ReservationList,
        Read(
            reservations.list_reservations, offload=True, cached=True, scopes=("catalog", "fleet")
        ),
        "The tenant's reservations, of a pool and in some states, by id, a page at a time (B1: "
        "limit, default 100, and cursor; next is null at the end).",
        Access("compute:reservations:read", "tenant", items=True),
    ),
    Method(
        "/api/compute/reservations/end",
        s.ReservationsEnd,
        s.ReservationView,
        Write(reservations.end_reservation),
        "End a reservation: its bookings and quota go back.",
        Access("compute:reservations:manage", "reservation"),
    ),
    Method(
        "/api/compute/budgets/set",
        s.BudgetsSet,
        s.BudgetView,
        Write(budgets.set_budget),
        "Set a tenant's GPU-hour budget on a meter such as gpu.h100.hours (root only).",
        Access("compute:budgets:set", "fleet"),
    ),
    Method(
        "/api/compute/budgets/get",
        s.BudgetsGet,
        s.BudgetView,
        Read(budgets.get_budget),
        "A tenant's budget and what it has spent.",
        Access("compute:budgets:read", "tenant"),
    ),
)
