"""Every policy's plan within the scheduler's limits (hpcorch/policy/limits.py), pure:
any plan of any policy, fitted, keeps every per-job bound and every group cap; the issue's
case (an elastic 1-8 GPU job under a 2-GPU per-user cap) is planned at 2; GPUs a capped
user cannot take go to another user; ONES's own search stays within group caps."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcorch.policy import POLICIES
from hpcorch.policy.limit_types import GroupCap, JobLimit, Limits
from hpcorch.policy.limits import bounded_snapshot, fit_limits, limited_schedule, validate_limits
from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.split import split_schedule
from hpcorch.policy.types import (
    JobPlan,
    JobView,
    Plan,
    PlanError,
    Snapshot,
    StepSample,
    validate_plan,
)

PROFILE = (
    StepSample(1, 1, 16, 0.10, 0.0),
    StepSample(1, 2, 16, 0.11, 0.0),
    StepSample(1, 4, 16, 0.12, 0.0),
)


def job(name: str, lo: int = 1, hi: int = 8, **kw: object) -> JobView:
    base = JobView(
        job_id=name,
        application=f"app-{name}",
        submit_time=float(len(name)),
        requested_gpus=lo,
        requested_batch=64,
        min_gpus=lo,
        max_gpus=hi,
        min_batch=64,
        max_batch=512,
        min_micro_batch=1,
        max_micro_batch=64,
        max_epochs=10,
        progress_per_epoch_hint=1000.0,
        profile=PROFILE,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def snapshot(jobs: list[JobView], limits: Limits, nodes: int = 2) -> Snapshot:
    return Snapshot(now=100.0, node_gpus=(4,) * nodes, jobs=tuple(jobs), limits=limits)


def test_the_issues_case_an_elastic_job_under_a_user_cap_of_two() -> None:
    cap = GroupCap("QOS normal MaxTRESPerUser", ("a",), gpus=2)
    snap = snapshot([job("a")], Limits(groups=(cap,)))
    for name in ("share", "ones"):
        plan = limited_schedule(POLICIES[name](0), snap)
        assert [p.gpus for p in plan.jobs] == [2], (name, plan)
    for name in ("fifo", "tiresias", "aiturbo", "gavel"):  # at what the job asked for (1)
        plan = limited_schedule(POLICIES[name](0), snap)
        assert 1 <= plan.jobs[0].gpus <= 2, (name, plan)
    unlimited = split_schedule(POLICIES["share"](0), replace(snap, limits=Limits()))
    assert unlimited.jobs[0].gpus == 8  # what it was planned at before


def test_gpus_a_capped_user_cannot_take_go_to_another() -> None:
    alice = GroupCap("alice", ("a1", "a2"), gpus=3)
    snap = snapshot([job("a1"), job("a2"), job("b1")], Limits(groups=(alice,)))
    for name in ("share", "ones"):
        plan = limited_schedule(POLICIES[name](0), snap).by_id()
        validate_limits(snap, Plan(tuple(plan.values())))
        assert sum(p.gpus for k, p in plan.items() if k != "b1") == 3, (name, plan)
        # bob takes what alice may not: all the rest (ONES keeps b1 on one node)
        assert plan["b1"].gpus == (5 if name == "share" else 4), (name, plan)


def test_a_job_whose_minimum_no_limit_allows_is_not_planned() -> None:
    snap = snapshot([job("a", lo=4), job("b")], Limits(jobs={"a": JobLimit(max_gpus=2)}))
    assert [j.job_id for j in bounded_snapshot(snap).jobs] == ["b"]
    plan = limited_schedule(POLICIES["share"](0), snap)
    assert [p.job_id for p in plan.jobs] == ["b"]


def test_per_job_nodes_and_gpus_per_node() -> None:
    own = JobLimit(max_nodes=1, max_gpus_per_node=3)
    snap = snapshot([job("a")], Limits(jobs={"a": own}), nodes=3)
    plan = limited_schedule(POLICIES["share"](0), snap)
    (p,) = plan.jobs
    assert p.gpus == 3 and len(p.placement) == 1, p
    too_many = Plan((JobPlan("a", 8, {0: 4, 1: 4}, 64, 8, 1),))
    with pytest.raises(PlanError, match="its limits allow"):
        validate_limits(snap, too_many)
    fitted = fit_limits(snap, too_many)
    assert fitted.jobs[0].gpus == 3 and len(fitted.jobs[0].placement) == 1


def test_cpu_limits_where_cpus_are_not_planned_use_the_jobs_own() -> None:
    own = JobLimit(max_cpus=12, cpus_per_gpu=4)
    snap = snapshot([job("a")], Limits(jobs={"a": own}))
    (p,) = limited_schedule(POLICIES["share"](0), snap).jobs
    assert p.gpus == 3


def test_a_job_count_cap_leaves_the_least_preferred_out() -> None:
    cap = GroupCap("MaxJobsPerUser", ("a", "b", "c"), jobs=2)
    jobs = [job("a", submit_time=1.0), job("b", submit_time=2.0), job("c", submit_time=3.0)]
    snap = snapshot(jobs, Limits(groups=(cap,)))
    plan = limited_schedule(POLICIES["share"](0), snap)
    assert sorted(p.job_id for p in plan.jobs) == ["a", "b"]


def test_a_running_job_that_cannot_stop_keeps_its_gpus_over_a_lowered_cap() -> None:
    fixed = job("a", gpus=4, placement={0: 4}, resizable=False, batch=64, micro_batch=16)
    cap = GroupCap("alice", ("a", "b"), gpus=2)
    snap = snapshot([fixed, job("b")], Limits(groups=(cap,)))
    plan = limited_schedule(POLICIES["share"](0), snap).by_id()
    assert plan["a"].gpus == 4 and "b" not in plan
    validate_limits(snap, Plan(tuple(plan.values())))


def test_ones_search_keeps_within_group_caps_on_its_own() -> None:
    cap = GroupCap("alice", ("a1", "a2", "a3"), gpus=3, jobs=2)
    jobs = [job(f"a{i}") for i in (1, 2, 3)] + [job("b1", hi=2)]
    snap = bounded_snapshot(snapshot(jobs, Limits(groups=(cap,))))
    plan = OnesPolicy(seed=1).schedule(snap)
    validate_limits(snap, plan)  # no fitting needed
    assert plan.gpus_used == 5  # b1's two and alice's three


NAMES = [n for n in POLICIES if n != "sidecar"]


@st.composite
def limited(draw: st.DrawFn) -> tuple[str, Snapshot]:
    nodes = draw(st.integers(1, 3))
    free = [4] * nodes
    jobs: list[JobView] = []
    for i in range(draw(st.integers(1, 6))):
        lo = draw(st.integers(1, 3))
        hi = draw(st.integers(lo, 8))
        kw: dict[str, object] = {"submit_time": float(i)}
        n = draw(st.integers(0, 4))
        node = draw(st.integers(0, nodes - 1))
        if lo <= n <= hi and free[node] >= n > 0:  # running on one node
            free[node] -= n
            kw.update(gpus=n, placement={node: n}, batch=64, micro_batch=64 // n)
            kw.update(resizable=draw(st.booleans()))
        jobs.append(job(f"j{i}", lo, hi, **kw))
    ids = [j.job_id for j in jobs]
    limits: dict[str, JobLimit] = {}
    for i in ids:
        if draw(st.booleans()):
            limits[i] = JobLimit(
                max_gpus=draw(st.none() | st.integers(1, 8)),
                max_nodes=draw(st.none() | st.integers(1, 3)),
                max_gpus_per_node=draw(st.none() | st.integers(1, 4)),
                max_cpus=draw(st.none() | st.integers(2, 24)),
                cpus_per_gpu=draw(st.integers(0, 4)),
            )
    groups = tuple(
        GroupCap(
            f"g{k}",
            tuple(draw(st.lists(st.sampled_from(ids), min_size=1, unique=True))),
            gpus=draw(st.none() | st.integers(0, 8)),
            nodes=draw(st.none() | st.integers(1, 4)),
            jobs=draw(st.none() | st.integers(0, 3)),
        )
        for k in range(draw(st.integers(0, 3)))
    )
    return draw(st.sampled_from(NAMES)), snapshot(jobs, Limits(limits, groups), nodes)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(limited())
def test_any_policys_plan_fitted_keeps_every_limit(case: tuple[str, Snapshot]) -> None:
    name, snap = case
    plan = limited_schedule(POLICIES[name](0), snap)
    validate_limits(snap, plan)
    # and the fitting alone makes any plan of the unlimited policy keep them
    free = split_schedule(POLICIES[name](0), replace(snap, limits=Limits()))
    validate_limits(snap, fit_limits(snap, free))
    # fitted, a valid plan stays valid (fifo, tiresias and aiturbo plan a job that asked
    # for more GPUs than are free below its minimum, limits or not: not checked then)
    bounded = bounded_snapshot(snap)
    try:
        validate_plan(bounded, split_schedule(POLICIES[name](0), bounded))
    except PlanError:
        return
    validate_plan(snap, plan)
