"""A new global batch without a restart: the plan rewritten during training (same launch,
same GPUs) takes effect at the next step boundary, the LR ramps to the new batch's factor,
and every sample of the epoch is still seen exactly once."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch.utils.data import TensorDataset

import hpcorch.runtime as hr
from hpcorch.planner import LaunchPlan, PlanWatcher, batch_from_plan, write_plan
from tests.runtime.harness import free_port


@pytest.fixture
def one_rank(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    for k, v in dict(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1",
                     MASTER_PORT=str(free_port()), HPCORCH_JOB_DIR=str(tmp_path),
                     HPCORCH_JOB_ID="j", HPCORCH_METRICS_INTERVAL="0").items():  # fmt: skip
        monkeypatch.setenv(k, v)
    yield tmp_path
    if dist.is_initialized():
        dist.destroy_process_group()


def plan(batch: int, launch: int = 0, gpus: int = 1, job: str | None = "j") -> LaunchPlan:
    return LaunchPlan(global_batch=batch, gpus=gpus, max_micro_batch=4, job=job, launch=launch)


def test_only_a_plan_for_this_launch_and_its_gpus_changes_the_batch() -> None:
    kw = dict(world_size=2, job_id="j", launch=3, lower=None, upper=None)
    assert batch_from_plan(plan(24, 3, 2), **kw).describe() == "24 = 4 x 3 x 2"  # type: ignore[union-attr, arg-type]
    assert batch_from_plan(plan(24, 4, 2), **kw) is not None  # type: ignore[arg-type]
    assert batch_from_plan(plan(24, 2, 2), **kw) is None  # type: ignore[arg-type]  # older
    assert batch_from_plan(plan(24, 3, 4), **kw) is None  # type: ignore[arg-type]  # a resize
    assert batch_from_plan(plan(24, 3, 2, "k"), **kw) is None  # type: ignore[arg-type]
    bounded = dict(kw, upper=16)
    assert batch_from_plan(plan(24, 3, 2), **bounded).global_batch == 16  # type: ignore[union-attr, arg-type]


def test_the_watcher_reads_the_file_when_it_changes(tmp_path: Path) -> None:
    path = tmp_path / "plan.json"
    write_plan(path, plan(8))
    w = PlanWatcher(path)
    assert w.changed() == plan(8)  # the first look reads it
    assert w.changed() is None
    write_plan(path, plan(16))
    assert w.changed() == plan(16)
    path.write_text("{not json")
    assert w.changed() is None and "not valid JSON" in w.error


def test_a_rewritten_plan_changes_the_batch_at_the_next_step(one_rank: Path) -> None:
    path = one_rank / "plan.json"
    write_plan(path, plan(8))
    job = hr.init(global_batch=8, max_micro_batch=4, lr_scaling="linear", warmup_steps=2,
                  final_checkpoint=False, metrics_interval=60.0)  # fmt: skip
    model = job.wrap(torch.nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.track(model, opt)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(64, 3, generator=g), torch.randn(64, 1, generator=g))
    seen: list[list[int]] = []
    batches: list[int] = []
    lrs: list[float] = []
    for step in job.steps(data, epochs=2):
        for x, y in step:
            step.backward(torch.nn.functional.mse_loss(model(x), y))
        w = model.module.weight.detach().clone()
        grad = model.module.weight.grad.detach().clone()
        opt.step()
        lrs.append(float(((w - model.module.weight.detach()) / grad).mean()))
        opt.zero_grad()
        seen.append(step.indices)
        batches.append(len(step.indices))
        if len(seen) == 3:  # the controller rewrites the plan during step 3
            write_plan(path, plan(16))
    # steps 1-3 at 8, from step 4 on at 16 (the epoch's last step takes the 8 left over):
    # no sample lost, none repeated
    assert batches == [8, 8, 8, 16, 16, 8, 16, 16, 16, 16]
    for epoch in (0, 1):
        idx = [i for s, b in zip(seen, _epochs(batches), strict=True) if b == epoch for i in s]
        assert sorted(idx) == list(range(64))
    # the LR factor ramps from 1 (base batch 8) to 2 over the 2 warm-up steps
    assert lrs[:5] == pytest.approx([0.1, 0.1, 0.1, 0.1, 0.15], rel=1e-4)
    assert lrs[5:7] == pytest.approx([0.2, 0.2], rel=1e-4)
    events = [json.loads(x) for x in (one_rank / "metrics.jsonl").read_text().splitlines()]
    rebatch = [e for e in events if e["event"] == "rebatch"]
    assert len(rebatch) == 1 and rebatch[0]["step"] == 3
    assert (rebatch[0]["from_batch"], rebatch[0]["global_batch"]) == (8, 16)
    assert [e["global_batch"] for e in events if e["event"] == "steps"][-1] == 16
    # the old batch's measurement is closed at the change: no line mixes the two batches
    steps = [(e["step"], e["global_batch"]) for e in events if e["event"] == "steps"]
    assert (3, 8) in steps and all(b == 16 for s, b in steps if s > 3)
    assert os.path.exists(path)


def _epochs(batches: list[int]) -> list[int]:
    """The epoch of each step, from the samples each consumed (64 per epoch)."""
    out, total = [], 0
    for b in batches:
        out.append(total // 64)
        total += b
    return out
