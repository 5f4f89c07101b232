"""Authenticated principals kept in memory, so a request does not read its credential each time.

Exact because this process is the only writer: every change that can end a
credential (revoke, tenant deletion) clears the cache before it answers.
Creating a credential needs nothing: an unknown token is simply not cached.
"""

from controlplane.iam.decide import Principal

MAX_ENTRIES = 10_000


class CredentialCache:
    def __init__(self) -> None:
        self._by_hash: dict[bytes, Principal] = {}

    def get(self, hashed: bytes) -> Principal | None:
        return self._by_hash.get(hashed)

    def put(self, hashed: bytes, principal: Principal) -> None:
        if len(self._by_hash) >= MAX_ENTRIES:
            self._by_hash.pop(next(iter(self._by_hash)))  # the oldest entry
        self._by_hash[hashed] = principal

    def clear(self) -> None:
        self._by_hash.clear()
