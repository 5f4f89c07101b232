"""Which hosts a pool takes, and in which state: N1 families, acceptance, host identity.

Pure functions over an inventory. The control plane derives every GPU's
family from its NVML name itself: the agent's word for it is never trusted.
"""

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from shared.errors import InvalidInput
from shared.inventory import Inventory

READY, CONFIGURING, QUARANTINED, LOST = "ready", "configuring", "quarantined", "lost"
CLEAN = frozenset({"applied", "unchanged", "waiting-drain"})  # a unit's outcome that is no fault
REFUSED_REASON = 500  # characters of a "spec refused: …" stateReason


def identity_of(inventory: Inventory) -> str:
    """A host is its machine id; its GPUs may come and go without making it another node."""
    return hashlib.sha256(inventory.machine_id.encode()).hexdigest()


def same_host(stored: Inventory, joining: Inventory) -> bool:
    """Whether a join with a known machine id is that host, not a clone of its disk image.

    GPUs that overlap (or a host without GPUs keeping its hostname) say it is the same host.
    """
    before = {gpu.uuid for gpu in stored.gpus}
    after = {gpu.uuid for gpu in joining.gpus}
    if before and after:
        return bool(before & after)
    if before or after:
        return True  # the GPUs (or the driver) came or went: the same host, changed
    return stored.hostname == joining.hostname


def check_family(model: str | None, inventory: Inventory) -> None:
    """N1: every GPU's family is the pool's gpuModel (``model``), compared exactly;
    INVALID_INPUT otherwise."""
    members = [(i, gpu) for i, gpu in enumerate(inventory.gpus) if gpu.family is not None]
    if model is None:
        if members:
            i, gpu = members[0]
            raise InvalidInput(
                f"the pool takes hosts without GPUs; this host has {gpu.name}",
                field=f"inventory.gpus.{i}.name",
            )
        return
    if not members:
        raise InvalidInput(
            f"the pool holds {model} GPUs; this host has none", field="inventory.gpus"
        )
    for i, gpu in members:
        if gpu.family != model:
            raise InvalidInput(
                f"GPU {i} is {gpu.name} (family {gpu.family}); the pool holds {model}",
                field=f"inventory.gpus.{i}.name",
            )


def acceptance_failure(policy: Mapping[str, Any], inventory: Inventory) -> str | None:
    """`acceptance: [{kind: diag.nvml}]`: NVML answers and no GPU has uncorrected ECC errors."""
    kinds = {check.get("kind") for check in policy.get("acceptance") or []}
    if "diag.nvml" not in kinds:
        return None
    if not inventory.nvml.available:
        return f"diag.nvml: NVML is not available ({inventory.nvml.error})"
    for gpu in inventory.gpus:
        if gpu.ecc_uncorrected_volatile:
            return f"diag.nvml: GPU {gpu.index} has {gpu.ecc_uncorrected_volatile} uncorrected ECC errors"
    return None


def admission(
    gpu_model: str | None, policy: Mapping[str, Any], inventory: Inventory
) -> tuple[str, str | None]:
    """The state a reporting host gets in a pool of ``gpu_model``: ready, or quarantined with
    the reason.

    A family other than the pool's (after a gpuModel change) quarantines rather
    than refuses, so the node stays known and shows why it offers nothing.
    """
    try:
        check_family(gpu_model, inventory)
    except InvalidInput as exc:
        return QUARANTINED, exc.message
    failure = acceptance_failure(policy, inventory)
    return (READY, None) if failure is None else (QUARANTINED, failure)


@dataclass(frozen=True)
class Configured:
    """How far a node's agent has applied its current NodeSpec (H1)."""

    state: str  # READY or CONFIGURING
    reason: str | None
    applied_version: str | None  # the last spec version applied cleanly
    pending_reboot: bool


def configured(
    spec_version: str | None,
    applied: Mapping[str, Any] | None,
    applied_version: str | None,
    was_ready: bool,
    pending_reboot: bool,
) -> Configured:
    """H1: configuring until the agent reports every unit of the current spec applied or
    unchanged (no failed, no pending-reboot; a drain-gated unit waiting for its GPUs to be
    idle is no fault, H4). Then ready. Later, a failed unit makes the node configuring again
    with the failed ids as the reason; a unit that needs a reboot leaves a ready node ready
    with ``pending_reboot``; a new spec not yet reported keeps a ready node ready. An agent
    that refused the current spec whole (``applied.refused``, F3: it asks for a file or a
    command the agent does not write or run) makes the node configuring with ``spec refused:
    <the agent's reason>``.
    """
    was_ready = was_ready and applied_version is not None  # ready once applied cleanly
    outcomes = {u["id"]: u.get("status") for u in (applied or {}).get("units", [])}
    # failed, or an outcome this control plane does not know: not clean, whichever spec
    # version it was reported for (the spec may have moved since, with a booking)
    failed = sorted(i for i, s in outcomes.items() if s not in CLEAN and s != "pending-reboot")
    if failed:
        return Configured(
            CONFIGURING, f"units failed: {', '.join(failed)}", applied_version, pending_reboot
        )
    if applied is None or applied.get("version") != spec_version:
        if was_ready:
            return Configured(READY, None, applied_version, pending_reboot)
        return Configured(
            CONFIGURING, "waiting for the agent to apply its NodeSpec", applied_version, False
        )
    refused = applied.get("refused")
    if isinstance(refused, str):
        reason = f"spec refused: {refused}"[:REFUSED_REASON]
        return Configured(CONFIGURING, reason, applied_version, pending_reboot)
    reboot = sorted(i for i, status in outcomes.items() if status == "pending-reboot")
    if reboot:
        if was_ready:
            return Configured(READY, None, applied_version, True)
        return Configured(
            CONFIGURING, f"pending reboot: {', '.join(reboot)}", applied_version, True
        )
    return Configured(READY, None, spec_version, False)
