"""R7: atomic_write writes every byte, through no symlink, and replaces the file in one rename."""

import os
import stat
from pathlib import Path

import pytest

from shared.files import atomic_write

PAYLOAD = bytes(range(256)) * 64  # 16 KiB, every byte value


def test_a_short_write_is_completed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """R7: when the kernel takes only part of a write, the rest is written after it."""
    target = tmp_path / "state.json"
    real_write = os.write
    calls: list[int] = []

    def short_write(fd: int, data: bytes | memoryview, /) -> int:
        # Short only for the temporary file; anything else this process writes is left alone.
        if os.readlink(f"/proc/self/fd/{fd}") != str(tmp_path / ".state.json.tmp"):
            return real_write(fd, data)
        calls.append(len(data))
        return real_write(fd, data[:1000])  # the kernel takes at most 1000 bytes a call

    monkeypatch.setattr(os, "write", short_write)  # the call shared.files makes
    atomic_write(target, PAYLOAD, 0o600)
    monkeypatch.undo()
    assert target.read_bytes() == PAYLOAD
    assert len(calls) == 17  # 16 KiB in 1000-byte pieces
    assert stat.S_IMODE(target.stat().st_mode) == 0o600


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlink_at_the_temporary_name_is_refused(tmp_path: Path, dangling: bool) -> None:
    """R7: a symlink planted where the temporary file goes is refused and left, never followed."""
    elsewhere = tmp_path / "elsewhere"
    if not dangling:
        elsewhere.write_bytes(b"not yours")
    target = tmp_path / "state" / "spec.json"
    target.parent.mkdir()
    temp = target.with_name(".spec.json.tmp")
    temp.symlink_to(elsewhere)
    with pytest.raises(FileExistsError):
        atomic_write(target, b"new content")
    assert not target.exists()
    assert temp.is_symlink()
    if dangling:
        assert not elsewhere.exists()  # not created through the link
    else:
        assert elsewhere.read_bytes() == b"not yours"


def test_a_leftover_temporary_file_is_replaced(tmp_path: Path) -> None:
    """R7: a temporary file a crash left behind gives way to a new one with the asked mode."""
    target = tmp_path / "token"
    leftover = tmp_path / ".token.tmp"
    leftover.write_bytes(b"half of an old write, and more bytes than the new one")
    leftover.chmod(0o666)
    atomic_write(target, b"secret", 0o600)
    assert target.read_bytes() == b"secret"
    assert stat.S_IMODE(target.stat().st_mode) == 0o600
    assert not leftover.exists()


def test_a_directory_at_the_temporary_name_is_refused(tmp_path: Path) -> None:
    """R7: only a regular file at the temporary name is taken for a leftover and removed."""
    (tmp_path / ".spec.json.tmp").mkdir()
    with pytest.raises(FileExistsError):
        atomic_write(tmp_path / "spec.json", b"{}")
    assert (tmp_path / ".spec.json.tmp").is_dir()
    assert not (tmp_path / "spec.json").exists()
