"""A new global batch for a running job: the controller's rebatch decision, and the
sidecar's batch file for scripts submitted with --live-batch. Pure logic and files."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpcorch.controller.reconcile import Settings, decide
from hpcorch.controller.store import JobRecord
from hpcorch.planner import LaunchPlan, write_plan
from hpcorch.protocol import ENV_JOB_ID, ENV_LAUNCH, ENV_PLAN
from hpcorch.sidecar.batch import LiveBatch
from hpcorch.sidecar.config import Progress, SidecarConfig
from hpcorch.sidecar.run import Sidecar
from hpcorch.slurm.script import JobSpec, SidecarSpec


def running(**kw: Any) -> JobRecord:
    base: dict[str, Any] = dict(
        slurm_id=7, job_key="j7", name="j", user="u", job_dir="/j7", app="a", min_gpus=1,
        max_gpus=8, batch=64, max_batch=512, max_micro=64, submit_time=0.0, phase="running",
        phase_since=0.0, gpus=2, ready=1, global_batch=64, target_batch=128,
    )  # fmt: skip
    base.update(kw)
    return JobRecord(**base)


def test_rebatch_only_for_a_running_job_at_its_gpus_that_can_take_it() -> None:
    s = Settings(min_run_s=0)
    out = decide(running(), 2, {0: 2}, 10.0, ("n1",), s, live_batch=True)
    assert [(a.kind, a.reason) for a in out.actions] == [("rebatch", "batch 64 -> 128")]
    # a script that cannot take it (sidecar without --live-batch): nothing until a relaunch
    assert decide(running(), 2, {0: 2}, 10.0, ("n1",), s).actions == []
    # the plan already asks for it (written at the last round): not again
    assert decide(running(), 2, {0: 2}, 10.0, ("n1",), s, 128, True).actions == []
    # another GPU count is a resize (signal), not a rebatch
    out = decide(running(), 4, {0: 4}, 10.0, ("n1",), s, live_batch=True)
    assert [a.kind for a in out.actions] == ["signal"]


def test_live_batch_is_in_the_comment() -> None:
    spec = JobSpec(
        job_key="k", name="n", script="/s.py", script_args=(), nodes=1, gpus_per_node=1,
        min_gpus=1, max_gpus=2, job_dir="/d", wrapper="/w",
        sidecar=SidecarSpec(live_batch=True, progress_file="/p"),
    )  # fmt: skip
    assert "livebatch=1" in spec.comment()


def test_the_sidecar_passes_a_rewritten_batch_on_in_the_batch_file(tmp_path: Path) -> None:
    plan = tmp_path / "plan.json"
    write_plan(plan, LaunchPlan(global_batch=64, gpus=2, max_micro_batch=16, job="j", launch=1))
    live = LiveBatch(tmp_path / "batch.json", str(plan), 2, 1, "j", 1)
    live.global_batch, live.per_gpu_batch, live.accum_steps = 64, 16, 2
    live.write()
    first = json.loads((tmp_path / "batch.json").read_text())
    assert (first["global_batch"], first["per_gpu_batch"], first["accum_steps"]) == (64, 16, 2)
    assert live.poll() is None  # the plan as the launch started with it
    write_plan(plan, LaunchPlan(global_batch=128, gpus=2, max_micro_batch=16, job="j", launch=1))
    line = live.poll()
    assert line is not None and (line["from_batch"], line["global_batch"]) == (64, 128)
    doc = json.loads((tmp_path / "batch.json").read_text())
    assert (doc["global_batch"], doc["per_gpu_batch"], doc["accum_steps"]) == (128, 16, 4)
    # a plan for another GPU count (a resize relaunches it) is not passed on
    write_plan(plan, LaunchPlan(global_batch=256, gpus=4, max_micro_batch=16, job="j", launch=1))
    assert live.poll() is None
    assert json.loads((tmp_path / "batch.json").read_text())["global_batch"] == 128


def test_the_sidecar_measures_a_new_batch_from_the_change_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The steps line after a live batch change reports the step time at the new batch:
    the steps before the change (at the old one) are left out of it."""
    plan = tmp_path / "plan.json"
    write_plan(plan, LaunchPlan(global_batch=64, gpus=1, max_micro_batch=64, job="j", launch=0))
    for key, value in ((ENV_PLAN, str(plan)), (ENV_JOB_ID, "j"), (ENV_LAUNCH, "0")):
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("WORLD_SIZE", "1")
    car = Sidecar(SidecarConfig(job_dir=tmp_path), ["srun"], ["python", "train.py"])
    car.tracker.interval_s = 0.0
    lines: list[dict[str, object]] = []
    monkeypatch.setattr(car, "emit", lines.append)
    for i in range(1, 12):  # 1 s a step at 64
        car.tracker.update(Progress(i), 100.0 + i)
    write_plan(plan, LaunchPlan(global_batch=128, gpus=1, max_micro_batch=64, job="j", launch=0))
    car._poll_plan()
    assert lines and lines[-1]["global_batch"] == 128  # the change, said
    for i in range(12, 15):  # 3 s a step at 128
        car.tracker.update(Progress(i), 111.0 + 3.0 * (i - 11))
    line = car.tracker.due(200.0)
    assert line is not None and line["global_batch"] == 128
    assert line["step_time"] == pytest.approx(3.0)
