"""Node liveness kept cheap: a report with nothing new only stamps memory.

The reconciler persists the stamps in one batch per pass, then marks nodes
not seen within the grace period as lost. A restart loses at most one
interval of stamps, which the grace period covers.
"""

import time

from controlplane.storage.db import parse_timestamp, timestamp


class Liveness:
    def __init__(self) -> None:
        self._seen: dict[str, float] = {}  # epoch seconds: formatting waits for the flush

    def seen(self, node_id: str) -> None:
        self._seen[node_id] = time.time()

    def last_seen(self, node_id: str) -> str | None:
        at = self._seen.get(node_id)
        return None if at is None else timestamp(at)

    def drain(self) -> list[tuple[str, str]]:
        """(at, node id) pairs seen since the last drain, for one batched UPDATE."""
        pending, self._seen = self._seen, {}
        return [(timestamp(at), node_id) for node_id, at in pending.items()]

    def restore(self, pairs: list[tuple[str, str]]) -> None:
        """Put back stamps whose write failed, unless newer ones arrived meanwhile."""
        for at, node_id in pairs:
            self._seen.setdefault(node_id, parse_timestamp(at))
