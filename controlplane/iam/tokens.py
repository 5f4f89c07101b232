"""Bearer tokens: random, shown once, stored as a SHA-256 hash.

A token carries 256 random bits, so a fast hash is enough: there is nothing to
brute-force, and lookups stay one indexed read per request.
"""

import hashlib
import secrets

CREDENTIAL_PREFIX = "bct_"  # a tenant's credential
JOIN_PREFIX = "bcj_"  # a pool's join token
NODE_PREFIX = "bcn_"  # a node's credential


def new_token(prefix: str = CREDENTIAL_PREFIX) -> str:
    """256 random bits; the prefix says what kind of secret a leaked string is."""
    return prefix + secrets.token_urlsafe(32)


def token_hash(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
