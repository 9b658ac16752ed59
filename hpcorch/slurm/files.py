"""The controller's files on the Slurm side: the spool it writes plans to, and the one
kind of file it reads from a user's directory (the job's metrics).

Nothing a user controls decides where the controller writes. Plans go to the spool, a
directory the controller owns: ``<spool>/<Slurm job id>/plan.json``. The spool is mode
0711 (others may pass, not list); each job's directory is 0750 plus a POSIX ACL entry
that lets the job's owner read it, or 0755 where the file system has no ACLs (a plan
holds nothing ``squeue`` does not show). Only the controller writes there, and it opens
every path relative to a directory it checked, without following symbolic links.

A job's metrics are read from the job's own directory (the ``dir=`` tag of its comment)
with every component opened without following symbolic links, only when the file is a
regular file owned by the job's owner, without blocking (a FIFO is refused, not opened
for reading), and at most ``MAX_READ`` bytes a cycle (plus the rest of the rotated file,
``metrics.jsonl.1``, in the cycle that finds the file rotated: hpcorch/metrics_file.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import stat
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hpcorch.errors import HpcorchError
from hpcorch.metrics_file import ROTATED_SUFFIX
from hpcorch.planner import LaunchPlan
from hpcorch.protocol import PLAN_FILE, TMP_SUFFIX

MAX_READ = 1 << 20
"""Most bytes of one job's metrics read in one cycle."""
MAX_LINE = 1 << 16
"""Longest metrics line taken; longer lines are skipped."""

_ACL_ACCESS = "system.posix_acl_access"
_ACL_UNDEFINED_ID = 0xFFFFFFFF
_USER_OBJ, _USER, _GROUP_OBJ, _MASK, _OTHER = 0x01, 0x02, 0x04, 0x10, 0x20
_DIR_FLAGS = os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFile(HpcorchError):
    """A user's file the controller will not read (a link, not a regular file, not the
    job owner's, unreadable)."""


class Replaced(UnsafeFile):
    """The file was replaced between its check and its opening (a rotation, or a swap)."""


def posix_acl(owner: int, user: int, uid: int, group: int, other: int) -> bytes:
    """The binary form (``system.posix_acl_access``) of an ACL granting ``uid`` the
    permission bits ``user`` besides the usual owner, group and other bits."""
    entries = [
        (_USER_OBJ, owner, _ACL_UNDEFINED_ID),
        (_USER, user, uid),
        (_GROUP_OBJ, group, _ACL_UNDEFINED_ID),
        (_MASK, user | group, _ACL_UNDEFINED_ID),
        (_OTHER, other, _ACL_UNDEFINED_ID),
    ]
    return struct.pack("<I", 2) + b"".join(struct.pack("<HHI", *e) for e in entries)


class Spool:
    """``<root>/<Slurm job id>/plan.json``, written by the controller only."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.acls = True
        """False once the file system refused an ACL: job directories are then 0755."""

    def ensure(self) -> None:
        """Create the spool (mode 0711) if missing; refuse one the controller cannot own."""
        self.root.mkdir(mode=0o711, parents=True, exist_ok=True)
        st = self.root.lstat()
        if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
            raise HpcorchError(f"spool {self.root} is not a directory")
        if st.st_uid != os.geteuid():
            raise HpcorchError(
                f"spool {self.root} belongs to uid {st.st_uid}, not to the controller's "
                f"user (uid {os.geteuid()}): give it to that user or choose another --spool"
            )
        if st.st_mode & 0o022:
            raise HpcorchError(
                f"spool {self.root} is writable by others (mode {st.st_mode & 0o7777:o}): "
                "make it 0711"
            )
        os.chmod(self.root, 0o711)

    def path(self, slurm_id: int) -> Path:
        return self.root / str(slurm_id) / PLAN_FILE

    def write_plan(self, slurm_id: int, plan: LaunchPlan, uid: int) -> None:
        """Write the plan atomically where the job's owner (``uid``) can read it."""
        try:
            root = os.open(self.root, os.O_RDONLY | _DIR_FLAGS)
        except FileNotFoundError:  # removed while the controller ran: made again
            self.ensure()
            root = os.open(self.root, os.O_RDONLY | _DIR_FLAGS)
        try:
            job = self._job_dir(root, slurm_id, uid)
            try:
                self._write(job, plan, uid)
            finally:
                os.close(job)
        finally:
            os.close(root)

    def _job_dir(self, root: int, slurm_id: int, uid: int) -> int:
        name = str(int(slurm_id))
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=root)
        fd = os.open(name, os.O_RDONLY | _DIR_FLAGS, dir_fd=root)
        st = os.fstat(fd)
        if st.st_uid != os.geteuid():
            os.close(fd)
            raise HpcorchError(f"{self.root / name} does not belong to the controller")
        self._grant(fd, uid, directory=True)
        return fd

    def _grant(self, fd: int, uid: int, directory: bool) -> None:
        """Let ``uid`` read (and enter) ``fd``: an ACL entry, else read for everyone."""
        rx = 0o5 if directory else 0o4
        mode = 0o750 if directory else 0o640
        if uid < 0 or uid == os.geteuid():
            os.fchmod(fd, mode if uid >= 0 else mode | rx)
            return
        if self.acls:
            try:
                os.fchmod(fd, mode)
                os.setxattr(fd, _ACL_ACCESS, posix_acl(mode >> 6, rx, uid, rx, 0))
                return
            except OSError as exc:
                if exc.errno not in (errno.ENOTSUP, errno.EOPNOTSUPP, errno.EINVAL):
                    raise
                self.acls = False
        os.fchmod(fd, mode | rx)

    def _write(self, job: int, plan: LaunchPlan, uid: int) -> None:
        tmp = PLAN_FILE + TMP_SUFFIX
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        fd = os.open(tmp, flags, 0o600, dir_fd=job)
        try:
            data = (plan.to_json() + "\n").encode()
            if os.write(fd, data) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            os.fsync(fd)
            self._grant(fd, uid, directory=False)
        finally:
            os.close(fd)
        os.rename(tmp, PLAN_FILE, src_dir_fd=job, dst_dir_fd=job)

    def withdraw(self, slurm_id: int) -> None:
        """Remove the job's plan: a launch Slurm makes before the controller writes the next
        one finds none, and runs nothing (the wrapper's EXIT_UNPLANNED)."""
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            os.unlink(self.path(int(slurm_id)))

    def discard_except(self, live: Iterable[int]) -> list[int]:
        """Remove the directories of jobs not in ``live`` (gone from Slurm); their ids."""
        keep = {str(i) for i in live}
        removed = []
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        for name in names:
            if name.isascii() and name.isdigit() and name not in keep:
                shutil.rmtree(self.root / name, ignore_errors=True)
                removed.append(int(name))
        return removed


def _open_plain(path: str) -> int:
    """Open ``path`` for reading without following any symbolic link on the way, without
    opening anything but a regular file, and without blocking."""
    parts = [p for p in path.split("/") if p]
    if not path.startswith("/") or not parts or ".." in parts:
        raise UnsafeFile(f"{path} is not an absolute plain path")
    d = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in parts[:-1]:
            nd = os.open(name, os.O_PATH | _DIR_FLAGS, dir_fd=d)
            os.close(d)
            d = nd
        st = os.stat(parts[-1], dir_fd=d, follow_symlinks=False)
        if stat.S_ISLNK(st.st_mode):
            raise UnsafeFile(f"{path} is a symbolic link")
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeFile(f"{path} is not a regular file")
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
        fd = os.open(parts[-1], flags, dir_fd=d)
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            raise UnsafeFile(f"{path}: a component is a symbolic link or not a directory") from exc
        raise
    finally:
        os.close(d)
    again = os.fstat(fd)
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):
        os.close(fd)
        raise Replaced(f"{path} was replaced while being opened")
    return fd


def read_lines(path: str, offset: int, uid: int) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects on the whole lines of a job's file from ``offset``, and the offset
    to continue from. The file must be a regular file owned by ``uid``; a missing one has
    no lines. At most ``MAX_READ`` bytes are read; longer or malformed lines are skipped.
    A file shorter than ``offset`` was rotated (hpcorch/metrics_file.py): the rest of the
    rotated file (``path`` + ``.1``, at most ``MAX_READ`` bytes of it) comes first, then the
    new file from its start; or truncated: it is read again from its start."""
    fd = _open_owned(path, uid)
    if fd is None:
        return [], offset
    try:
        st = os.fstat(fd)
        rest = b""
        if st.st_size < offset:  # rotated or truncated: read it again from its start
            rest = _rotated_rest(path + ROTATED_SUFFIX, offset, uid, st)
            offset = 0
        data = os.pread(fd, MAX_READ, offset)
    finally:
        os.close(fd)
    end = data.rfind(b"\n") + 1  # only whole lines; a partial last line waits
    if end == 0 and len(data) == MAX_READ:
        return _parse(rest), offset + len(data)  # one line longer than a whole read: skipped
    return _parse(rest + data[:end]), offset + end


def _open_owned(path: str, uid: int) -> int | None:
    """``path`` opened as :func:`_open_plain` does (again if it was replaced meanwhile: a
    rotation), if it belongs to ``uid``; None when it does not exist."""
    for attempt in range(3):
        try:
            fd = _open_plain(path)
            break
        except FileNotFoundError:
            return None
        except PermissionError as exc:
            raise UnsafeFile(f"{path}: {exc.strerror}") from exc
        except Replaced:
            if attempt == 2:
                raise
    st = os.fstat(fd)
    if uid < 0 or st.st_uid != uid:
        os.close(fd)
        raise UnsafeFile(f"{path} belongs to uid {st.st_uid}, not to the job's owner")
    return fd


def _rotated_rest(path: str, offset: int, uid: int, current: os.stat_result) -> bytes:
    """The whole lines of the rotated file after ``offset``, at most ``MAX_READ`` bytes of
    them; b"" when it is not the file read so far (shorter than the offset, or the current
    file itself, rotated since it was opened)."""
    try:
        fd = _open_owned(path, uid)
    except (OSError, UnsafeFile):
        return b""
    if fd is None:
        return b""
    try:
        st = os.fstat(fd)
        if st.st_size < offset or (st.st_dev, st.st_ino) == (current.st_dev, current.st_ino):
            return b""
        data = os.pread(fd, MAX_READ, offset)
    finally:
        os.close(fd)
    return data[: data.rfind(b"\n") + 1]


def _parse(data: bytes) -> list[dict[str, Any]]:
    lines: list[dict[str, Any]] = []
    for raw in data.splitlines():
        if len(raw) > MAX_LINE:
            continue
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(doc, dict):
            lines.append(doc)
    return lines
