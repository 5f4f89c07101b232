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

    def seen(self, node_id: str) -> None:
        self._seen[node_id] = time.time()

    def last_epoch(self, node_id: str) -> float | None:
        return self._seen.get(node_id)

    def last_seen(self, node_id: str) -> str | None:
        at = self._seen.get(node_id)
        return None if at is None else timestamp(at)
