"""An overloaded slurmctld, on the fake cluster: one that does not answer (stopped,
restarting), one that answers with an error in place of its list, one that answers
slowly. The controller keeps its state, asks Slurm with one cheap request while it does
not answer (no pile of heavy queries for it when it comes back), acts on no stale view (a
request Slurm may have carried out without answering is read from Slurm, never counted as
the job's failure, never redone blindly), and says when an outage begins and when it ends.
The same on the real pool: tests/integration/test_slurm_stall.py."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from hpcorch.cluster import Observation, Shape
from hpcorch.controller.loop import Controller
from hpcorch.controller.service import serve
from hpcorch.controller.store import Store
from hpcorch.errors import SlurmCommandError, SlurmTimeout, SlurmUnavailable
from hpcorch.policy.share import SharePolicy
from hpcorch.slurm.backend import SlurmCLI
from tests.test_controller_logic import CFG, FakeCluster

DOWN = SlurmUnavailable("Slurm is not reachable (squeue: Socket timed out on send/recv)")


@dataclass
class Stalling(FakeCluster):
    """A fake Slurm that stops answering when told; ``ghost``: a start sent while it did
    not answer is carried out once it answers again (slurmctld reads the request late)."""

    observes: int = 0
    pings: int = 0
    fail_starts: int = 0
    ghost: bool = False

    def observe(self) -> Observation:
        self.observes += 1
        if not self.answers:
            raise DOWN
        return super().observe()

    def ping(self) -> None:
        self.pings += 1
        if not self.answers:
            self.longest = max(self.longest, 10.0)  # a ping times out: not a slow cycle
        super().ping()

    def start(self, slurm_id: int, shape: Shape) -> None:
        if self.fail_starts:
            self.fail_starts -= 1
            if self.ghost:
                super().start(slurm_id, shape)
                self.log.pop()  # what it logged: the start is said below
            self.log.append(("start unanswered", slurm_id))
            raise DOWN
        super().start(slurm_id, shape)


def make(tmp_path: Path, c: FakeCluster, **settings: Any) -> tuple[Controller, list[str]]:
    lines: list[str] = []
    cfg = replace(CFG, interval_s=10, settings=replace(CFG.settings, **settings))
    return Controller(c, Store(tmp_path / "state.db"), SharePolicy(), cfg, log=lines.append), lines


def run_for(ctl: Controller, c: FakeCluster, seconds: float, down: tuple[float, float]) -> None:
    """serve() for ``seconds`` of the fake clock; Slurm does not answer in ``down``."""
    end = c.t + seconds
    start, stop = c.t + down[0], c.t + down[1]

    def sleep(s: float) -> None:
        c.t += max(s, 0.01)
        c.answers = not start <= c.t < stop

    serve(ctl, lambda: c.t >= end, sleep)


def test_json_errors_in_place_of_the_list_are_slurm_not_answering() -> None:
    """Slurm 22.05's squeue --json and sinfo --json exit 0 with an empty list and an
    error when slurmctld does not answer: never read as "no jobs" (every job lost)."""
    cli = SlurmCLI(env={"PATH": "/usr/bin"})
    doc = (
        '{"meta": {}, "errors": [{"description": "Failed while looking for jobs", '
        '"error_number": -1, "error": "Unspecified error", "source": "slurm_load_jobs"}], '
        '"jobs": []}'
    )
    cli.run = lambda argv, stdin=None, env=None: doc  # type: ignore[method-assign]
    with pytest.raises(SlurmUnavailable, match="slurm_load_jobs"):
        cli.jobs()
    cli.run = lambda argv, stdin=None, env=None: doc.replace("jobs", "nodes")  # type: ignore[method-assign]
    with pytest.raises(SlurmUnavailable):
        cli.nodes()


def test_an_outage_is_said_twice_and_slurm_is_only_pinged_meanwhile(tmp_path: Path) -> None:
    c = Stalling()
    c.add(1, 1, 8)
    ctl, lines = make(tmp_path, c)
    ctl.cycle()
    run_for(ctl, c, 300, down=(5, 125))
    assert c.state(1) == "RUNNING" and ctl.store.job(1).phase == "running"  # type: ignore[union-attr]
    said = [ln for ln in lines if "Slurm" in ln or "cycle failed" in ln]
    assert len(said) == 2, said
    assert said[0].startswith("Slurm does not answer") and "every 10 s" in said[0]
    assert said[1].startswith("Slurm answers again after 1") and "look(s)" in said[1]
    # one failed cycle found the outage; then one ping every 10 s, never the heavy queries
    assert 10 <= c.pings <= 14, c.pings
    observes_down = c.observes  # (counted over the whole run: every cycle but the outage's)
    assert observes_down <= 300 / 10 + 2


def test_the_outage_does_not_count_against_a_stopping_jobs_grace(tmp_path: Path) -> None:
    c = Stalling()
    c.add(1, 1, 8)
    ctl, lines = make(tmp_path, c, grace_s=60)
    ctl.cycle()
    c.jobs[1].exit_on_signal = False  # it checkpoints slowly
    c.add(2, 4, 4)
    ctl.cycle()  # job 1 signalled to give half its GPUs to job 2
    assert ("signal", 1) in c.log
    run_for(ctl, c, 150, down=(1, 120))  # longer than its grace
    assert ("requeue_hold", 1) not in c.log, lines
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "stopping" and rec.forced_at == 0
    assert c.t - rec.phase_since < 60  # its grace counts from the signal, less the outage


@pytest.mark.parametrize("ghost", [False, True], ids=["not-done", "done-late"])
def test_a_start_slurm_did_not_answer_is_read_from_slurm(tmp_path: Path, ghost: bool) -> None:
    """The first of two starts is sent but not answered (slurmctld stopped under it): the
    second is not sent; neither counts as a failed start. Slurm's next answer says whether
    the first happened (``done-late``: it runs, and is not started again) or not (it is
    held: started again, once)."""
    c = Stalling(fail_starts=1, ghost=ghost)
    c.add(1, 4, 4)
    c.add(2, 4, 4)
    ctl, _ = make(tmp_path, c)
    with pytest.raises(SlurmUnavailable):
        ctl.cycle()
    assert [k for k, _ in c.log] == ["start unanswered"]  # the second start was not sent
    statuses = [d.status for d in ctl.store.decisions()]
    assert statuses[0].startswith("unknown: Slurm did not answer")
    assert statuses[1] == "not sent: Slurm did not answer"
    for i in (1, 2):
        rec = ctl.store.job(i)
        assert rec is not None and rec.phase == "starting" and rec.start_failures == 0
    ctl.cycle()
    first = c.log[1:]
    assert ("start", 2) in first and first.count(("start", 1)) == (0 if ghost else 1), first
    assert ("requeue_hold", 1) not in first  # never taken for a launch Slurm made alone
    ctl.cycle()
    for i in (1, 2):
        rec = ctl.store.job(i)
        assert rec is not None and rec.phase == "running" and rec.launches == 1


@pytest.mark.parametrize(
    ("seconds", "longest", "said_first"),
    [
        (8.0, 4.0, "4.0 s each"),  # two calls of 4 s
        # slurmctld running a moment in every few seconds answers the calls that reach it
        # in one moment at once and the others after its pause: the average call looks
        # prompt, the longest does not
        (5.0, 4.9, "the longest 4.9 s"),
    ],
)
def test_slow_answers_are_said_when_they_begin_and_end(
    tmp_path: Path, seconds: float, longest: float, said_first: str
) -> None:
    c = Stalling()
    c.add(1, 1, 8)
    ctl, lines = make(tmp_path, c)
    plain = c.observe

    def slow_observe() -> Observation:
        slow = 20 <= c.t - t0 < 80
        c.call_seconds += seconds if slow else 0.0
        c.longest = longest if slow else 0.1
        return plain()

    c.observe = slow_observe  # type: ignore[method-assign]
    t0 = c.t
    run_for(ctl, c, 150, down=(0, 0))
    said = [ln for ln in lines if "Slurm answers" in ln]
    assert len(said) == 2, lines
    assert said[0].startswith("Slurm answers slowly") and said_first in said[0]
    assert said[1].startswith("Slurm answers promptly again after")


def test_a_job_slurm_shows_completing_may_or_may_not_hold_its_gpus() -> None:
    """After slurmctld was stopped, a job that ended meanwhile was shown completing on one
    of its two nodes for 43 s, its GPUs already free in Slurm's view of that node: no
    difference of views (and the job's shape is not cut to the nodes still completing)."""
    from hpcorch.cluster import ObservedJob, PoolNode
    from hpcorch.controller.guard import PoolGuard
    from hpcorch.controller.reconcile import Settings, observe
    from hpcorch.controller.store import JobRecord

    said: list[str] = []
    guard = PoolGuard(said.append)
    job = JobRecord(
        90, "k", "a", "u", "/d", "", 1, 16, 32, 32, 32, 0.0, "running", 0.0,
        gpus=16, nodes=2, node_list="n5,n8", node_gpus="8,8", ready=1,
    )  # fmt: skip
    seen = ObservedJob(90, "a", "u", "COMPLETING", False, "", ("n5",), 8, 0, 0, 0.0, 0.0, {})
    observe(job, seen, 100.0, ("n5", "n8"), Settings())
    assert (job.gpus, job.node_list) == (16, "n5,n8")
    freed = [PoolNode("n5", 8, 0, True), PoolNode("n8", 8, 0, True)]
    held = [PoolNode("n5", 8, 8, True), PoolNode("n8", 8, 8, True)]
    for t in range(100, 160, 5):
        guard.gpu_view(freed if t % 2 else held, [job], float(t), completing={90})
    assert guard.view_mismatches == 0 and not said
    for t in range(160, 180, 5):
        guard.gpu_view(freed, [job], float(t))  # it runs: its GPUs are in use
    assert guard.view_mismatches > 0


@pytest.mark.parametrize("up", [True, False])
def test_a_command_that_outlasts_its_timeout_is_slurm_down_only_if_ping_says_so(
    tmp_path: Path, up: bool
) -> None:
    """scancel retries a job in a transition ("Job can not be altered now, try again
    later") for up to 95 s: seen on the real pool after slurmctld came back. Such a
    command failed; slurmctld, which answers a ping, is not down."""

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scancel").write_text("#!/bin/sh\nsleep 10\n")
    state = "UP" if up else "DOWN"
    ping = f"#!/bin/sh\necho 'Slurmctld(primary) at vm is {state}'\n[ {state} = UP ]\n"
    (bin_dir / "scontrol").write_text(ping)
    for f in bin_dir.iterdir():
        f.chmod(0o755)
    cli = SlurmCLI(timeout=1.0, env={"PATH": f"{bin_dir}:/usr/bin:/bin"})
    want = SlurmTimeout if up else SlurmUnavailable
    with pytest.raises(want, match="scancel did not"):
        cli.cancel(7, signal="USR2", batch_only=True)


def test_a_cycle_whose_command_kept_waiting_is_a_slow_spell_not_a_failure(
    tmp_path: Path,
) -> None:
    """A slurmctld that runs a moment in every ten seconds answers a ping, yet a cycle's
    squeue may wait past its timeout (CI's stall test, under six lanes at once): said once
    as slowness, retried every interval (no doubling back-off), and its end said."""
    c = Stalling()
    c.add(1, 1, 8)
    ctl, lines = make(tmp_path, c)
    plain = c.observe
    t0 = c.t
    sleeps: list[float] = []

    def observe() -> Observation:
        if 20 <= c.t - t0 < 80:
            raise SlurmTimeout("squeue did not finish within 30 s (slurmctld answers: ...)")
        c.longest = 0.1
        return plain()

    def sleep(s: float) -> None:
        sleeps.append(s)
        c.t += max(s, 0.01)

    c.observe = observe  # type: ignore[method-assign]
    serve(ctl, lambda: c.t - t0 >= 150, sleep)
    said = [ln for ln in lines if "Slurm answers" in ln or "cycle failed" in ln]
    assert len(said) == 2, lines
    assert said[0].startswith("Slurm answers slowly: squeue did not finish within 30 s")
    assert said[1].startswith("Slurm answers promptly again after")
    assert max(sleeps) <= 10.0  # every interval, not a doubling back-off


@dataclass
class Garbled(Stalling):
    """While slurmctld is stopped, a command fails with an error that does not say so:
    Slurm 22.05's ``scontrol update`` of the lease's job answered "Unexpected message
    received for job 2" during a 30 s SIGSTOP on the real pool."""

    def observe(self) -> Observation:
        self.observes += 1
        if not self.answers:
            raise SlurmCommandError("scontrol failed: Unexpected message received for job 2")
        return FakeCluster.observe(self)


@pytest.mark.parametrize("down", [True, False], ids=["ping-fails", "ping-answers"])
def test_a_failed_cycle_is_an_outage_when_slurm_does_not_answer_a_ping(
    tmp_path: Path, down: bool
) -> None:
    c = Garbled()
    c.add(1, 1, 8)
    ctl, lines = make(tmp_path, c)
    ctl.cycle()
    if down:
        run_for(ctl, c, 200, down=(5, 65))
    else:  # Slurm answers pings: the command itself failed, a cycle failure like any
        end = c.t + 200
        state = {"n": 0}

        def sleep(s: float) -> None:
            c.t += max(s, 0.01)
            state["n"] += 1

        def observe() -> Observation:
            if state["n"] < 3:
                raise SlurmCommandError("scontrol failed: Invalid job id specified")
            return FakeCluster.observe(c)

        c.observe = observe  # type: ignore[method-assign]
        serve(ctl, lambda: c.t >= end, sleep)
    said = [ln for ln in lines if "Slurm" in ln or "cycle failed" in ln]
    if down:
        assert [ln.split(" (")[0] for ln in said] == [
            "Slurm does not answer",
            "Slurm answers again after 60 s",
        ], said
    else:
        assert len(said) == 1 and said[0].startswith("cycle failed, retrying in 10 s"), said
