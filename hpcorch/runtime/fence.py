"""Launch fencing: only the newest launch of a job writes into its directory.

When a node dies, Slurm requeues the job and it starts again elsewhere while the old
launch's ranks may still run on the dead node, cut off from Slurm. Both would write the
same checkpoints and metrics. The job wrapper therefore records, before it starts the
tasks, which launch owns the directory: ``<job dir>/launch`` holds ``<slurm job id>
<launch>`` (the launch is ``SLURM_RESTART_COUNT``), written under an exclusive ``flock``.
The runtime writes only under a shared lock of the same file, after checking that it is
still the owner: an old launch's write either finished before the new launch took over, or
never happens. A launch that finds itself superseded stops without writing anything more
(exit code ``EXIT_LAUNCH_LOST``).
"""

from __future__ import annotations

import errno
import fcntl
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from hpcorch.protocol import EXIT_LAUNCH_LOST, EXIT_STORAGE, LAUNCH_FILE


class Superseded(RuntimeError):
    """A newer launch of this job (or another job) owns the job directory."""


def read_owner(text: str) -> tuple[str, int] | None:
    """``"<job id> <launch>"`` -> (job id, launch); None when it is not that."""
    parts = text.split()
    if len(parts) != 2 or not parts[1].isascii() or not parts[1].isdigit():
        return None
    return parts[0], int(parts[1])


class Fence:
    """This launch's claim on the job directory. ``job`` and ``launch`` come from the
    wrapper (SLURM_JOB_ID, HPCORCH_LAUNCH); without them (a script started by hand)
    nothing is fenced."""

    def __init__(self, job_dir: Path, job: str | None, launch: int | None) -> None:
        self.path = job_dir / LAUNCH_FILE
        self.job = job
        self.launch = launch
        self.owner: tuple[str, int] | None = None
        """The owner found by the last check that failed."""

    @property
    def active(self) -> bool:
        return self.job is not None and self.launch is not None

    def describe(self) -> str:
        if self.owner is None:
            return f"the job directory's owner record {self.path} is unreadable"
        job, launch = self.owner  # launches counted from 0 here, from 1 in messages
        mine = self.launch + 1 if self.launch is not None else "?"
        if job == self.job:
            return f"launch {launch + 1} of job {job} took over (this is launch {mine})"
        return f"job {job} (launch {launch + 1}) took over the job directory"

    @contextmanager
    def hold(self) -> Iterator[None]:
        """While held, this launch owns the directory and no newer launch can take it over;
        raises :class:`Superseded` when it no longer owns it. Not fenced: a no-op."""
        if not self.active:
            yield
            return
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except FileNotFoundError:
            yield  # no wrapper claimed it (an old wrapper, or a copied job directory)
            return
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self.owner = None
                raise Superseded(self.describe()) from None
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            owner = read_owner(os.read(fd, 256).decode("ascii", "replace"))
            if owner != (self.job, self.launch):
                self.owner = owner
                raise Superseded(self.describe())
            yield
        finally:
            os.close(fd)  # releases the lock

    def check(self) -> None:
        """Raise :class:`Superseded` unless this launch still owns the directory."""
        with self.hold():
            pass


class Gate:
    """Every write of a launch into its job directory goes through ``write``: under the
    fence, and with a failing disk turned into one reason instead of a traceback. After the
    first failure nothing more is written; ``failure`` holds (exit code, message) for the
    job to stop every rank with at its next step boundary."""

    def __init__(self, fence: Fence | None = None) -> None:
        self.fence = fence
        self.failure: tuple[int, str] | None = None

    def write(self, path: Path, fn: Callable[[], object]) -> bool:
        """Run ``fn`` (which writes ``path``) unless this launch is superseded or failed."""
        if self.failure is not None:
            return False
        try:
            if self.fence is None:
                fn()
            else:
                with self.fence.hold():
                    fn()
            return True
        except Superseded as exc:
            self.failure = (
                EXIT_LAUNCH_LOST,
                f"this launch is superseded: {exc}; it stops without writing anything more",
            )
        except OSError as exc:
            self.failure = (EXIT_STORAGE, storage_message(exc, path))
        return False

    def check(self) -> None:
        """Note a takeover now (without writing)."""
        self.write(self.fence.path if self.fence else Path("."), lambda: None)


def storage_message(exc: OSError, path: Path) -> str:
    """One line for a write that failed: which file, why, what it means."""
    why = exc.strerror or type(exc).__name__
    hint = {
        errno.ENOSPC: "the filesystem of the job directory is full",
        errno.EDQUOT: "the disk quota of the job directory is exhausted",
        errno.EROFS: "the job directory is on a read-only filesystem",
        errno.EACCES: "the job directory is not writable by this user",
        errno.EPERM: "the job directory is not writable by this user",
    }.get(exc.errno or 0, "the job directory cannot be written")
    return f"cannot write {exc.filename or path}: {why} ({hint})"
