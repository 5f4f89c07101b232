"""Encoded answers of cached reads, kept while their scopes' generations stand (B6, F8).

A read marked ``cached`` depends on nothing but the database, the caller's
credential and the request body, and declares the scopes of the database it
reads (catalog, usage, fleet); a committed write to a table of a scope moves
that scope's generation (triggers, in its transaction, on any replica). So an
answer made at generation g of its scopes for (method, credential, body) is the
answer while they still stand at g: the same state gives the same decision and
the same view, and a node's report keeps every pool answer. Fleet dashboards that poll a list of thousands of pools then cost one
lookup until something changes. Bounded by total bytes, least recently used out.

Every answer goes when the process has reconnected to PostgreSQL since it was made (F1): a
failover may have put a standby behind the database, whose generations need not be the
primary's.
"""

from collections import OrderedDict

from controlplane.storage.sql import reconnects

MAX_BYTES = 64 * 1024 * 1024

Key = tuple[str, str, bytes]  # (method path, credential id, request body)


class AnswerCache:
    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._max_bytes = max_bytes
        self._bytes = 0
        self._entries: OrderedDict[Key, tuple[int, bytes]] = OrderedDict()
        self.hits = 0
        self._reconnects = reconnects()

    def get(self, key: Key, generation: int) -> bytes | None:
        if reconnects() != self._reconnects:  # F1: answers of the database as it was go
            self._entries.clear()
            self._bytes = 0
            self._reconnects = reconnects()
        found = self._entries.get(key)
        if found is None or found[0] != generation:
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return found[1]

    def put(self, key: Key, generation: int, answer: bytes) -> None:
        size = len(answer) + len(key[2])
        if size > self._max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self._bytes -= len(old[1]) + len(key[2])
        while self._entries and self._bytes + size > self._max_bytes:
            (_path, _credential, body), (_generation, evicted) = self._entries.popitem(last=False)
            self._bytes -= len(evicted) + len(body)
        self._entries[key] = (generation, answer)
        self._bytes += size
