"""Node liveness kept cheap: a report with nothing new only stamps memory.

Every replica writes the stamps of the nodes that report to it to its liveness store
(storage/liveness.py), off the writer, each node's at most every sixth of --node-lost-after
(``due``, ``STAMPS_PER_GRACE``); the leader's lost-node check reads them there. Memory is read from the event loop,
the writer thread and the liveness thread alike: single dict operations, which the GIL makes
safe beside the event loop's writes.
"""

import math
import time
from collections.abc import Iterable

from controlplane.storage.db import timestamp
from controlplane.storage.liveness import LivenessStore

# A node's stamp is written at most every grace ÷ this. Six, not three: at three, with the
# default report interval of a third of the grace, a report arriving a little early is not
# yet due, so the next one is stamped, and written only at the pass after it: the stored
# stamp could age almost a whole grace period and a node reporting to a follower be marked
# lost. At six a stored stamp is at most about half the grace old.
STAMPS_PER_GRACE = 6


class Liveness:
    def __init__(self) -> None:
        self._seen: dict[str, float] = {}  # node id → epoch seconds of its last report here
        self._flushed: dict[str, float] = {}  # node id → the stamp this replica last wrote
        # Where the stamps are stored, while the reconciler runs (without it: memory only).
        self.stored: LivenessStore | None = None

    def seen(self, node_id: str) -> None:
        self._seen[node_id] = time.time()

    def due(self, every: float) -> dict[str, int]:
        """{node id: epoch second, rounded down} of the nodes seen since this replica last wrote
        their stamp, at most every ``every`` seconds each: what it writes to its liveness store
        so that the leader's lost-node check sees its nodes alive (B4)."""
        found = {
            node_id: at
            for node_id, at in list(self._seen.items())
            if at - self._flushed.get(node_id, 0.0) >= every
        }
        self._flushed.update(found)
        return {node_id: math.floor(at) for node_id, at in found.items()}

    def owe(self, node_ids: Iterable[str]) -> None:
        """The next ``due`` includes these nodes' stamps (a flush that failed, or a pass that
        found their stored stamps old while memory has them alive)."""
        for node_id in node_ids:
            self._flushed.pop(node_id, None)

    def last_epoch(self, node_id: str) -> float | None:
        """The node's latest stamp: this replica's memory, or the stored one when later (it
        reported to another replica since, B4)."""
        store = self.stored
        stored = None if store is None else store.stamp(node_id)
        known = [at for at in (self._seen.get(node_id), stored) if at is not None]
        return float(max(known)) if known else None

    def last_seen(self, node_id: str) -> str | None:
        """For node views: memory first, then the stored stamp."""
        at: float | None = self._seen.get(node_id)
        store = self.stored
        if at is None and store is not None:
            at = store.stamp(node_id)
        return None if at is None else timestamp(at)
