"""R7: acknowledged writes survive a power loss by default; database and secret files are private."""

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.storage.db import Store
from tests.daemons import Daemon


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def test_r7_commits_are_synced_by_default_and_relaxed_only_when_asked(tmp_path: Path) -> None:
    """R7: synchronous=FULL on every connection by default (WAL synced at each commit);
    --durability relaxed is synchronous=NORMAL."""
    for durability, expected in (("full", 2), ("relaxed", 1)):
        store = Store(tmp_path / f"{durability}.db", durability)  # type: ignore[arg-type]
        try:
            assert store.transact(lambda db: db.execute("PRAGMA synchronous").fetchone()[0]) == (
                expected
            )
            assert store.reader.execute("PRAGMA synchronous").fetchone()[0] == expected
        finally:
            store.close()
    default = Store(tmp_path / "default.db")
    try:
        assert default.reader.execute("PRAGMA synchronous").fetchone()[0] == 2
    finally:
        default.close()


def test_r7_database_files_are_0600_and_a_new_directory_0700_under_umask_022(
    tmp_path: Path, umask_022: None
) -> None:
    """R7: under umask 022 the database, its -wal and -shm are 0600 and the directory made
    for them 0700; an existing wider file and directory are tightened on start, a shared
    (sticky) directory is not."""
    path = tmp_path / "state" / "bc.db"
    store = Store(path)
    try:
        store.transact(lambda db: db.execute("CREATE TABLE t (x)"))
        assert mode(path.parent) == 0o700
        for name in ("bc.db", "bc.db-wal", "bc.db-shm"):
            assert mode(path.parent / name) == 0o600, name
    finally:
        store.close()
    path.chmod(0o644)
    path.parent.chmod(0o755)
    Store(path).close()
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # like /tmp: not ours to narrow
    Store(shared / "bc.db").close()
    assert mode(shared) == 0o1777 and mode(shared / "bc.db") == 0o600


def test_r7_the_daemon_keeps_its_files_private_under_umask_022(
    tmp_path: Path, umask_022: None
) -> None:
    """R7: a real `serve` started under umask 022: data directory 0700, database files and
    the root token 0600."""
    daemon = Daemon(tmp_path)
    daemon.start()
    try:
        data = tmp_path / "data"
        assert mode(data) == 0o700
        for name in ("bc.db", "bc.db-wal", "bc.db-shm", "root.token"):
            assert mode(data / name) == 0o600, name
    finally:
        assert daemon.stop() == 0
