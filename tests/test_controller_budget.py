"""The time budget and the cap on relaunches: --time is per launch; a job that keeps
checkpointing at its time limit is relaunched only within its budget and its cap."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.test_controller_logic import FakeCluster, controller


def _tagged(c: FakeCluster, job_id: int, **tags: str) -> None:
    j = c.jobs[job_id].job
    c.set(job_id, tags={**j.tags, **tags})


def test_checkpoints_at_the_time_limit_are_relaunched_up_to_the_cap(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 2, 2)
    _tagged(c, 1, relaunches="2")
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    for n in (1, 2):  # Slurm's signal at the time limit: the job checkpoints on its own
        c.set(1, state="FAILED", exit_code=75)
        ctl.cycle()
        rec = ctl.store.job(1)
        assert rec is not None and rec.time_relaunches == n and rec.phase == "starting"
        assert c.state(1) == "RUNNING"
        ctl.cycle()
    c.set(1, state="FAILED", exit_code=75)
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "timeout"
    assert "--max-relaunches 2 reached" in rec.reason and "resubmit" in rec.reason
    assert c.state(1) == "FAILED"  # not relaunched again
    ctl.cycle()
    assert c.log.count(("requeue_hold", 1)) == 2


def test_resizes_do_not_count_against_the_cap(tmp_path: Path) -> None:
    c = FakeCluster(nodes=1)
    c.add(1, 1, 4)
    _tagged(c, 1, relaunches="0")
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.add(2, 2, 2)  # the controller shrinks job 1 for job 2: a relaunch it asked for
    for _ in range(4):
        ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.resizes >= 1 and rec.time_relaunches == 0
    assert rec.phase in ("running", "starting")


def _past_its_budget(tmp_path: Path, requeue_self: bool = False) -> tuple[FakeCluster, Any]:
    """A job with a 100 s budget run until the controller signals it for its checkpoint
    (it does not checkpoint yet)."""
    c = FakeCluster()
    c.requeue_self = requeue_self
    c.add(1, 2, 2)
    _tagged(c, 1, budget="100")
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.jobs[1].exit_on_signal = False
    for _ in range(5):  # 5 x 25 s of run time
        c.t += 25
        ctl.cycle()
        if ctl.store.job(1).phase == "stopping":
            break
    return c, ctl


def test_a_job_past_its_budget_is_checkpointed_and_ends(tmp_path: Path) -> None:
    c, ctl = _past_its_budget(tmp_path)
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "stopping" and rec.run_total_s >= 100
    assert ("signal", 1) in c.log and rec.reason.startswith("time budget spent (1:")
    c.set(1, state="FAILED", exit_code=75)  # it checkpointed
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "timeout"
    assert rec.reason.startswith("time budget spent: ran 2:05 of 1:40 over 1 launch")
    assert c.state(1) == "FAILED" and ("requeue_hold", 1) not in c.log


def test_a_job_past_its_budget_found_requeued_held_ends_with_what_it_ran(tmp_path: Path) -> None:
    """The wrapper requeues the job held after its checkpoint: Slurm may show it so before
    the checkpoint's report is read. The end says what it ran, and the checkpoint was not
    forced."""
    c, ctl = _past_its_budget(tmp_path, requeue_self=True)
    c.checkpointed(1)
    c.set(1, special_exit=False, reason="JobHeldUser")  # a requeue hold, as scontrol's
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "timeout"
    assert rec.reason.startswith("time budget spent: ran 2:05 of 1:40 over 1 launch")
    assert "forced" not in rec.reason and c.state(1) == "CANCELLED"


def test_the_budget_counts_across_launches(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 2, 2)
    _tagged(c, 1, budget="60", relaunches="10")
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.t += 40
    ctl.cycle()
    c.set(1, state="FAILED", exit_code=75)  # time limit of the first launch
    ctl.cycle()
    assert ctl.store.job(1).phase == "starting"  # type: ignore[union-attr]
    ctl.cycle()
    c.t += 25  # 65 s in all: over the budget in the second launch
    for _ in range(3):  # signalled, checkpoints at once, ends
        ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "timeout" and rec.launches == 2


def test_no_tags_mean_the_default_cap(tmp_path: Path) -> None:
    c = FakeCluster()
    c.add(1, 2, 2)
    ctl = controller(tmp_path, c)
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.max_relaunches == 3 and rec.time_budget_s == 0


def test_a_standalone_job_counts_its_own_requeues(tmp_path: Path) -> None:
    """The sidecar's side of the wrapper's bookkeeping (same file, same rules)."""
    from hpcorch.budget import read_used, record_relaunch

    env = {"HPCORCH_MAX_RELAUNCHES": "2", "HPCORCH_TIME_BUDGET": "1000"}
    assert record_relaunch(tmp_path, 300.4, env) is None
    assert read_used(tmp_path) == (1, 300)
    assert record_relaunch(tmp_path, 300, env) is None
    why = record_relaunch(tmp_path, 10, env)
    assert why is not None and "2 relaunches allowed" in why and "number 3" in why
    (tmp_path / "time-used").write_text("0 700\n")
    why = record_relaunch(tmp_path, 150, {"HPCORCH_TIME_BUDGET": "1000"})
    assert why is not None and "time budget spent (850 s of 1000 s)" in why
    (tmp_path / "time-used").write_text("garbage")
    assert read_used(tmp_path) == (0, 0)


def test_a_job_that_requeued_itself_past_its_cap_or_budget_is_cancelled(tmp_path: Path) -> None:
    """A job its wrapper requeued held (SPECIAL_EXIT) waits in the queue: when the
    controller ends it for its relaunch cap or its time budget, it cancels it."""
    c = FakeCluster(requeue_self=True)
    c.add(1, 2, 2)
    c.add(2, 2, 2)
    _tagged(c, 1, relaunches="1")
    _tagged(c, 2, budget="100")
    ctl = controller(tmp_path, c)
    ctl.cycle()
    ctl.cycle()
    c.checkpointed(1)  # at its time limit, on its own: relaunched once
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.time_relaunches == 1 and c.state(1) == "RUNNING"
    c.checkpointed(1)
    c.t += 125  # job 2 past its budget: signalled, it checkpoints and requeues itself
    ctl.cycle()
    rec = ctl.store.job(1)
    assert rec is not None and rec.phase == "timeout" and "--max-relaunches 1" in rec.reason
    assert c.state(1) == "CANCELLED"
    ctl.cycle()  # job 2 signalled: it checkpoints and requeues itself
    assert ("signal", 2) in c.log
    ctl.cycle()
    rec2 = ctl.store.job(2)
    assert rec2 is not None
    assert rec2.phase == "timeout" and rec2.reason.startswith("time budget spent: ran 2:05")
    assert c.state(2) == "CANCELLED" and c.log.count(("start", 2)) == 1
