"""Ids: a prefix plus lowercase Crockford base32 (the seed's alphabet has no i, l, o, u).

Random ids are ULIDs (26 characters). An id derived from an idempotency key is
the SHA-256 of (tenant, caller, key) in the same alphabet: 52 characters, the
top of the seed's 26…52 range.
"""

import hashlib
import random

from ulid import ULID

ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
ID_BODY = "[0-9a-hjkmnp-tv-z]"
DERIVED_LENGTH = 52  # ceil(256 / 5)


def new_id(prefix: str) -> str:
    """A random, time-ordered id such as ``pool_01k…``."""
    return f"{prefix}_{str(ULID()).lower()}"


def request_id() -> str:
    """A random id for one HTTP request: 64 bits as 16 hex digits (hex is a subset of the
    id alphabet).

    Request ids correlate log lines; they guard nothing, so the fast non-cryptographic
    generator is enough and saves a syscall per request; hex formatting is one C call where
    base32 was a microsecond of Python per request.
    """
    return f"req_{random.getrandbits(64):016x}"


def derived_id(prefix: str, *parts: str) -> str:
    """A stable id for an idempotent create: the same parts always give the same id."""
    digest = hashlib.sha256("\x00".join(parts).encode()).digest()
    number = int.from_bytes(digest, "big")
    chars = []
    for _ in range(DERIVED_LENGTH):
        number, digit = divmod(number, 32)
        chars.append(ALPHABET[digit])
    return f"{prefix}_{''.join(reversed(chars))}"
