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
under its MAC, and anything this scope did not give is INVALID_INPUT on ``cursor``. What a
page still shows a narrowed credential is that items it may not see lie there: a page with
fewer items than its limit, or none, and a next.

The seal, with the standard library only (encrypt-then-MAC): a 16-byte random nonce; the
padded position XOR a keystream of HMAC-SHA256(encryption key, nonce ‖ block counter) blocks;
a 16-byte HMAC-SHA256 tag (MAC key) over the scope, the nonce and the ciphertext; both keys
derived from the cursor key; ``nonce ‖ ciphertext ‖ tag`` in base64url without padding.
"""

import base64
import binascii
import hashlib
import hmac
import os
from collections.abc import Callable
from typing import TypeVar

import msgspec
from msgspec import UNSET, UnsetType

from controlplane.storage.paging import cursor_key
from controlplane.storage.sql import Database
from shared.errors import InvalidInput

T = TypeVar("T")

NONCE, TAG, BLOCK = 16, 16, hashlib.sha256().digest_size
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


def _keys(secret: bytes) -> tuple[bytes, bytes]:
    """The encryption key and the MAC key, each derived from the cursor key."""
    encryption = hmac.new(secret, b"bc cursor encryption", hashlib.sha256).digest()
    return encryption, hmac.new(secret, b"bc cursor mac", hashlib.sha256).digest()


def _xor(key: bytes, nonce: bytes, data: bytes) -> bytes:
    blocks = range(-(-len(data) // BLOCK))
    stream = b"".join(
        hmac.new(key, nonce + n.to_bytes(4, "big"), hashlib.sha256).digest() for n in blocks
    )
    mixed = int.from_bytes(data, "big") ^ int.from_bytes(stream[: len(data)], "big")
    return mixed.to_bytes(len(data), "big")


def _tag(key: bytes, of: str, nonce: bytes, ciphertext: bytes) -> bytes:
    signed = of.encode() + b"\0" + nonce + ciphertext
    return hmac.new(key, signed, hashlib.sha256).digest()[:TAG]


def seal(secret: bytes, of: str, key: str) -> str:
    """A row's key as the list ``of`` gives it as a cursor."""
    encryption, mac = _keys(secret)
    nonce = os.urandom(NONCE)
    plain = key.encode()
    ciphertext = _xor(encryption, nonce, plain + b"\0" * (-len(plain) % PAD))
    sealed = nonce + ciphertext + _tag(mac, of, nonce, ciphertext)
    return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()


def unseal(secret: bytes, of: str, cursor: str) -> str:
    """The row key a cursor of the list ``of`` seals; anything else is INVALID_INPUT."""
    try:
        sealed = base64.b64decode(cursor + "=" * (-len(cursor) % 4), altchars=b"-_", validate=True)
    except binascii.Error:
        sealed = b""  # refused below, as any other cursor this list did not give
    encryption, mac = _keys(secret)
    nonce, ciphertext, tag = sealed[:NONCE], sealed[NONCE:-TAG], sealed[-TAG:]
    if not ciphertext or not hmac.compare_digest(tag, _tag(mac, of, nonce, ciphertext)):
        raise InvalidInput("the cursor is not one this list gave", field="cursor")
    return _xor(encryption, nonce, ciphertext).rstrip(b"\0").decode()
