"""Reservations: what a tenant books on a pool and the answer about it."""

from typing import Annotated, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from shared.ids import ID_BODY
from shared.schemas.common import Answer, IdempotencyKey, PoolId, PoolScoped, TenantScoped
from shared.schemas.paging import DEFAULT_PAGE, Cursor, PageLimit
from shared.validation import whole

ReservationId = Annotated[str, Meta(max_length=56, pattern=whole(rf"^res_{ID_BODY}{{26,52}}$"))]
Amount = Annotated[int, Meta(ge=1, le=1_000_000)]
ReservationState = Literal["pending", "placed", "active", "ended", "failed"]


class ReservationResources(
    Struct,
    forbid_unknown_fields=True,
    omit_defaults=True,
    rename={"gpu_mig": "gpu.mig", "gpu_slot": "gpu.slot"},
):
    """What a reservation asks for: atoms by the pool's sharing mode (S1) and rows."""

    gpu: Amount | UnsetType = UNSET
    gpu_mig: Amount | UnsetType = UNSET
    gpu_slot: Amount | UnsetType = UNSET
    vcpu: Amount | UnsetType = UNSET
    memoryGiB: Amount | UnsetType = UNSET
    hugepages2Mi: Amount | UnsetType = UNSET
    hugepages1Gi: Amount | UnsetType = UNSET
    diskGiB: Amount | UnsetType = UNSET


class ReservationsCreate(PoolScoped):
    resources: ReservationResources
    mig_profile: (
        Annotated[
            str, Meta(max_length=32, pattern=whole(r"^([1-9]c\.)?[1-9]g\.[0-9]+gb([+-][a-z.]+)?$"))
        ]
        | UnsetType
    ) = UNSET
    idempotency_key: IdempotencyKey | UnsetType = UNSET
    duration_seconds: (
        Annotated[
            int,
            Meta(
                ge=60,
                le=7_776_000,
                description="C4: the reservation ends (TimeUp) this long after its create; "
                "it may not end after its offer's notAfter.",
            ),
        ]
        | UnsetType
    ) = UNSET


class ReservationsGet(TenantScoped):
    reservation_id: ReservationId


class ReservationsEnd(TenantScoped):
    reservation_id: ReservationId


class ReservationsList(TenantScoped):
    """The tenant's reservations in id order, a page at a time (B1)."""

    pool_id: PoolId | UnsetType = UNSET
    states: Annotated[list[ReservationState], Meta(max_length=5)] | UnsetType = UNSET
    limit: PageLimit = DEFAULT_PAGE
    cursor: Cursor | UnsetType = UNSET


class PlacedGpu(Answer):
    index: int
    uuid: str
    minor_number: int | None
    numa_node: int | None


class PlacedMig(Answer):
    uuid: str
    profile: str
    gpu_index: int


class PlacedSlot(Answer):
    gpu_index: int
    slot: int


class PlacedTopology(Answer):
    nvlink: bool | None  # every pair of the booked GPUs NVLink-joined; null for under two
    worst_level: str | None  # the worst pair's PCIe level (internal … system); null under two
    numa_nodes: list[int]  # the NUMA nodes the booked GPUs (or pinned CPUs) sit on


class Placement(Answer):
    """D4: exactly what a placed reservation holds on its node."""

    node_id: str
    hostname: str
    gpus: list[PlacedGpu]
    mig_instances: list[PlacedMig]
    slots: list[PlacedSlot]
    cpus: str | None  # a cpulist: exclusive CPUs when pinned, the affine CPUs when shared
    cpu_quota: int | None  # percent (vcpu × 100) when the vCPUs are a share
    memory_bytes: int | None
    memory_nodes: str | None  # a cpulist of NUMA nodes, when pinned
    topology: PlacedTopology


DeliveryState = Literal[
    "pending", "delivered", "failed", "releasing", "released", "release-blocked"
]


class Delivery(Answer):
    """D4, D6, D7: how far the host has got with the booking."""

    state: DeliveryState
    reason: str | None
    at: str


class ReservationView(Answer):
    id: str
    tenant_id: str
    pool_id: str
    resources: dict[str, int]
    mig_profile: str | None
    state: str
    reason: str | None
    node_id: str | None
    created_at: str
    updated_at: str
    placed_at: str | None
    ended_at: str | None
    expires_at: str | None
    ends_at: str | None  # C4: when its duration runs out (TimeUp); null: until ended
    placement: Placement | None  # D4: null until placed
    delivery: Delivery | None  # null until placed


class ReservationList(Answer):
    items: list[ReservationView]
    next: str | None  # the cursor of the next page (B1); null at the end
