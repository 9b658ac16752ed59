"""ONES over GPU types, the per-type estimates and the wrappers for policies that do not
plan types (pure logic: hand-made snapshots)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from hpcorch.policy import make_policy
from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.split import split_schedule
from hpcorch.policy.typed import type_estimates, type_speeds
from hpcorch.policy.types import JobView, PlanError, Snapshot, StepSample, validate_plan
from hpcorch.policy.typewrap import PerType, TypeBlind

TYPES = ("a100", "a100", "t4", "t4")


def job(i: int, app: str = "", prof: tuple[StepSample, ...] = (), **kw: object) -> JobView:
    base = JobView(
        job_id=str(i), application=app or f"app{i}", submit_time=float(i), requested_gpus=1,
        requested_batch=64, min_gpus=1, max_gpus=16, min_batch=64, max_batch=1024,
        min_micro_batch=1, max_micro_batch=128, max_epochs=10, progress_per_epoch_hint=100,
        profile=prof,
    )  # fmt: skip
    return replace(base, **kw)  # type: ignore[arg-type]


def step(t: str, st: float, gpus: int = 1, micro: int = 64) -> StepSample:
    return StepSample(
        nodes=1, gpus=gpus, micro_batch=micro, step_time=st, sync_time=0.0, gpu_type=t
    )


def snap(*jobs: JobView, types: tuple[str, ...] = TYPES, **kw: object) -> Snapshot:
    return Snapshot(
        now=0.0,
        node_gpus=(4,) * len(types),
        node_types=types,
        jobs=jobs,
        **kw,  # type: ignore[arg-type]
    )


def test_type_speeds_learns_the_ratio_from_jobs_measured_on_two_types() -> None:
    jobs = [
        job(0, prof=(step("a100", 0.1), step("t4", 0.4))),
        job(1, prof=(step("a100", 0.2), step("t4", 0.8))),
        job(2, prof=(step("t4", 0.3),)),  # one type only: tells nothing of the ratio
    ]
    speed = type_speeds(jobs, (), ("a100", "t4"))
    assert speed["a100"] / speed["t4"] == pytest.approx(4.0, rel=0.05)
    # nothing compared yet: every type alike
    assert type_speeds(jobs[2:], (), ("a100", "t4")) == {"a100": 1.0, "t4": 1.0}


def test_type_speeds_compare_types_only_near_batches_both_measured() -> None:
    # compute = (0.04 + 0.01 x per-GPU batch) on a T4, 4 x faster on an A100. A cold job
    # measured its first type at a tiny per-GPU batch and the next at its best one: compared
    # at either, the other type's time is an extrapolation (here a 6 x "ratio")
    far = job(0, prof=(step("t4", 0.07, micro=3), step("a100", 0.25, micro=96)))
    assert type_speeds([far], (), ("a100", "t4")) == {"a100": 1.0, "t4": 1.0}
    near = job(1, prof=(step("t4", 0.68, micro=64), step("a100", 0.17, micro=64)))
    speed = type_speeds([far, near], (), ("a100", "t4"))
    assert speed["a100"] / speed["t4"] == pytest.approx(4.0, rel=0.02)


def test_type_speeds_remembers_what_jobs_that_left_showed() -> None:
    memory: dict[str, dict[str, float]] = {}
    seen = [job(0, prof=(step("a100", 0.1), step("t4", 0.5)))]
    first = type_speeds(seen, (), ("a100", "t4"), memory)
    later = type_speeds([job(1, prof=(step("t4", 0.3),))], (), ("a100", "t4"), memory)
    assert later == first and first["a100"] / first["t4"] == pytest.approx(5.0, rel=0.05)


def test_a_job_measured_on_one_type_is_estimated_on_the_other_by_the_learned_speed() -> None:
    pair = (job(0, prof=(step("a100", 0.1), step("t4", 0.4))),)
    lone = job(1, prof=(step("t4", 0.8),))
    te = type_estimates(snap(*pair, lone))
    a, t = te.types.index("a100"), te.types.index("t4")
    ratio = te.est[t].time[1, 1] / te.est[a].time[1, 1]
    assert ratio == pytest.approx(4.0, rel=0.1)
    assert te.accepts.all()


def test_ones_puts_each_job_on_one_type_it_accepts_and_names_it() -> None:
    jobs = (
        job(0, prof=(step("a100", 0.1), step("t4", 0.6)), gpus=1, placement={0: 1},
            gpu_type="a100"),
        job(1, prof=(step("t4", 0.3),), gpus=1, placement={2: 1}, gpu_type="t4"),
        job(2, gpu_types=("t4",)),
        job(3),
    )  # fmt: skip
    s = snap(*jobs)
    plan = OnesPolicy(seed=1).schedule(s)
    validate_plan(s, plan)
    assert plan.jobs
    for p in plan.jobs:
        kinds = {TYPES[n] for n in p.placement}
        assert kinds == {p.gpu_type}
    by = plan.by_id()
    assert "2" not in by or by["2"].gpu_type == "t4"


def test_the_job_that_gains_most_from_the_fast_type_gets_it() -> None:
    # one A100 node, one T4 node; job 0 runs 8x faster on an A100, job 1 only 1.2x
    types = ("a100", "t4")
    fast = (step("a100", 0.05), step("t4", 0.4))
    flat = (step("a100", 0.25), step("t4", 0.3))
    s = snap(
        job(0, prof=fast, max_gpus=4), job(1, prof=flat, max_gpus=4),
        job(2, prof=(step("a100", 0.1), step("t4", 0.4)), max_gpus=1),
        types=types,
    )  # fmt: skip
    plan = OnesPolicy(seed=0, probe=False).schedule(s)
    validate_plan(s, plan)
    by = plan.by_id()
    assert by["0"].gpu_type == "a100" and by["1"].gpu_type == "t4", plan


def test_a_pool_of_one_type_schedules_as_without_types() -> None:
    jobs = (job(0, prof=(step("a100", 0.2),)), job(1), job(2, prof=(step("a100", 0.1, 2),)))
    typed = snap(*jobs, types=("a100",) * 4)
    plain = replace(typed, node_types=())
    assert OnesPolicy(seed=3).schedule(typed) == OnesPolicy(seed=3).schedule(plain)


def test_validate_plan_refuses_a_launch_across_types_unless_the_site_mixes() -> None:
    s = snap(job(0))
    across = make_policy("fifo").schedule(replace(s, node_types=()))
    spread = replace(across.jobs[0], gpus=2, placement={1: 1, 2: 1}, global_batch=64,
                     micro_batch=32, accum_steps=1)  # fmt: skip
    plan = replace(across, jobs=(spread,))
    with pytest.raises(PlanError, match="spans GPU types"):
        validate_plan(s, plan)
    validate_plan(replace(s, mix_types=True), plan)
    with pytest.raises(PlanError, match="accepts t4"):
        validate_plan(
            snap(job(0, gpu_types=("t4",))),
            replace(plan, jobs=(replace(spread, placement={0: 2}),)),
        )


def test_per_type_assigns_by_capacity_and_keeps_jobs_on_their_type() -> None:
    types = ("a100", "t4", "t4", "t4")  # a quarter of the GPUs are A100s
    jobs = tuple(job(i, requested_gpus=1, max_gpus=1) for i in range(8))
    policy = PerType(lambda: make_policy("fifo"), name="fifo-per-type")
    s = snap(*jobs, types=types)
    plan = policy.schedule(s)
    validate_plan(s, plan)
    kinds = [p.gpu_type for p in plan.jobs]
    assert kinds.count("a100") == 2 and kinds.count("t4") == 6
    again = policy.schedule(s)
    assert {p.job_id: p.gpu_type for p in again.jobs} == {p.job_id: p.gpu_type for p in plan.jobs}


def test_every_named_policy_keeps_a_launch_on_one_type() -> None:
    jobs = tuple(job(i, requested_gpus=3, min_gpus=3, max_gpus=3) for i in range(5))
    s = snap(*jobs)
    for name in ("fifo", "tiresias", "aiturbo", "share", "ones"):
        plan = split_schedule(make_policy(name), s)
        validate_plan(s, plan)


def test_unpredictable_jobs_are_placed_on_one_type() -> None:
    jobs = tuple(
        job(i, predictable=False, requested_gpus=6, min_gpus=6, max_gpus=6) for i in range(2)
    )
    s = snap(*jobs)
    plan = split_schedule(make_policy("ones"), s)
    validate_plan(s, plan)
    assert all(len({TYPES[n] for n in p.placement}) == 1 for p in plan.jobs)


def test_type_blind_sees_one_pool_and_needs_a_pool_that_mixes() -> None:
    s = snap(*(job(i, requested_gpus=6) for i in range(2)))
    with pytest.raises(ValueError, match="mix"):
        TypeBlind(OnesPolicy()).schedule(s)
    mixed = replace(s, mix_types=True)
    plan = TypeBlind(OnesPolicy()).schedule(mixed)
    validate_plan(mixed, plan)
    assert all(p.gpu_type == "" for p in plan.jobs)
    assert np.isfinite(sum(p.gpus for p in plan.jobs))


def test_ones_keeps_a_launch_on_one_type_even_where_the_site_lets_them_mix() -> None:
    # mixing would give a job more GPUs at the slowest type's speed: in the benchmark of
    # benchmarks/hetero.py that was worse than one type per launch, so ONES never mixes
    two = StepSample(nodes=2, gpus=8, micro_batch=64, step_time=0.1, sync_time=0.0)
    prof = tuple(s for t in TYPES[1:3] for s in (step(t, 0.1), replace(two, gpu_type=t)))
    s = snap(job(0, prof=prof, max_gpus=16), mix_types=True)
    plan = OnesPolicy(seed=0, probe=False).schedule(s)
    validate_plan(replace(s, mix_types=False), plan)
    assert plan.jobs[0].gpus == 8 and plan.jobs[0].gpu_type in TYPES


def test_where_the_site_mixes_types_a_policy_without_types_schedules_one_pool() -> None:
    kinds = ("a100", "t4", "a100", "t4")  # the first two nodes differ
    jobs = tuple(job(i, requested_gpus=6, min_gpus=6, max_gpus=6) for i in range(2))
    s = snap(*jobs, types=kinds, mix_types=True)
    plan = make_policy("fifo").schedule(s)
    validate_plan(s, plan)
    assert any(len({kinds[n] for n in p.placement}) > 1 for p in plan.jobs)  # 6 on 4-GPU nodes
    plan = make_policy("fifo").schedule(replace(s, mix_types=False))
    validate_plan(replace(s, mix_types=False), plan)
    assert all(len({kinds[n] for n in p.placement}) == 1 for p in plan.jobs)
