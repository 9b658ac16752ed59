"""The pool's lease (hpcorch/controller/lease.py) against a scheduler in miniature: one
controller acts, a second stands by and takes over when the first is gone, never while it
lives. The real thing, two controllers on one reservation on the real pool:
tests/integration/test_contract.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from hpcorch.cluster import LeaseJob
from hpcorch.controller.lease import Lease, LeaseLost, parse_note
from hpcorch.errors import SlurmUnavailable


@dataclass
class Queue:
    """Slurm's queue as far as the lease sees it."""

    jobs: dict[int, LeaseJob] = field(default_factory=dict)
    next_id: int = 100
    down: bool = False
    calls: int = 0

    def lease_jobs(self) -> list[LeaseJob]:
        self.calls += 1
        if self.down:
            raise SlurmUnavailable("Slurm is not reachable")
        return list(self.jobs.values())

    def create_lease(self, comment: str) -> int:
        self.calls += 1
        self.next_id += 1
        self.jobs[self.next_id] = LeaseJob(self.next_id, 990, comment)
        return self.next_id

    def write_lease(self, slurm_id: int, comment: str) -> None:
        self.calls += 1
        self.jobs[slurm_id] = LeaseJob(slurm_id, 990, comment)

    def drop_lease(self, slurm_id: int) -> None:
        self.calls += 1
        self.jobs.pop(slurm_id, None)


@dataclass
class Clock:
    t: float = 0.0

    def __call__(self) -> float:
        return self.t


def lease(q: Queue, clock: Clock, host: str, pid: int, alive: bool = True) -> Lease:
    return Lease(q, 60.0, 990, host, pid, clock, clock, lambda _pid: alive)


def test_one_controller_acts_the_other_stands_by_while_it_lives() -> None:
    q, clock = Queue(), Clock()
    a, b = lease(q, clock, "login1", 11), lease(q, clock, "login2", 22)
    assert a.try_acquire() and a.held
    for _ in range(40):  # ten minutes of cycles, 15 s apart: a renews, b keeps standing by
        clock.t += 15
        a.check(q.lease_jobs())
        assert not b.try_acquire()
    note = parse_note(q.jobs[a.job_id].comment)
    assert note is not None and note.owner == "login1:11" and note.seq > 30
    assert len(q.jobs) == 1
    assert "login1:11" in b.describe_holder()


def test_the_standby_takes_over_when_the_holder_stops_renewing_and_the_old_one_stops() -> None:
    q, clock = Queue(), Clock()
    a, b = lease(q, clock, "login1", 11), lease(q, clock, "login2", 22)
    assert a.try_acquire()
    assert not b.try_acquire()
    clock.t += 59
    assert not b.try_acquire()  # not yet a whole time to live without a renewal
    clock.t += 2
    assert b.try_acquire() and b.job_id == a.job_id  # the same lease job, now b's
    with pytest.raises(LeaseLost, match="login2:22"):
        a.check(q.lease_jobs())  # a comes back (its host was only hung): it must not act
    b.check(q.lease_jobs())


def test_a_holder_that_died_on_this_host_is_taken_over_at_once() -> None:
    q, clock = Queue(), Clock()
    a = lease(q, clock, "login1", 11)
    assert a.try_acquire()
    b = lease(q, clock, "login1", 22, alive=False)  # kill -9'd, restarted on the same host
    assert b.try_acquire()


def test_a_clean_exit_hands_the_lease_on_at_the_next_look() -> None:
    q, clock = Queue(), Clock()
    a, b = lease(q, clock, "login1", 11), lease(q, clock, "login2", 22)
    assert a.try_acquire()
    assert not b.try_acquire()
    a.release()
    assert not q.jobs and b.try_acquire()


def test_two_controllers_starting_at_once_agree_on_the_oldest_lease() -> None:
    q, clock = Queue(), Clock()
    a, b = lease(q, clock, "login1", 11), lease(q, clock, "login2", 22)
    # both see no lease and make one before either reads back
    a.seq += 1
    a.job_id = q.create_lease(a._note().render())
    b.seq += 1
    b.job_id = q.create_lease(b._note().render())
    assert a._settle() and not b._settle()
    assert list(q.jobs) == [a.job_id]  # b's own was cancelled
    with pytest.raises(LeaseLost):
        b.check(q.lease_jobs())


def test_an_unreachable_slurmctld_is_no_sign_of_a_dead_holder() -> None:
    """slurmctld stopped for longer than the time to live: neither controller can act or
    see anything; when it answers again the holder renews at its next cycle, and the
    standby, which starts counting afresh, does not take over."""
    q, clock = Queue(), Clock()
    a, b = lease(q, clock, "login1", 11), lease(q, clock, "login2", 22)
    assert a.try_acquire()
    assert not b.try_acquire()
    q.down = True
    for _ in range(10):
        clock.t += 15
        with pytest.raises(SlurmUnavailable):
            b.try_acquire()
    q.down = False
    assert not b.try_acquire()  # the first look after: a fresh count
    clock.t += 10
    a.check(q.lease_jobs())  # the holder's next cycle renews
    clock.t += 55
    assert not b.try_acquire()


def test_a_lease_job_of_another_account_is_ignored() -> None:
    """A user cannot stop the pool by submitting a job whose comment looks like a lease."""
    q, clock = Queue(), Clock()
    forged = "hpcorch-lease:owner=evil:1,token=abc,seq=1,beat=0"
    q.jobs[1] = LeaseJob(1, 1001, forged)
    a = lease(q, clock, "login1", 11)
    assert a.try_acquire() and a.job_id != 1
    a.check(q.lease_jobs())


def test_a_lease_job_cancelled_by_an_admin_is_made_again() -> None:
    q, clock = Queue(), Clock()
    a = lease(q, clock, "login1", 11)
    assert a.try_acquire()
    q.jobs.clear()
    a.check(q.lease_jobs())
    assert len(q.jobs) == 1 and a.held


def test_notes_that_are_not_leases_are_not_parsed() -> None:
    assert parse_note("hpcorch:id=x,min=1") is None
    assert parse_note("hpcorch-lease:owner=a:1,token=x y,seq=1") is None
    assert parse_note("hpcorch-lease:owner=a:1,token=ab,seq=-1") is None
    note = parse_note("hpcorch-lease:owner=login1:11,token=ab12,seq=7,beat=123")
    assert note is not None and (note.host, note.pid, note.seq) == ("login1", 11, 7)


def test_a_holder_back_from_a_hang_mid_observation_does_not_renew_a_lost_lease() -> None:
    """The holder was stopped (SIGSTOP) after its squeue and before its check: the lease
    jobs it observed still name it, but the standby took the lease over meanwhile. It reads
    them again and stops; it never writes its note over the new holder's."""
    q, clock = Queue(), Clock()
    a, b = lease(q, clock, "login1", 1), lease(q, clock, "login2", 2)
    assert a.try_acquire()
    observed_at = clock.t
    stale = q.lease_jobs()  # a's observation, then a hangs
    assert not b.try_acquire()
    for _ in range(6):  # a's seq does not move for a whole ttl of b's looks
        clock.t += 15
        b.try_acquire()
    assert b.held
    with pytest.raises(LeaseLost):
        a.check(stale, observed_at)
    (job,) = q.jobs.values()
    assert parse_note(job.comment) is not None and parse_note(job.comment).token == b.token  # type: ignore[union-attr]
