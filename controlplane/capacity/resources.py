"""What a host node offers: node_resources rows and GPU atoms (N2–N5, S1). Pure functions.

Arithmetic is exact (fractions), so a ratio of 2.3 on 100 CPUs gives 230,
not the 229 that binary floating point would floor to.
"""

import math
from dataclasses import dataclass
from fractions import Fraction

from msgspec import UNSET

from shared.inventory import Gpu, Inventory
from shared.policy import Policy

GIB = 2**30
PAGE_2MI = 2 * 2**20
RATIO_MIN, RATIO_MAX = 0.1, 100.0
HOST_CLASSES = ("metal-host", "vps-host")  # N2: only host nodes add schedulable capacity
SLOT_SHARING = ("timeslice", "mps")


@dataclass(frozen=True)
class HostFacts:
    """The inventory facts capacity depends on."""

    logical_cpus: int
    memory_total_bytes: int
    hugepages_2mi: int
    hugepages_1gi: int
    disk_total_bytes: int

    @classmethod
    def of(cls, inventory: Inventory) -> "HostFacts":
        pages = inventory.hugepages
        return cls(
            logical_cpus=inventory.cpu.logical_cpus,
            memory_total_bytes=inventory.memory_total_bytes,
            hugepages_2mi=pages.pages_2mi.total if pages.pages_2mi else 0,
            hugepages_1gi=pages.pages_1gi.total if pages.pages_1gi else 0,
            disk_total_bytes=sum(fs.total_bytes for fs in inventory.filesystems),  # N4
        )


@dataclass(frozen=True)
class Row:
    capacity: int
    ratio: float


@dataclass(frozen=True)
class Atom:
    """One bookable GPU unit: a whole GPU, a MIG instance, or a time-slice/MPS slot."""

    device_id: str
    resource: str
    gpu_uuid: str
    profile: str | None = None


def clamp_ratio(ratio: float | None) -> float:
    """N4: the overcommit ratio defaults to 1 and is clamped to 0.1…100."""
    if ratio is None:
        return 1.0
    return min(RATIO_MAX, max(RATIO_MIN, ratio))


def _whole(amount: Fraction, ratio: float) -> int:
    """Rounded down after the ratio, never negative (N4)."""
    return max(0, math.floor(amount * Fraction(str(ratio))))


def desired_rows(facts: HostFacts, pool_class: str, policy: Policy) -> dict[str, Row]:
    """N3: the rows a host node of the pool should have; tenant-controlled nodes get none.

    vcpu and memoryGiB everywhere, diskGiB in vps-host pools, and the huge page rows "for
    every pool" as seed 000 says (DESIGN's N3 leaves them out of vps-host pools; the seed wins).
    """
    if pool_class not in HOST_CLASSES:
        return {}
    reserve_vcpu, reserve_gib = 0, 0.0
    if policy.hostReserve is not UNSET:
        reserve_vcpu, reserve_gib = policy.hostReserve.vcpu, policy.hostReserve.memoryGiB
    over = policy.overcommit
    vcpu_ratio = clamp_ratio(None if over is UNSET or over.vcpu is UNSET else over.vcpu)
    memory_ratio = clamp_ratio(None if over is UNSET or over.memoryGiB is UNSET else over.memoryGiB)
    pages_bytes = facts.hugepages_2mi * PAGE_2MI + facts.hugepages_1gi * GIB
    memory = Fraction(facts.memory_total_bytes - pages_bytes, GIB) - Fraction(str(reserve_gib))
    rows = {
        "vcpu": Row(_whole(Fraction(facts.logical_cpus - reserve_vcpu), vcpu_ratio), vcpu_ratio),
        "memoryGiB": Row(_whole(memory, memory_ratio), memory_ratio),
    }
    if pool_class == "vps-host":
        disk_ratio = clamp_ratio(None if over is UNSET or over.diskGiB is UNSET else over.diskGiB)
        rows.update(
            diskGiB=Row(_whole(Fraction(facts.disk_total_bytes, GIB), disk_ratio), disk_ratio)
        )
    # Every pool (seed 000): huge pages are the configured pages, never overcommitted.
    rows["hugepages2Mi"] = Row(facts.hugepages_2mi, 1.0)
    rows["hugepages1Gi"] = Row(facts.hugepages_1gi, 1.0)
    return rows


def settled(desired: int, allocated: int) -> int:
    """N5: a row never shrinks below what is allocated."""
    return max(desired, allocated)


def gpu_atoms(gpus: list[Gpu], pool_class: str, sharing: str, replicas: int | None) -> list[Atom]:
    """S1: exclusive → one `gpu` per GPU; mig → one `gpu.mig` per MIG instance;
    timeslice/mps → `replicas` `gpu.slot` per GPU. Display GPUs (no family) are not atoms."""
    if pool_class not in HOST_CLASSES:
        return []
    atoms: list[Atom] = []
    for gpu in gpus:
        if gpu.family is None:
            continue
        if sharing == "mig":
            if gpu.mig_current:
                atoms += [
                    Atom(inst.uuid, "gpu.mig", gpu.uuid, inst.profile) for inst in gpu.mig_instances
                ]
        elif gpu.mig_current:
            continue  # a GPU in MIG mode cannot be booked whole or sliced in time
        elif sharing in SLOT_SHARING:
            atoms += [Atom(f"{gpu.uuid}::{n}", "gpu.slot", gpu.uuid) for n in range(replicas or 0)]
        else:
            atoms.append(Atom(gpu.uuid, "gpu", gpu.uuid))
    return atoms
