"""A job's metrics file on the job's side: lines appended, its size capped.

The runtime writes one line per metrics interval and one per event, the sidecar likewise,
so a long run with a short interval could fill its user's disk. Past ``MAX_BYTES`` the
file is moved to ``metrics.jsonl.1`` (replacing an older one) and a new one begun: a job's
metrics take at most about twice ``MAX_BYTES``. The controller reads the file by byte
offset; finding it shorter than where it stopped, it reads the rest of
``metrics.jsonl.1`` first (hpcorch/slurm/files.py), so a rotation neither loses nor
repeats a line.

The runtime and the sidecar may append to the same file: each append holds an exclusive
``flock`` on it, and a writer that finds the file rotated under it appends to the new one.
Light: imported by the sidecar and the runtime alike.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

MAX_BYTES = 64 << 20
"""Size past which a metrics file is rotated."""
ROTATED_SUFFIX = ".1"
"""What a rotated metrics file's name ends with."""

_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC


def rotated(path: Path) -> Path:
    return path.with_name(path.name + ROTATED_SUFFIX)


def append_line(path: Path, data: bytes, max_bytes: int = MAX_BYTES) -> None:
    """Append ``data`` (whole lines) to ``path``; first rotate the file when it would grow
    past ``max_bytes`` (a file holding nothing yet takes ``data`` whatever its size)."""
    for _ in range(8):  # another writer rotating it each time: give up on rotation
        fd = os.open(path, _FLAGS, 0o644)
        try:
            with contextlib.suppress(OSError):  # no locks there: appends, unguarded rotation
                fcntl.flock(fd, fcntl.LOCK_EX)
            st = os.fstat(fd)
            try:
                now = os.stat(path)
            except FileNotFoundError:
                continue  # rotated away while this one waited for the lock
            if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                continue
            if st.st_size > 0 and st.st_size + len(data) > max_bytes:
                os.replace(path, rotated(path))
                continue  # the next open begins a new file
            _write_all(fd, data)
            return
        finally:
            os.close(fd)  # releases the lock
    fd = os.open(path, _FLAGS, 0o644)
    try:
        _write_all(fd, data)
    finally:
        os.close(fd)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
