"""Online-fitted models (pure numpy)."""

from __future__ import annotations

import numpy as np
import pytest

from hpcorch.model.convergence import forecast_noise, gain
from hpcorch.model.throughput import ThroughputModel
from hpcorch.policy.estimate import estimate
from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.types import JobView, Snapshot, StepSample
from hpcorch.sim.traces import AppTrace


def _samples(app: AppTrace) -> list[StepSample]:
    out = []
    for counts, micro in [((1,), 64), ((1,), 256), ((2,), 128), ((4,), 128), ((4, 4), 128)]:
        st, sy = app.step_time(counts, micro)
        out.append(StepSample(len(counts), sum(counts), micro, st, sy))
    return out


def test_throughput_model_exact_at_measured_points(apps: dict[str, AppTrace]) -> None:
    samples = _samples(apps["cifar10"])
    model = ThroughputModel(samples)
    for s in samples:
        pred = model.iteration_time(
            np.array([s.nodes]), np.array([s.gpus]), np.array([s.micro_batch]), np.array([1])
        )
        assert pred[0] == pytest.approx(s.step_time, rel=1e-6)


def test_throughput_model_monotone_in_batch_and_accumulation(apps: dict[str, AppTrace]) -> None:
    model = ThroughputModel(_samples(apps["cifar10"]))
    b = np.arange(32, 1025, 32)
    one = np.ones_like(b)
    t = model.iteration_time(one, one, b, one)
    assert np.all(np.diff(t) >= 0)
    t2 = model.iteration_time(one, one, b, one * 2)
    assert np.all(t2 > t)


def test_throughput_model_without_samples_has_a_prior() -> None:
    model = ThroughputModel([], min_batch=128)
    t = model.iteration_time(
        np.array([1, 2]), np.array([4, 8]), np.array([32, 32]), np.array([1, 1])
    )
    assert np.all(np.isfinite(t)) and np.all(t > 0)


def test_gain_is_one_at_initial_batch_and_bounded() -> None:
    b = np.array([128, 256, 1024, 4096, 1 << 20])
    g = gain(b, 128, grad_sqr=1.0, grad_var=10.0)
    assert g[0] == pytest.approx(1.0)
    assert np.all(np.diff(g) > 0)
    assert g[-1] < 11.0  # never more than (var + sqr) / sqr


def test_noise_forecast_grows_and_follows_history() -> None:
    f = forecast_noise(2, 10, 3.0, [])
    assert f[0] == pytest.approx(3.0) and np.all(np.diff(f) > 0)
    ref = np.linspace(1, 100, 10)
    g = forecast_noise(4, 10, float(ref[4]), [ref, ref])
    assert np.allclose(g, ref[4:])


def _new_job(job_id: str = "a", requested_gpus: int = 1) -> JobView:
    """A job of a kind never measured, 1..16 GPUs."""
    return JobView(
        job_id=job_id,
        application="new",
        submit_time=0.0,
        requested_gpus=requested_gpus,
        requested_batch=32,
        min_gpus=1,
        max_gpus=16,
        min_batch=32,
        max_batch=1024,
        min_micro_batch=8,
        max_micro_batch=128,
        max_epochs=10,
        progress_per_epoch_hint=100.0,
    )


def test_never_measured_application_may_start_on_first_gpus() -> None:
    job = _new_job()
    snap = Snapshot(now=60.0, node_gpus=(4, 4, 4), jobs=(job,))
    assert estimate(snap, explore=4.0).gmax[0] == 1
    est = estimate(snap, explore=4.0, first_gpus=4)
    assert est.gmax[0] == 4
    assert np.all(np.isfinite(est.time[0, 1:5]))
    # Once measured on 2 GPUs, exploration allows 4 x 2.
    measured = JobView(**{**job.__dict__, "profile": (StepSample(1, 2, 16, 0.1, 0.01),)})
    snap = Snapshot(now=60.0, node_gpus=(4, 4, 4), jobs=(measured,))
    assert estimate(snap, explore=4.0, first_gpus=4).gmax[0] == 8


def test_a_never_measured_job_that_asked_for_one_gpu_starts_on_one() -> None:
    """``first_asked``: a one-GPU job of a kind never measured (ncf in the bundled
    workloads, which runs slower on a node than on one GPU) starts on one; a job that asked
    for more, fewer than a node's or more, may start on one node."""
    one, two, many = _new_job("one", 1), _new_job("two", 2), _new_job("many", 12)
    snap = Snapshot(now=60.0, node_gpus=(4, 4, 4), jobs=(one, two, many))
    assert list(estimate(snap, explore=4.0, first_gpus=4).gmax) == [4, 4, 4]
    assert list(estimate(snap, explore=4.0, first_gpus=4, first_asked=True).gmax) == [1, 4, 4]
    plan = OnesPolicy(seed=0).schedule(snap).by_id()
    assert plan["one"].gpus == 1
    assert plan["many"].gpus == 4
    assert OnesPolicy(seed=0, first_asked=False).schedule(snap).by_id()["one"].gpus == 4
    # a job whose user did not say (its request is its minimum, a default) keeps the node
    unsaid = JobView(**{**one.__dict__, "gpus_asked": False})
    snap_unsaid = Snapshot(now=60.0, node_gpus=(4, 4, 4), jobs=(unsaid,))
    assert estimate(snap_unsaid, explore=4.0, first_gpus=4, first_asked=True).gmax[0] == 4
    # once its kind is measured, exploration decides, not the request
    measured = JobView(**{**one.__dict__, "profile": (StepSample(1, 1, 16, 0.1, 0.0),)})
    snap = Snapshot(now=60.0, node_gpus=(4, 4, 4), jobs=(measured,))
    assert estimate(snap, explore=4.0, first_gpus=4, first_asked=True).gmax[0] == 4


@pytest.mark.parametrize(
    ("request_", "asked", "gpus"), [(None, False, 1), ((2, 0), True, 2), ((0, 256), False, 1)]
)
def test_the_controller_shows_whether_the_user_asked_for_a_gpu_count(
    request_: tuple[int, int] | None, asked: bool, gpus: int
) -> None:
    """Only a ``req`` tag is a request; without one the job's minimum stands in, and a new
    job is not held to it (it starts on a node, as before ``first_asked``)."""
    from hpcorch.controller.snapshot import job_view
    from hpcorch.controller.store import JobRecord

    rec = JobRecord(
        slurm_id=7, job_key="j7", name="j", user="u", job_dir="", app="a", min_gpus=1,
        max_gpus=8, batch=64, max_batch=1024, max_micro=64, submit_time=0.0, phase="pending",
        phase_since=0.0,
    )  # fmt: skip
    view = job_view(rec, (), {"n1": 0, "n2": 1}, 8, None, request_)
    assert (view.gpus_asked, view.requested_gpus) == (asked, gpus)
