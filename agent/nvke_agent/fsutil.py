"""Crash-safe file writes: write a temporary file, fsync it, rename it over the target, fsync
the directory. After a crash the target holds either the old or the new content, never a mix
(POSIX ``rename`` is atomic; the directory fsync makes the rename itself durable).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

TMP_SUFFIX = ".tmp"


def fsync_dir(directory: Path) -> None:
    """Make renames/unlinks in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes, *, mode: int = 0o600) -> None:
    """Write ``data`` to ``path`` atomically and durably; the file gets permission ``mode``."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}{TMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    try:
        os.fchmod(fd, mode)  # O_CREAT's mode is filtered by the umask; this is not
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    os.close(fd)
    os.replace(tmp, path)
    fsync_dir(path.parent)
