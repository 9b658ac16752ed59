"""One controller acts on a pool, whatever host it runs on: a lease kept in Slurm itself.

The lease is a placeholder job in the pool's reservation: held, never run, owned by the
controllers' account, its comment ``hpcorch-lease:owner=HOST:PID,token=T,seq=N,beat=UNIX``
(and ``pool=NAME``: where the reservation does not admit the controller's account, a site's
reservation for its users only, the job is outside it and the comment names the pool).
Every login node sees it in the one ``squeue`` a cycle already makes, slurmctld keeps it
across its own restarts, and only its owner (or an operator) may change it. The holder
renews it (``seq`` + 1, one ``scontrol update``) every quarter of the lease's time to live;
before every cycle's actions it checks that the lease still names its token, and stops for
good if another controller has taken it over (:class:`LeaseLost`).

A controller that finds the lease held stands by. It takes the lease over when the
holder's ``seq`` has not moved for a whole time to live of its own successful observations
(a failed observation starts the count again: a slurmctld that was unreachable is no sign
of a dead holder), at once when the holder said it left (its lease job ended), or when the
holder ran on this host under a process id that no longer exists. The oldest live lease
job (lowest job id) is the lease: two controllers that create one at the same moment agree
on which counts, and the other is cancelled.

Staleness is judged by change of ``seq`` on the observer's own monotonic clock, never by
comparing the holder's ``beat`` time with the observer's: login nodes' clocks may differ.
"""

from __future__ import annotations

import errno
import os
import secrets
import socket
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from hpcorch.cluster import LEASE_TAG, LeaseJob
from hpcorch.errors import HpcorchError

DEFAULT_TTL_S = 60.0


class LeaseLost(HpcorchError):
    """Another controller holds the pool's lease: this one must not act."""


@dataclass(frozen=True)
class Note:
    """What a lease job's comment says."""

    owner: str
    """``HOST:PID`` of the controller that holds it."""
    token: str
    """Random, new for every controller process: whose lease it is."""
    seq: int
    """Renewals so far: a holder that is alive makes it move."""
    beat: float = 0.0
    """The holder's wall-clock time at its last renewal (shown, never compared)."""

    def render(self) -> str:
        return (
            f"{LEASE_TAG}owner={self.owner},token={self.token},seq={self.seq},beat={self.beat:.0f}"
        )

    @property
    def host(self) -> str:
        return self.owner.rpartition(":")[0]

    @property
    def pid(self) -> int:
        pid = self.owner.rpartition(":")[2]
        return int(pid) if pid.isdigit() else -1


def parse_note(comment: str) -> Note | None:
    """The lease note in a comment; None if it is not one (or not well formed)."""
    if not comment.startswith(LEASE_TAG):
        return None
    fields = dict(f.partition("=")[::2] for f in comment[len(LEASE_TAG) :].split(","))
    owner, token, seq = fields.get("owner", ""), fields.get("token", ""), fields.get("seq", "")
    if not owner or not token.isalnum() or not seq.isdigit() or len(comment) > 300:
        return None
    try:
        beat = float(fields.get("beat", "0"))
    except ValueError:
        beat = 0.0
    return Note(owner=owner, token=token, seq=int(seq), beat=beat)


class LeaseIO(Protocol):
    """What the lease needs of the scheduler (the Slurm side: hpcorch/slurm/cluster.py)."""

    def lease_jobs(self) -> list[LeaseJob]:
        """The pool's lease jobs (live or just ended), one Slurm call."""
        ...

    def create_lease(self, comment: str) -> int:
        """A new held placeholder job in the pool carrying ``comment``; its id."""
        ...

    def write_lease(self, slurm_id: int, comment: str) -> None: ...
    def drop_lease(self, slurm_id: int) -> None: ...


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists on this host."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM  # exists, someone else's
    return True


class Lease:
    """This controller's claim on the pool (see the module's docstring)."""

    def __init__(
        self,
        io: LeaseIO,
        ttl_s: float = DEFAULT_TTL_S,
        uid: int | None = None,
        host: str | None = None,
        pid: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        alive: Callable[[int], bool] = pid_alive,
    ) -> None:
        self.io = io
        self.ttl_s = ttl_s
        self.uid = os.geteuid() if uid is None else uid
        self.host = host or socket.gethostname()
        self.pid = os.getpid() if pid is None else pid
        self.clock = clock
        self.wall = wall
        self.alive = alive
        self.token = secrets.token_hex(8)
        self.job_id = 0
        """The lease job this controller holds (0: none yet)."""
        self.seq = 0
        self.renewed_at = -1e18
        """When (``clock``) the lease was last written by this controller."""
        self.holder: Note | None = None
        """The other controller's note while this one stands by."""
        self._seen: tuple[str, int] | None = None
        self._seen_since = 0.0

    @property
    def held(self) -> bool:
        return self.job_id > 0

    def _note(self) -> Note:
        return Note(f"{self.host}:{self.pid}", self.token, self.seq, self.wall())

    def _mine(self, jobs: Sequence[LeaseJob]) -> list[tuple[LeaseJob, Note]]:
        """The live lease jobs of this controller's account, oldest first."""
        found = []
        for j in sorted(jobs, key=lambda j: j.slurm_id):
            note = parse_note(j.comment)
            if note is not None and not j.ended and (j.uid == self.uid or j.uid < 0):
                found.append((j, note))
        return found

    # --- taking the lease -------------------------------------------------------------------
    def try_acquire(self) -> bool:
        """One step of taking the lease (one observation, at most one write); whether this
        controller holds it now. Call it until it does, ``ttl_s / 4`` apart."""
        try:
            jobs = self._mine(self.io.lease_jobs())
        except HpcorchError:
            self._seen = None  # an observation that failed says nothing about the holder
            raise
        if not jobs:
            self.seq += 1
            self.job_id = self.io.create_lease(self._note().render())
            self.renewed_at = self.clock()
            return self._settle()
        (lease, note), *extra = jobs
        if note.token == self.token:
            self.job_id = lease.slurm_id
            for j, n in extra:  # a lease job this controller made at the same moment
                if n.token == self.token:
                    self.io.drop_lease(j.slurm_id)
            return True
        for j, n in extra:
            if n.token == self.token:  # made at the same moment as an older one: it loses
                self.io.drop_lease(j.slurm_id)
                self.job_id = 0
        self.holder = note
        if self._stale(note):
            self.seq = note.seq + 1
            self.io.write_lease(lease.slurm_id, self._note().render())
            self.job_id = lease.slurm_id
            self.renewed_at = self.clock()
            return self._settle()
        return False

    def _settle(self) -> bool:
        """Whether the lease job just written is still this controller's once read back:
        another controller may have written at the same moment (the last write wins)."""
        jobs = self._mine(self.io.lease_jobs())
        if jobs and jobs[0][1].token == self.token:
            self.job_id = jobs[0][0].slurm_id
            self.holder = None
            return True
        for j, n in jobs:  # one this controller made beside an older one: it loses
            if n.token == self.token:
                self.io.drop_lease(j.slurm_id)
        self.job_id = 0
        return False

    def _stale(self, note: Note) -> bool:
        """Whether the holder is gone: its seq has not moved for ``ttl_s`` of this
        controller's observations, or it ran on this host as a process that has ended."""
        now = self.clock()
        if note.host == self.host and not self.alive(note.pid):
            return True
        key = (note.token, note.seq)
        if self._seen != key:
            self._seen, self._seen_since = key, now
            return False
        return now - self._seen_since >= self.ttl_s

    # --- holding it -------------------------------------------------------------------------
    def check(self, jobs: Sequence[LeaseJob], observed_at: float | None = None) -> None:
        """Before a cycle acts: raise :class:`LeaseLost` unless the pool's lease (in
        ``jobs``, the cycle's observation, begun at ``observed_at`` on :attr:`clock`) is
        this controller's; renew it when due, and make a new one if it is gone (an admin
        cancelled it). An observation that took longer than a quarter of the time to live
        (this process was stopped, or Slurm answered slowly, in the middle of it) may be
        older than a takeover: the lease jobs are read again first, so that a controller
        back from a hang never renews, over the new holder's note, a lease it lost."""
        if observed_at is not None and self.clock() - observed_at > self.ttl_s / 4:
            jobs = self.io.lease_jobs()
        live = self._mine(jobs)
        if live and live[0][1].token != self.token:
            theirs = live[0][1]
            self.job_id = 0
            raise LeaseLost(
                f"another controller ({theirs.owner}) took over the pool's lease (job "
                f"{live[0][0].slurm_id}): this one stops acting"
            )
        if not live:
            self.job_id = 0
            self.seq += 1
            self.job_id = self.io.create_lease(self._note().render())
            self.renewed_at = self.clock()
            return
        self.job_id = live[0][0].slurm_id
        if self.clock() - self.renewed_at >= self.ttl_s / 4:
            self.renew()

    def renew(self) -> None:
        self.seq += 1
        self.io.write_lease(self.job_id, self._note().render())
        self.renewed_at = self.clock()

    def release(self) -> None:
        """Give the lease up (a clean exit): a standby takes over at its next look."""
        if self.job_id:
            job, self.job_id = self.job_id, 0
            self.io.drop_lease(job)

    def describe_holder(self) -> str:
        h = self.holder
        if h is None:
            return "another controller"
        since = f", last renewed {max(0.0, self.wall() - h.beat):.0f} s ago" if h.beat else ""
        return f"the controller on {h.owner}{since}"
