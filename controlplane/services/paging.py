"""B1: keyset pages, never OFFSET. A list reads the rows after its cursor in its stable order,
``limit + 1`` of them: the extra row says whether another page follows, and the key of the
page's last row read is the next page's position.

A list that decides each item on its pool (R1) pages over the rows it read, shown or not, so
the cursor moves past the items it leaves out and paging never stalls on them. That position
may be the key of an item the caller may not see (§3: never reveal existence), so a cursor is
the position sealed: encrypted and authenticated with the database's cursor key, which every
replica reads from the same row (storage/paging.py), so a cursor from one replica pages on
another. It reveals no key (not even its length: positions are padded to a multiple of 128
bytes) and cannot be forged or altered, nor taken to another list, tenant or filter: the
scope it was given for (the list's name and the request but for its cursor and limit) is
authenticated with it, and anything this scope did not give is INVALID_INPUT on ``cursor``.
What a page still shows a narrowed credential is that items it may not see lie there: a page
with fewer items than its limit, or none, and a next.

F5: the seal is ``cryptography``'s AES-256-GCM under the cursor key: ``version ‖ nonce ‖
ciphertext and tag`` in base64url without padding, a random 96-bit nonce per cursor, and the
version byte with the scope as associated data. A cursor of another version is refused.
"""

import base64
import binascii
import os
from collections.abc import Callable
from typing import TypeVar

import msgspec
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from msgspec import UNSET, UnsetType

from controlplane.storage.paging import cursor_key
from controlplane.storage.sql import Database
from shared.errors import InvalidInput

T = TypeVar("T")

VERSION = b"\x01"  # the first byte of every cursor: how the rest is sealed
NONCE = 12  # bytes: AES-GCM's 96-bit nonce
PAD = 128  # positions are padded with NUL (never in a key) to a multiple of this


def scope(of: str, request: msgspec.Struct) -> str:
    """What a cursor is good for: the list ``of`` with this request's tenant and filters
    (every field but the cursor and the limit)."""
    fields = {
        name: value
        for name, value in sorted(msgspec.structs.asdict(request).items())
        if name not in ("cursor", "limit") and value is not UNSET
    }
    return of + "\0" + msgspec.json.encode(fields).decode()


def position(db: Database, of: str, cursor: str | UnsetType) -> str:
    """Where a page starts: after the key ``cursor`` seals for the scope ``of`` (see
    ``scope``; "" without a cursor, before the first row)."""
    return "" if cursor is UNSET else unseal(cursor_key(db), of, cursor)


def page(
    db: Database, of: str, found: list[T], limit: int | None, key: Callable[[T], str]
) -> tuple[list[T], str | None]:
    """The page's rows (``found`` was read with ``limit + 1``) and, when more follow, the next
    cursor: its last row's ``key``, sealed for the scope ``of``; with ``limit`` None every
    row and no cursor."""
    if limit is None or len(found) <= limit:
        return found, None
    return found[:limit], seal(cursor_key(db), of, key(found[limit - 1]))


def seal(secret: bytes, of: str, key: str) -> str:
    """A row's key as the list ``of`` gives it as a cursor."""
    nonce = os.urandom(NONCE)
    plain = key.encode()
    padded = plain + b"\0" * (-len(plain) % PAD)
    sealed = AESGCM(secret).encrypt(nonce, padded, VERSION + of.encode())
    return base64.urlsafe_b64encode(VERSION + nonce + sealed).rstrip(b"=").decode()


def unseal(secret: bytes, of: str, cursor: str) -> str:
    """The row key a cursor of the list ``of`` seals; anything else is INVALID_INPUT."""
    refused = InvalidInput("the cursor is not one this list gave", field="cursor")
    try:
        raw = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
    except binascii.Error:
        raise refused from None
    version, nonce, sealed = raw[:1], raw[1 : 1 + NONCE], raw[1 + NONCE :]
    if version != VERSION or len(nonce) != NONCE:
        raise refused
    try:
        padded = AESGCM(secret).decrypt(nonce, sealed, version + of.encode())
    except InvalidTag:
        raise refused from None
    return padded.rstrip(b"\0").decode()
