"""The job object in this process (one gloo rank): LR scaling and warm-up as applied by the
optimizer, what a checkpoint holds, and a resume into fresh objects."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

import hpcorch.runtime as hr
from hpcorch.planner import LaunchPlan
from hpcorch.protocol import PLAN_FILE
from hpcorch.runtime import checkpoint as ckpt
from tests.runtime.harness import free_port


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port()), HPCORCH_JOB_DIR=str(tmp_path),
                     HPCORCH_METRICS_INTERVAL="0").items():  # fmt: skip
        monkeypatch.setenv(k, v)
    yield tmp_path
    if dist.is_initialized():
        dist.destroy_process_group()


def data() -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    return TensorDataset(torch.randn(40, 3, generator=g), torch.randn(40, 1, generator=g))


def train(
    job: hr.ElasticJob, model: torch.nn.Module, opt: torch.optim.Optimizer, steps: int | None = None
) -> list[float]:
    """Train; return the LR each optimizer step really used."""
    used = []
    for i, step in enumerate(job.steps(data(), epochs=2)):
        for x, y in step:
            step.backward(torch.nn.functional.mse_loss(model(x), y))
        w = model.module.weight.detach().clone()
        g = model.module.weight.grad.detach().clone()
        opt.step()
        used.append(float(((w - model.module.weight.detach()) / g).mean()))
        opt.zero_grad()
        if steps is not None and i + 1 == steps:
            break
    return used


def test_lr_scaled_at_step_time_with_warmup(one_rank: Path) -> None:
    job = hr.init(global_batch=8, max_micro_batch=4, base_batch=2, lr_scaling="linear",
                  warmup_steps=3, final_checkpoint=False)  # fmt: skip
    assert job.batch.describe() == "8 = 4 x 2 x 1"
    model = job.wrap(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.track(model, opt)
    used = train(job, model, opt, steps=5)
    # factor ramps 1 -> 4 (global 8 / base 2) over 3 steps, then holds
    assert used == pytest.approx([0.1, 0.2, 0.3, 0.4, 0.4], rel=1e-4)
    assert opt.param_groups[0]["lr"] == 0.1  # the scheduler-visible LR is untouched


def test_checkpoint_holds_everything_and_resumes(one_rank: Path) -> None:
    job = hr.init(global_batch=8, max_micro_batch=8, lr_scaling="sqrt", seed=7,
                  final_checkpoint=False)  # fmt: skip
    model = job.wrap(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    job.track(model, opt, sched)
    job.state["best"] = 1.5
    train(job, model, opt, steps=3)
    job.checkpoint()
    found = ckpt.find_latest(one_rank / "checkpoints")
    assert found.step == 3
    payload = ckpt.load(found.path, None)  # type: ignore[arg-type]
    for key in ("model", "optimizer", "scheduler", "rng", "epoch", "offset", "global_step",
                "plan", "user", "lr", "gns", "seed", "dataset_size", "world_size"):  # fmt: skip
        assert key in payload, key
    assert (payload["epoch"], payload["offset"], payload["global_step"]) == (0, 24, 3)
    assert payload["plan"] == {"global_batch": 8, "gpus": 1, "micro_batch": 8, "accum_steps": 1}
    assert payload["user"] == {"best": 1.5} and payload["optimizer"]["state"]
    assert set(payload["rng"][0]) >= {"python", "numpy", "torch"}
    expected = train(job, model, opt)  # the rest of the run, uninterrupted
    final = model.module.weight.detach().clone()
    dist.destroy_process_group()

    # a fresh job in the same directory resumes from step 3 (the newest checkpoint)
    for p in (one_rank / "checkpoints").glob("*"):
        if p != found.path:
            p.unlink()
    job2 = hr.init(global_batch=8, max_micro_batch=8, lr_scaling="sqrt", final_checkpoint=False)
    model2 = job2.wrap(torch.nn.Linear(3, 1))
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9)
    job2.track(model2, opt2, torch.optim.lr_scheduler.StepLR(opt2, step_size=2))
    assert (job2.global_step, job2.offset, job2.state) == (3, 24, {"best": 1.5})
    assert train(job2, model2, opt2) == expected
    assert torch.equal(model2.module.weight.detach(), final)


def test_max_steps_ends_training_with_a_final_checkpoint(one_rank: Path) -> None:
    job = hr.init(global_batch=16, max_micro_batch=16)
    model = job.wrap(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.track(model, opt)
    n = 0
    for step in job.steps(data(), epochs=5, max_steps=4):
        for x, y in step:
            step.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        n += 1
    assert (n, job.global_step, job.epoch, job.offset) == (4, 4, 1, 16)  # 16+16+8, then 16
    assert ckpt.find_latest(one_rank / "checkpoints").step == 4
    assert '"event": "done"' in (one_rank / "metrics.jsonl").read_text()


def test_finish_after_break_ends_training_as_the_loop_does(one_rank: Path) -> None:
    """A script that stops at a target of its own leaves the loop with break and calls
    finish(): the step it left after counts, the final checkpoint is at it, the heartbeat
    says done (what the job wrapper counts a launch finished by) and so does the report."""
    job = hr.init(global_batch=16, max_micro_batch=16)
    model = job.wrap(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.track(model, opt)
    for step in job.steps(data(), epochs=5):
        for x, y in step:
            step.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()
        if job.global_step == 3:  # the 4th step's update is done: it counts
            break
    assert job.global_step == 4 and not (one_rank / "checkpoints").exists()
    job.finish()
    assert ckpt.find_latest(one_rank / "checkpoints").step == 4
    assert '"state": "done"' in (one_rank / "heartbeat").read_text()
    lines = (one_rank / "metrics.jsonl").read_text().splitlines()
    assert '"event": "done"' in lines[-1] and '"step": 4' in lines[-1]


def test_checkpoint_without_its_fields_is_one_clear_error(
    one_rank: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ckpt.checkpoint_path(one_rank / "checkpoints", 9)
    path.parent.mkdir()
    torch.save({"format": "hpcorch-checkpoint", "version": 1, "job": None}, path)
    before = path.read_bytes()
    with pytest.raises(SystemExit) as exit_:
        hr.init(global_batch=8, max_micro_batch=8)
    assert exit_.value.code == hr.EXIT_CONFIG
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1  # <time> hpcorch: error: ...
    assert err[0].endswith(f" hpcorch: error: checkpoint {path} lacks the field 'global_step'")
    assert path.read_bytes() == before and not (one_rank / "metrics.jsonl").exists()


class _DeviceWait:
    """torch.distributed for the launch module, whose step-boundary all-reduce waits 0.2 s: what
    a rank on a GPU does there, where the kernels the training loop only queued finish."""

    def __getattr__(self, name: str) -> object:
        return getattr(dist, name)

    @staticmethod
    def all_reduce(tensor: torch.Tensor, *args: object, **kwargs: object) -> object:
        import time

        time.sleep(0.2)
        return dist.all_reduce(tensor, *args, **kwargs)


def test_step_time_includes_the_wait_for_the_device(
    one_rank: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    import hpcorch.runtime.launch as launch_module

    monkeypatch.setattr(launch_module, "dist", _DeviceWait())
    job = hr.init(global_batch=8, max_micro_batch=8, final_checkpoint=False)
    model = job.wrap(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.track(model, opt)
    train(job, model, opt, steps=3)
    lines = [json.loads(x) for x in (one_rank / "metrics.jsonl").read_text().splitlines()]
    steps = [x for x in lines if x["event"] == "steps"]
    assert len(steps) >= 2
    assert all(x["step_time"] >= 0.2 for x in steps), [x["step_time"] for x in steps]
    assert steps[0]["max_memory_allocated"] is None  # device memory: reported on GPUs only


def test_one_rank_has_no_noise_hook(one_rank: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The noise scale needs two batch sizes (local and global): a single rank skips the
    hook's norms of every gradient bucket (on a GPU they cost time at every step)."""
    from hpcorch.runtime.gns import NoiseScale

    calls = []
    real = NoiseScale.hook
    monkeypatch.setattr(NoiseScale, "hook", lambda self, *a: calls.append(1) or real(self, *a))
    job = hr.init(global_batch=8, max_micro_batch=8, final_checkpoint=False)
    model = job.wrap(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.track(model, opt)
    train(job, model, opt, steps=2)
    assert calls == [] and job.noise_scale is None


def test_a_launch_that_finds_no_checkpoint_after_earlier_launches_trained_says_so(
    one_rank: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = LaunchPlan(global_batch=8, gpus=1, max_micro_batch=8, launch=3, trained_step=120)
    (one_rank / PLAN_FILE).write_text(plan.to_json())
    job = hr.init(global_batch=8, max_micro_batch=8, final_checkpoint=False)
    assert job.global_step == 0
    err = capsys.readouterr().err
    assert "this launch starts from step 0, but earlier launches of this job trained to " in err
    assert "step 120: no checkpoint in " in err and "their work is lost" in err


def test_a_first_launch_says_nothing_of_earlier_work(
    one_rank: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = LaunchPlan(global_batch=8, gpus=1, max_micro_batch=8)
    assert "trained_step" not in plan.to_json()  # plan files read by older runtimes
    (one_rank / PLAN_FILE).write_text(plan.to_json())
    hr.init(global_batch=8, max_micro_batch=8, final_checkpoint=False)
    assert "starts from step 0" not in capsys.readouterr().err
