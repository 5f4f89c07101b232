"""Authenticated principals kept in memory, so a request does not read its credential each time.

Every change this process makes that can end a credential (revoke, tenant
deletion) clears the cache before it answers; one another replica made is
seen within ``TTL_SECONDS``, since an entry lives no longer than that (B5).
Creating a credential needs nothing: an unknown token is simply not cached.
"""

import time

from controlplane.iam.decide import Principal

MAX_ENTRIES = 10_000
TTL_SECONDS = 0.5  # B5: a revocation on any replica is seen by every one within 1 s


class CredentialCache:
    def __init__(self) -> None:
        self._by_hash: dict[bytes, tuple[Principal, float]] = {}

    def get(self, hashed: bytes) -> Principal | None:
        found = self._by_hash.get(hashed)
        if found is None or found[1] < time.monotonic():
            return None
        return found[0]

    def put(self, hashed: bytes, principal: Principal) -> None:
        if len(self._by_hash) >= MAX_ENTRIES:
            self._by_hash.pop(next(iter(self._by_hash)))  # the oldest entry
        self._by_hash[hashed] = (principal, time.monotonic() + TTL_SECONDS)

    def clear(self) -> None:
        self._by_hash.clear()
