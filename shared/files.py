"""Writing files so that a crash leaves either the old content or the new, never half of it."""

import os
import stat
from pathlib import Path

# Never through a symlink, never into a file someone else opened first.
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to a temporary file with ``mode`` from the start, fsync, rename over ``path``.

    Every byte is written, however short each ``os.write`` comes back. The temporary
    file is created anew: a regular file left there by a crash is removed first;
    anything else at its name (a symlink, a directory) is refused with
    ``FileExistsError`` and left as it is, never followed.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    fd = _create(temp, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(temp, mode)  # the umask may have narrowed it, never widened
    os.replace(temp, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power cut
    finally:
        os.close(directory)


def _create(temp: Path, mode: int) -> int:
    """The temporary file, opened for writing by this call alone."""
    try:
        return os.open(temp, _TEMP_FLAGS, mode)
    except FileExistsError:
        if not stat.S_ISREG(os.lstat(temp).st_mode):
            raise
        os.unlink(temp)  # a crash's leftover: its content never reached ``path``
        return os.open(temp, _TEMP_FLAGS, mode)


def write_secret(path: Path, text: str) -> None:
    """A secret file: mode 0600 from its first byte."""
    atomic_write(path, text.encode() + b"\n", 0o600)
