"""Writing files so that a crash leaves either the old content or the new, never half of it."""

import os
from pathlib import Path


def atomic_write(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write ``data`` to a temporary file with ``mode`` from the start, fsync, rename over ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.tmp")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.write(fd, data)
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


def write_secret(path: Path, text: str) -> None:
    """A secret file: mode 0600 from its first byte."""
    atomic_write(path, text.encode() + b"\n", 0o600)
