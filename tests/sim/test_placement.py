"""Placement of ONES schedules: fewest nodes, fewer GPUs where spreading is slower."""

from __future__ import annotations

import numpy as np

from hpcorch.model.throughput import ThroughputModel
from hpcorch.policy.estimate import Estimates
from hpcorch.policy.placement import fit_nodes, place_schedule
from hpcorch.policy.types import JobView, Snapshot, StepSample


def test_fit_nodes_takes_whole_nodes_then_best_fit() -> None:
    free = [4, 3, 4, 1]
    assert fit_nodes(list(free), 5, 4) == {0: 4, 3: 1}
    assert fit_nodes(list(free), 3, 4) == {1: 3}
    assert fit_nodes(list(free), 8, 4) == {0: 4, 2: 4}
    assert fit_nodes(list(free), 12, 4) is None  # only two whole nodes free
    assert fit_nodes([2, 2], 4, 4) is None  # would straddle two nodes


def _job(name: str, app: str, placement: dict[int, int]) -> JobView:
    gpus = sum(placement.values())
    return JobView(
        job_id=name,
        application=app,
        submit_time=0.0,
        requested_gpus=1,
        requested_batch=32,
        min_gpus=1,
        max_gpus=8,
        min_batch=32,
        max_batch=1024,
        min_micro_batch=8,
        max_micro_batch=128,
        max_epochs=10,
        progress_per_epoch_hint=100.0,
        gpus=gpus,
        placement=placement,
        batch=32 * gpus,
        micro_batch=32 if gpus else 0,
        accum_steps=1,
    )


def _case(cross_node_step: float) -> tuple[Snapshot, Estimates, np.ndarray]:
    """Two 4-GPU nodes, jobs a and b hold 2 GPUs on each; c is new and asks for 4."""
    jobs = (_job("a", "x", {0: 2}), _job("b", "x", {1: 2}), _job("c", "y", {}))
    snap = Snapshot(now=60.0, node_gpus=(4, 4), jobs=jobs)
    samples = [
        StepSample(1, 1, 32, 0.10, 0.0),
        StepSample(1, 2, 32, 0.11, 0.01),
        StepSample(1, 4, 32, 0.12, 0.02),
        StepSample(2, 2, 32, cross_node_step, cross_node_step - 0.1),
        StepSample(2, 4, 32, cross_node_step, cross_node_step - 0.1),
    ]
    width = 9
    cols = np.arange(width, dtype=float)
    time = np.where(cols > 0, 1000.0 / np.maximum(cols, 1), np.inf)[None, :].repeat(3, 0)
    est = Estimates(
        jobs=jobs,
        time=time,
        batch=np.full((3, width), 128, dtype=np.int64),
        gmax=np.full(3, 8),
        gmin=np.ones(3, dtype=np.int64),
        models={"x": ThroughputModel(samples), "y": ThroughputModel(samples)},
    )
    value = np.where(cols > 0, cols, 0.0)[None, :].repeat(3, 0)
    value[0] = np.where(cols > 0, 1.0, 0.0)  # a gains nothing from more GPUs
    return snap, est, value


def test_spread_job_gets_fewer_gpus_on_one_node_when_cross_node_is_slow() -> None:
    snap, est, value = _case(cross_node_step=0.6)
    plan = place_schedule(snap, est, value, np.array([2, 2, 4]))
    by_id = plan.by_id()
    assert by_id["a"].placement == {0: 2}
    assert by_id["c"].placement == {0: 2}
    # The GPUs c leaves free go to b, which sits on that node and gains from them.
    assert by_id["b"].placement == {1: 4}


def test_spread_job_keeps_its_gpus_when_cross_node_is_cheap() -> None:
    snap, est, value = _case(cross_node_step=0.12)
    plan = place_schedule(snap, est, value, np.array([2, 2, 4]))
    c = plan.by_id()["c"]
    assert c.gpus == 4 and c.placement == {0: 2, 1: 2}


def test_resized_job_is_placed_afresh_on_fewest_nodes() -> None:
    jobs = (_job("a", "x", {0: 1, 1: 1, 2: 1}),)
    snap = Snapshot(now=60.0, node_gpus=(4, 4, 4), jobs=jobs)
    _, est, value = _case(cross_node_step=0.6)
    est = Estimates(jobs, est.time[:1], est.batch[:1], est.gmax[:1], est.gmin[:1], est.models)
    plan = place_schedule(snap, est, value[1:2], np.array([2]))
    assert len(plan.by_id()["a"].placement) == 1
