"""Node liveness kept cheap: a report with nothing new only stamps memory.

The reconciler reads the stamps (from its writer thread: single dict lookups,
which the GIL makes safe beside the event loop's writes) and persists a
node's stamp only when the stored one has grown older than the grace period.
"""

import time

from controlplane.storage.db import timestamp


class Liveness:
    def __init__(self) -> None:
        self._seen: dict[str, float] = {}  # node id → epoch seconds of its last report
        self._flushed: dict[str, float] = {}  # node id → the stamp this replica last wrote

    def seen(self, node_id: str) -> None:
        self._seen[node_id] = time.time()

    def due(self, every: float) -> list[tuple[str, str]]:
        """(at, node id) of nodes seen since this replica last wrote their stamp, at most
        every ``every`` seconds each: how a replica that does not lead tells the leader's
        lost-node check that its nodes are alive (B4)."""
        found = [
            (timestamp(at), node_id)
            for node_id, at in list(self._seen.items())
            if at - self._flushed.get(node_id, 0.0) >= every
        ]
        for _at, node_id in found:
            self._flushed[node_id] = self._seen[node_id]
        return found

    def last_epoch(self, node_id: str) -> float | None:
        return self._seen.get(node_id)

    def last_seen(self, node_id: str) -> str | None:
        at = self._seen.get(node_id)
        return None if at is None else timestamp(at)
