"""F5: list cursors are sealed with ``cryptography``'s AEAD (AES-256-GCM): a version byte
first, the list's scope as associated data; the cursor key is read once per process for each
database."""

import base64
import os
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from controlplane.config import Config
from controlplane.services.paging import NONCE, VERSION, scope, seal, unseal
from controlplane.storage.db import Store, connect
from controlplane.storage.paging import cursor_key, identity
from shared.errors import InvalidInput
from shared.schemas import PoolsList, ReservationsList

SECRET = os.urandom(32)
ACME = scope("pools", PoolsList(tenant_id="acme"))


def raw(cursor: str) -> bytes:
    return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))


def text(sealed: bytes) -> str:
    return base64.urlsafe_b64encode(sealed).rstrip(b"=").decode()


def refused(of: str, cursor: str) -> None:
    with pytest.raises(InvalidInput) as caught:
        unseal(SECRET, of, cursor)
    assert caught.value.details == {"field": "cursor"}


def test_f5_a_cursor_is_its_version_a_nonce_and_the_aead_of_the_padded_position() -> None:
    """F5: a cursor opens as AES-GCM of the position padded to 128 bytes, under the cursor key,
    with the version byte and the scope as associated data; two seals of one position differ."""
    cursor = seal(SECRET, ACME, "pool_1")
    sealed = raw(cursor)
    assert sealed[:1] == VERSION == b"\x01"
    nonce, body = sealed[1 : 1 + NONCE], sealed[1 + NONCE :]
    assert len(nonce) == 12 and len(body) == 128 + 16  # the padded position and GCM's tag
    opened = AESGCM(SECRET).decrypt(nonce, body, VERSION + ACME.encode())
    assert opened == b"pool_1" + b"\0" * 122
    assert unseal(SECRET, ACME, cursor) == "pool_1"
    assert seal(SECRET, ACME, "pool_1") != cursor


def test_f5_a_cursor_of_another_version_is_invalid_input() -> None:
    """F5: the same sealed bytes under another version byte (or none) are refused."""
    sealed = raw(seal(SECRET, ACME, "pool_1"))
    for version in (b"\x00", b"\x02", b"\xff"):
        refused(ACME, text(version + sealed[1:]))
    refused(ACME, text(sealed[1:]))


def test_f5_the_scope_is_associated_data_another_scope_fails() -> None:
    """F5: a cursor opens only for the scope it was sealed for: another tenant, another
    filter or another list is INVALID_INPUT, though the key and the bytes are the same."""
    cursor = seal(SECRET, ACME, "pool_1")
    others = [
        scope("pools", PoolsList(tenant_id="root")),
        scope("reservations", ReservationsList(tenant_id="acme")),
        scope("reservations", ReservationsList(tenant_id="acme", pool_id="pool_1")),
        ACME + " ",
    ]
    for other in others:
        refused(other, cursor)
    assert unseal(SECRET, ACME, cursor) == "pool_1"


def test_f5_forged_cut_or_foreign_cursors_are_invalid_input() -> None:
    """F5: random bytes behind the version byte, a cursor cut short or lengthened, one sealed
    under another key, or text that is not base64url, are INVALID_INPUT on `cursor`."""
    cursor = seal(SECRET, ACME, "pool_1")
    sealed = raw(cursor)
    flipped = sealed[:20] + bytes([sealed[20] ^ 1]) + sealed[21:]
    for forged in (
        text(VERSION + os.urandom(len(sealed) - 1)),
        text(flipped),
        text(sealed[:-1]),
        text(sealed[: 1 + NONCE]),
        text(sealed + b"\0"),
        seal(os.urandom(32), ACME, "pool_1"),
        "not base64!",
        "",
    ):
        refused(ACME, forged)


def test_f5_the_cursor_key_is_read_once_per_process_for_each_database(tmp_path: Path) -> None:
    """F5: however many connections and pages, a database's cursor key row is read once in a
    process; another database has its own key."""
    stores = [Store(tmp_path / f"{n}.db") for n in range(2)]
    connections = [connect(tmp_path / "0.db") for _ in range(2)]
    try:
        ran: list[str] = []
        for conn in connections:
            conn.conn.set_trace_callback(ran.append)  # type: ignore[attr-defined]
        keys = {cursor_key(conn) for conn in connections for _ in range(3)}
        assert len(keys) == 1 and len(next(iter(keys))) == 32
        assert sum("cursor_key" in statement for statement in ran) == 1, ran
        assert cursor_key(stores[1].reader) not in keys
    finally:
        for conn in connections:
            conn.close()
        for store in stores:
            store.close()


def test_f5_connections_to_one_database_share_its_identity(config: Config) -> None:
    """F5: two connections to the app's database (a SQLite file, or a PostgreSQL database)
    name the same database and read the same key; a fresh store elsewhere is another."""
    store = Store(config.db_path)
    other = Store(config.root_token_file.parent / "other.db")
    first, second = connect(config.db_path), connect(config.db_path)
    try:
        assert identity(first) == identity(second) is not None
        assert identity(other.reader) != identity(first)
        assert cursor_key(first) == cursor_key(second) != cursor_key(other.reader)
    finally:
        first.close()
        second.close()
        other.close()
        store.close()
