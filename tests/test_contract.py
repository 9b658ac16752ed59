"""The pool's contract against jobs that break it, on the fake cluster (issue 34): every
preemption completes within its bound, a job that cannot be requeued or is no batch job is
not left holding GPUs, a job that never checkpoints is not relaunched for ever, a launch
that starts again from step 0 says so, and a job moved out of the pool is not "lost".

The same findings on the real pool, as real second users: tests/integration/test_contract.py.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcorch.controller.reconcile import Settings
from hpcorch.errors import SlurmCommandError
from hpcorch.protocol import EXIT_STORAGE
from tests.test_controller_logic import FakeCluster, controller


@dataclass
class ContractCluster(FakeCluster):
    """The fake cluster, with jobs that report what the runtime reports (a start, steps,
    checkpoints), jobs Slurm cannot requeue, and jobs moved out of the reservation."""

    lines: dict[int, list[dict[str, Any]]] = field(default_factory=dict)
    requeue_refused: set[int] = field(default_factory=set)
    elsewhere: dict[int, str] = field(default_factory=dict)

    def report(self, job_id: int, *lines: dict[str, Any]) -> None:
        self.lines.setdefault(job_id, []).extend(lines)

    def read_metrics(
        self, job_dir: str, offset: int, uid: int
    ) -> tuple[Sequence[dict[str, Any]], int]:
        job_id = int(job_dir.rsplit("/", 1)[-1])
        got = self.lines.get(job_id, [])
        return got[offset:], len(got)

    def requeue_hold(self, slurm_id: int) -> None:
        if slurm_id in self.requeue_refused:
            self.log.append(("requeue_hold", slurm_id))
            raise SlurmCommandError("scontrol failed: Requested operation is presently disabled")
        super().requeue_hold(slurm_id)

    def allow_requeue(self, slurm_id: int) -> None:
        self.log.append(("allow_requeue", slurm_id))
        self.set(slurm_id, requeue=True)
        self.requeue_refused.discard(slurm_id)

    def locate(self, slurm_ids: Sequence[int]) -> dict[int, str]:
        return {i: self.elsewhere[i] for i in slurm_ids if i in self.elsewhere}


def started(step: int = 0, resumed: bool = False) -> dict[str, Any]:
    return {"event": "start", "time": 0, "epochs": 1, "step": step, "resumed": resumed}


def steps(step: int) -> dict[str, Any]:
    return {
        "event": "steps",
        "time": 0,
        "step": step,
        "step_time": 0.1,
        "samples_per_s": 640.0,
        "global_batch": 64,
        "per_gpu_batch": 8,
        "accum_steps": 1,
    }


def test_a_preemption_ends_a_job_slurm_cannot_requeue_within_its_bound(tmp_path: Path) -> None:
    """Finding 1: a job that does not checkpoint and that Slurm refuses to requeue (its
    owner set Requeue=0, the controller may not set it back) kept its GPUs for ever: the
    forced requeue failed every 60 s. Now it is ended (scancel) once the preemption bound
    (grace + force_retry_s) has passed, failed with the reason, and its GPUs go on."""
    c = ContractCluster()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c, grace_s=30)
    ctl.cycle()
    ctl.cycle()
    c.jobs[1].exit_on_signal = False
    c.set(1, requeue=False)
    c.requeue_refused.add(1)
    c.allow_requeue = lambda slurm_id: (_ for _ in ()).throw(  # type: ignore[method-assign]
        SlurmCommandError("scontrol failed: Access/permission denied")
    )
    c.add(2, 4, 4)
    ctl.cycle()  # job 2 takes half the pool: job 1 is signalled to shrink
    assert ("signal", 1) in c.log
    c.t += 31
    ctl.cycle()  # past the grace: requeued by force (Slurm refuses)
    assert c.log.count(("requeue_hold", 1)) == 1
    for _ in range(20):
        c.t += 5
        ctl.cycle()
    bound = 30 + Settings().force_retry_s
    assert c.state(1) == "CANCELLED", c.log
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "failed", rec
    assert "contract" in rec.reason and f"{bound:.0f} s" in rec.reason, rec.reason
    ctl.cycle()
    assert c.state(2) == "RUNNING" and c.jobs[2].job.gpus == 4


def test_requeue_0_on_a_pool_job_is_set_back(tmp_path: Path) -> None:
    """Finding 1 where the controller may fix it: a pool job its owner made Requeue=0 is
    made requeueable again (the pool relaunches jobs by requeueing them), once, and said."""
    c = ContractCluster()
    c.add(1, 1, 8)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.set(1, requeue=False)
    ctl.cycle()
    assert c.log.count(("allow_requeue", 1)) == 1
    ctl.cycle()
    assert c.log.count(("allow_requeue", 1)) == 1
    decisions = [d for d in ctl.store.decisions() if d.action == "allow_requeue"]
    assert decisions and "Requeue=0" in decisions[0].detail


def test_an_interactive_allocation_is_refused_and_never_started(tmp_path: Path) -> None:
    """Finding 2: `salloc --hold --reservation=POOL --comment=hpcorch:...` was started as a
    pool job, and could then be neither signalled nor requeued. It is refused instead."""
    c = ContractCluster()
    c.add(1, 1, 4)
    c.set(1, batch=False)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    assert ("start", 1) not in c.log
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "refused", rec
    assert "batch" in rec.reason and "salloc" in rec.reason


def test_a_job_that_never_checkpoints_ends_after_k_launches(tmp_path: Path) -> None:
    """Finding 4: a job whose checkpoints fail (exit 74) trained, failed, and trained again
    from step 0 for ever: its failed starts counted from 0 again at every launch that
    reported its start. Now the count no longer resets on a start, and K launches in a row
    that trained without a checkpoint end the job failed, with the reason."""
    c = ContractCluster()
    c.add(1, 4, 4)
    ctl = controller(tmp_path, c)
    k = Settings().max_checkpoint_misses
    for n in range(1, k + 1):
        ctl.cycle()
        assert c.state(1) == "RUNNING", n
        c.report(1, started(), steps(100))
        ctl.cycle()
        c.set(1, state="FAILED", exit_code=EXIT_STORAGE)
        ctl.cycle()
        rec = ctl.store.job(1)
        assert rec is not None
        if n == k:
            assert rec.phase == "failed", rec
            assert f"{k} launches in a row" in rec.reason and "checkpoint" in rec.reason
            return
        assert rec.phase == "queued", rec
        c.t += 600  # past any back-off


def test_a_launch_that_starts_from_step_0_after_training_says_so(tmp_path: Path) -> None:
    """Finding 4: the next launch silently trained from step 0. It says so now: in the log
    and in the job's reason, with the steps lost counted."""
    c = ContractCluster()
    c.add(1, 4, 4)
    said: list[str] = []
    ctl = controller(tmp_path, c)
    ctl.log = said.append
    ctl.cycle()
    c.report(1, started(), steps(120))
    ctl.cycle()
    c.set(1, state="FAILED", exit_code=1)  # a failure: retried from the last checkpoint
    ctl.cycle()
    c.t += 10
    ctl.cycle()
    assert c.state(1) == "RUNNING"
    assert c.plans[1].trained_step == 120  # the relaunch's plan: its runtime says it too
    c.report(1, started(step=0))
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.lost_steps == 120, rec
    assert "from step 0" in rec.reason, rec.reason
    assert any("from step 0" in line and "120" in line for line in said), said


def test_a_checkpoint_resets_the_count_a_start_does_not(tmp_path: Path) -> None:
    """The failed-start count goes back to 0 when a launch checkpoints, not when it only
    starts."""
    c = ContractCluster()
    c.add(1, 4, 4)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    c.report(1, started(), steps(10))
    ctl.cycle()
    c.set(1, state="FAILED", exit_code=EXIT_STORAGE)
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.start_failures == 1 and rec.checkpoint_misses == 1
    c.t += 600
    ctl.cycle()
    c.report(1, started(step=0))
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.start_failures == 1 and rec.checkpoint_misses == 1
    c.report(1, {"event": "checkpoint", "time": 0, "step": 20})
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.start_failures == 0 and rec.checkpoint_misses == 0


def test_a_minimum_above_the_pool_is_said_not_waiting_for_gpus(tmp_path: Path) -> None:
    """Finding 6: a tagged job whose minimum exceeds the pool queued for ever as "waiting
    for GPUs"."""
    c = ContractCluster()  # 2 nodes x 4 GPUs
    c.add(1, 12, 16)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "queued"
    assert "never start" in rec.reason and "12" in rec.reason and "8 GPUs" in rec.reason


def test_a_job_moved_out_of_the_pool_has_left_it_and_is_not_lost(tmp_path: Path) -> None:
    """Finding 7: a job its owner moved out of the reservation was called lost, "vanished
    from Slurm", though Slurm still lists it."""
    c = ContractCluster()
    c.add(1, 1, 4)
    c.add(2, 1, 4)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    del c.jobs[1]
    c.elsewhere[1] = ""  # in Slurm, in no reservation
    del c.jobs[2]  # truly gone
    ctl.cycle()
    left, lost = ctl.store.job(1), ctl.store.job(2)
    assert left is not None and left.phase == "left", left
    assert "moved out of the pool" in left.reason
    assert lost is not None and lost.phase == "lost"


def test_a_launch_that_has_not_reported_its_start_is_why_others_wait(tmp_path: Path) -> None:
    """Finding 3: a launch that never reports its start holds its GPUs for the start-up
    allowance, and the jobs waiting for them were told only "waiting for GPUs"."""
    c = ContractCluster(nodes=1)
    c.add(1, 4, 4)
    ctl = controller(tmp_path, c, startup_s=600)
    ctl.cycle()
    ctl.cycle()
    c.add(2, 4, 4)
    c.t += 90
    ctl.cycle()
    ctl.cycle()
    waiting, starting = ctl.store.job(2), ctl.store.job(1)
    assert waiting is not None and starting is not None and waiting.phase == "queued"
    assert "job 1" in waiting.reason and "start-up" in waiting.reason, waiting.reason
    assert "not reported its start" in starting.reason, starting.reason


def test_nodes_0_says_what_is_wrong_not_that_the_partition_is_full() -> None:
    """Finding 8: `hpcorch controller --nodes 0` said the partition had no idle GPU node
    although it had some."""
    import pytest

    from hpcorch.cli.controller import pool_nodes
    from hpcorch.errors import HpcorchError
    from hpcorch.slurm.parse import SlurmNode

    class Backend:
        def partitions(self) -> tuple[list[str], str]:
            return ["gpu"], "gpu"

        def reservations(self) -> dict[str, list[str]]:
            return {}

        def nodes(self) -> list[SlurmNode]:
            return [SlurmNode(f"n{i}", "", ("IDLE",), ("gpu",), 8, 4, 0, "") for i in (1, 2)]

    class Cluster:
        backend = Backend()

    with pytest.raises(HpcorchError) as err:
        pool_nodes(Cluster(), "hpcorch", "0", None)  # type: ignore[arg-type]
    assert "at least 1" in str(err.value) and "no idle" not in str(err.value)
    assert pool_nodes(Cluster(), "hpcorch", "2", None) == "n1,n2"  # type: ignore[arg-type]
