"""Pooled knowledge is a prior: two different models under one name do not mislead ONES."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hpcorch.policy.estimate import estimate
from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.pooling import model_keys
from hpcorch.policy.types import CompletedJob, JobView, Snapshot, StepSample
from hpcorch.sim.traces import AppTrace

NODES = (4,) * 16


def _profile(app: AppTrace, configs: list[tuple[int, int, int]]) -> tuple[StepSample, ...]:
    out = []
    for nodes, per_node, micro in configs:
        st, sy = app.step_time((per_node,) * nodes, micro)
        out.append(StepSample(nodes, nodes * per_node, micro, st, sy))
    return tuple(out)


def _job(app: AppTrace, job_id: str, name: str, profile: tuple[StepSample, ...]) -> JobView:
    sqr, var = app.grad_stats(app.init_batch, 1)
    micro = max(app.init_batch // 4, app.min_micro)
    return JobView(
        job_id, name, 0.0, 4, app.init_batch, 1, 64, app.init_batch, app.max_batch,
        app.min_micro, app.max_micro, app.epochs, app.progress_per_epoch_hint,
        gpus=4, placement={0: 4}, batch=app.init_batch, micro_batch=micro, epoch=1,
        progress=float(app.epoch_end[1]), grad_sqr=sqr, grad_var=var, profile=profile,
        model_bytes=app.model_bytes,
    )  # fmt: skip


def _history(app: AppTrace, name: str, bytes_: int) -> tuple[CompletedJob, ...]:
    configs = [(1, 1, 32), (1, 1, 256), (1, 4, 64), (2, 4, 128), (4, 4, 256), (16, 4, 512)]
    grads = tuple(app.grad_stats(app.init_batch, e) for e in range(app.epochs))
    profile = _profile(app, configs)
    return tuple(
        CompletedJob(f"old{i}", name, 500.0, 2000.0, 1.0, app.epochs, profile, grads, (), bytes_)
        for i in range(3)
    )


@pytest.mark.parametrize("reports_size", [True, False])
def test_a_different_model_under_a_known_name_is_modelled_on_its_own(
    apps: dict[str, AppTrace], reports_size: bool
) -> None:
    cifar, bert = apps["cifar10"], apps["bert"]
    size = bert.model_bytes if reports_size else 0
    own = _profile(bert, [(1, 4, 4), (1, 1, 8)])
    newcomer = replace(_job(bert, "x", "train", own), model_bytes=size)
    history = _history(cifar, "train", cifar.model_bytes if reports_size else 0)
    pooled = Snapshot(0.0, NODES, (newcomer,), history)
    alone = Snapshot(0.0, NODES, (replace(newcomer, application="other"),), history)
    keys, _ = model_keys(pooled.jobs, pooled.history)
    assert keys["x"] != "train"
    est, ref = estimate(pooled, explore=4), estimate(alone, explore=4)
    # what it predicts for the newcomer is what its own measurements say, not cifar10's
    np.testing.assert_allclose(est.time[0, 1:17], ref.time[0, 1:17], rtol=1e-9)
    assert est.gmax[0] == ref.gmax[0] == 16  # exploration follows its own measurements


def test_agreeing_jobs_still_pool(apps: dict[str, AppTrace]) -> None:
    cifar = apps["cifar10"]
    job = _job(cifar, "x", "train", _profile(cifar, [(1, 4, 32)]))
    history = _history(cifar, "train", cifar.model_bytes)
    keys, hist = model_keys((job,), history)
    assert keys["x"] == "train" and set(hist.values()) == {"train"}
    est = estimate(Snapshot(0.0, NODES, (job,), history), explore=4)
    assert est.gmax[0] == 64  # the pooled profile reached 64 GPUs


def test_ones_plans_a_misnamed_model_as_if_it_were_new(apps: dict[str, AppTrace]) -> None:
    """A bert job under the name of cifar10 jobs gets what it would get under a name of its
    own (misled by cifar10's profile, it would be taken for a job about to end: 1 GPU)."""
    cifar, bert = apps["cifar10"], apps["bert"]
    newcomer = _job(bert, "x", "train", _profile(bert, [(1, 4, 4)]))
    history = _history(cifar, "train", cifar.model_bytes)
    # probe=False: a job measured at one batch would otherwise be held at its GPUs for a
    # probe round (tests/test_probe.py), and this is about what it is taken for
    plan = OnesPolicy(probe=False).schedule(Snapshot(0.0, NODES, (newcomer,), history))
    fresh = replace(newcomer, application="bert-of-its-own")
    ref = OnesPolicy(probe=False).schedule(Snapshot(0.0, NODES, (fresh,), history))
    assert plan.jobs[0].gpus == ref.jobs[0].gpus >= 8
