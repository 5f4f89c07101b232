"""Bearer tokens: random, shown once, stored as a SHA-256 hash.

A token carries 256 random bits, so a fast hash is enough: there is nothing to
brute-force, and lookups stay one indexed read per request.
"""

import hashlib
import secrets

TOKEN_PREFIX = "bct_"


def new_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
