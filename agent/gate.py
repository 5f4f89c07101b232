"""The gate between a NodeSpec and the host: check it whole (F3), then apply it and deliver its
bookings, and answer the outcomes.

``refusal`` checks a spec as agent/trust.py says (its files and commands lie where this agent
writes and runs, and its units are what the agent's own renderer makes of the policy the spec
carries); a spec refused is refused whole, nothing of it applied, and its outcome says why
(``applied: {version, refused, units: []}``; the bookings' outcomes stay as they were).

``HostApply`` is the root side: it runs the check itself and then applies the units
(agent/apply.py) and delivers and releases the bookings (agent/delivery.py). The single-process
agent calls it in-process; under systemd the root applier (agent/applier.py) does, for the
unprivileged network process that hands it each spec: there the check is the real gate, since
the process that fetched the spec may be compromised.
"""

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import msgspec

from agent.apply import Applier
from agent.delivery import Deliverer
from agent.state import bookings_of, units_of
from agent.trust import Untrusted, check_rendered, check_spec
from shared.inventory import Inventory

REFUSAL_LENGTH = 400  # of the reason reported: the node's stateReason holds 500 with its prefix


class Outcomes(msgspec.Struct, forbid_unknown_fields=True):
    """What applying a spec did: ``applied`` as a report carries it (each unit's outcome, or the
    refusal) and each booking's outcome; ``bookings`` None when the spec was refused."""

    applied: dict[str, Any]
    bookings: list[dict[str, Any]] | None = None


class Host(Protocol):
    """What applies a spec on the host: in-process (HostApply) or the root applier."""

    def apply(self, spec: Mapping[str, Any], inventory: Inventory) -> Outcomes: ...


def refusal(root: Path, spec: Mapping[str, Any], inventory: Inventory) -> Outcomes | None:
    """The outcome of refusing ``spec`` whole, with the first reason found; None when this
    agent trusts it (F3). ``inventory``: the host the spec's units are rendered for again."""
    units, wanted = units_of(dict(spec)), bookings_of(dict(spec))
    try:
        check_spec(root, units, wanted)
        check_rendered(spec, units, inventory)
    except Untrusted as exc:
        refused = {"version": units.version, "refused": str(exc)[:REFUSAL_LENGTH], "units": []}
        return Outcomes(refused)
    return None


class HostApply:
    """Checks, applies and delivers a spec under the units' applier's root."""

    def __init__(self, applier: Applier, deliverer: Deliverer) -> None:
        self.applier = applier
        self.deliverer = deliverer

    @property
    def root(self) -> Path:
        return self.applier.root

    def apply(self, spec: Mapping[str, Any], inventory: Inventory) -> Outcomes:
        """Every cycle, not only on a new spec: what drifted on the host is put back."""
        refused = refusal(self.root, spec, inventory)
        if refused is not None:
            return refused
        applied = msgspec.to_builtins(self.applier.apply(units_of(dict(spec))))
        bookings = msgspec.to_builtins(self.deliverer.deliver(bookings_of(dict(spec)), inventory))
        return Outcomes(applied, bookings)
