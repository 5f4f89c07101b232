"""One object per request: who calls, the decoded body, what the method's decision found, and
the parts of the running control plane a service may use.

The handler builds a ``Call`` once; the method's IAM decision (``authorize``) stores in
``found`` the pool, reservation or node it looked up, in the snapshot a read runs in and again
at the start of every transaction of a mutation (the gate), so a service takes the object the
decision saw in its own transaction and never reads it again.
"""

from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

from controlplane.capacity.bookings import Placement
from controlplane.capacity.liveness import Liveness
from controlplane.iam.cache import CredentialCache
from controlplane.iam.decide import Principal
from controlplane.storage.node_types import NodeHead, NodeRow
from controlplane.storage.types import ReservationRow, VisiblePool

Body = TypeVar("Body")
# a tenant's credential, a node's (its head before a write's transaction, its whole row in it
# and in a read: a NodeRow is a NodeHead), or none (nodes/join)
Caller = Principal | NodeHead | None
Found = VisiblePool | ReservationRow | NodeHead | None


class Counters(Protocol):
    """Where services count what they decided, for the metrics above them (M1)."""

    def placement(self, tried: Placement) -> None: ...

    def unit_failed(self, pool_id: str, unit: str) -> None: ...


class Uncounted:
    """Counters that count nothing: services called without an app (tools, tests)."""

    def placement(self, tried: Placement) -> None:
        pass

    def unit_failed(self, pool_id: str, unit: str) -> None:
        pass


@dataclass(frozen=True)
class Env:
    """What services use of the running control plane beside the database."""

    liveness: Liveness = field(default_factory=Liveness)
    credentials: CredentialCache = field(default_factory=CredentialCache)
    attestors: frozenset[str] = frozenset({"join-token"})  # P8: the join attestors served
    counters: Counters = field(default_factory=Uncounted)  # M1: the app's metrics


@dataclass(slots=True)
class Call(Generic[Body]):
    caller: Caller
    body: Body
    env: Env
    found: Found = None  # set by the decision, in the snapshot or transaction it ran in

    @property
    def principal(self) -> Principal:
        """The calling tenant credential's principal (methods of ``auth == "credential"``)."""
        assert isinstance(self.caller, Principal), "a tenant credential's method"
        return self.caller

    @property
    def node(self) -> NodeRow:
        """The node the decision found: the calling node's own, or the one named (``node``)."""
        found = self.found if isinstance(self.found, NodeRow) else self.caller
        assert isinstance(found, NodeRow), "a node's method"
        return found

    @property
    def pool(self) -> VisiblePool:
        """The pool the decision found (``pool``, ``owned-pool``)."""
        assert isinstance(self.found, VisiblePool), "a method decided on a pool"
        return self.found

    @property
    def reservation(self) -> ReservationRow:
        """The reservation the decision found (``reservation``)."""
        assert isinstance(self.found, ReservationRow), "a method decided on a reservation"
        return self.found
