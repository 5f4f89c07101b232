"""Authenticated principals kept in memory, so a request does not read its credential each time.

Every change this process makes that can end a credential (revoke, tenant
deletion) clears the cache before it answers; one another replica made is
seen within ``TTL_SECONDS``, since an entry lives no longer than that (B5).
Creating a credential needs nothing: an unknown token is simply not cached.
"""

import threading
import time

from controlplane.iam.decide import Principal

MAX_ENTRIES = 10_000
TTL_SECONDS = 0.5  # B5: a revocation on any replica is seen by every one within 1 s


class CredentialCache:
    """Shared by the event loop and the reader threads (B6): every change is under a lock,
    and ``clear`` moves an epoch, so a principal read from the database before a revocation
    cleared the cache is not put back after it (``put`` with the epoch of its read)."""

    def __init__(self) -> None:
        self._by_hash: dict[bytes, tuple[Principal, float]] = {}
        self._lock = threading.Lock()
        self.epoch = 0

    def get(self, hashed: bytes) -> Principal | None:
        found = self._by_hash.get(hashed)
        if found is None or found[1] < time.monotonic():
            return None
        return found[0]

    def put(self, hashed: bytes, principal: Principal, epoch: int) -> None:
        """Keep ``principal``, read from the database when the cache was at ``epoch``."""
        with self._lock:
            if epoch != self.epoch:
                return  # cleared since that read: it may be of a revoked credential
            if len(self._by_hash) >= MAX_ENTRIES:
                now = time.monotonic()
                expired = [k for k, (_, until) in self._by_hash.items() if until < now]
                for key in expired or [next(iter(self._by_hash))]:  # else the oldest
                    del self._by_hash[key]
            self._by_hash[hashed] = (principal, time.monotonic() + TTL_SECONDS)

    def clear(self) -> None:
        with self._lock:
            self.epoch += 1
            self._by_hash.clear()
