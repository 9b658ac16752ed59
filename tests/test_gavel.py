"""Gavel's heterogeneity-aware LAS (hpcorch.policy.gavel): the max-min solve and the
round-based mechanism, on fake snapshots with made-up per-type throughputs."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from hpcorch.policy import gavel
from hpcorch.policy.common import split_batch
from hpcorch.policy.gavel import GavelPolicy, max_min_shares
from hpcorch.policy.types import JobView, Plan, Snapshot, StepSample, validate_plan

Speeds = dict[str, dict[str, float]]


def _job(name: str, **kw: object) -> JobView:
    base = JobView(
        job_id=name,
        application="app-" + name,
        submit_time=float(ord(name[-1])),
        requested_gpus=1,
        requested_batch=32,
        min_gpus=1,
        max_gpus=8,
        min_batch=32,
        max_batch=256,
        min_micro_batch=1,
        max_micro_batch=32,
        max_epochs=10,
        progress_per_epoch_hint=1000.0,
    )
    return replace(base, **kw)  # type: ignore[arg-type]


def _snap(jobs: list[JobView], gpus: tuple[int, ...], kinds: tuple[str, ...] = ()) -> Snapshot:
    return Snapshot(now=0.0, node_gpus=gpus, jobs=tuple(jobs), node_types=kinds)


@pytest.fixture
def speeds(monkeypatch: pytest.MonkeyPatch) -> Speeds:
    """Throughput of each job on each type (missing: unknown), in place of the estimates."""
    table: Speeds = {}

    def fake(snapshot: Snapshot, top: int) -> SimpleNamespace:
        types = snapshot.gpu_types
        est = []
        for t in types:
            time = np.full((len(snapshot.jobs), top + 1), np.inf)
            for j, job in enumerate(snapshot.jobs):
                if table.get(job.job_id, {}).get(t):
                    time[j, 1:] = 1.0 / table[job.job_id][t]
            est.append(SimpleNamespace(time=time))
        accepts = np.array(
            [[not j.gpu_types or t in j.gpu_types for t in types] for j in snapshot.jobs]
        )
        return SimpleNamespace(types=types, est=tuple(est), accepts=accepts)

    monkeypatch.setattr(gavel, "_typed_estimates", fake)
    return table


def _advance(snapshot: Snapshot, plan: Plan, dt: float) -> Snapshot:
    """The next round's snapshot: every job where ``plan`` put it, ``dt`` seconds later."""
    by_id = plan.by_id()
    jobs = []
    for j in snapshot.jobs:
        p = by_id.get(j.job_id)
        if p is None:
            jobs.append(replace(j, gpus=0, placement={}, gpu_type="", batch=0))
        else:
            jobs.append(
                replace(
                    j,
                    gpus=p.gpus,
                    placement=dict(p.placement),
                    gpu_type=p.gpu_type,
                    batch=p.global_batch,
                    micro_batch=p.micro_batch,
                    accum_steps=p.accum_steps,
                )
            )
    return replace(snapshot, now=snapshot.now + dt, jobs=tuple(jobs))


def _check(snapshot: Snapshot, plan: Plan) -> None:
    """Valid, one type per job, the type the plan names, a type the job accepts."""
    validate_plan(snapshot, plan)
    jobs = {j.job_id: j for j in snapshot.jobs}
    for p in plan.jobs:
        kinds = {snapshot.node_types[n] for n in p.placement} if snapshot.gpu_types else {""}
        assert len(kinds) == 1, p
        assert p.gpu_type == next(iter(kinds))
        accepted = jobs[p.job_id].gpu_types
        assert not accepted or p.gpu_type in accepted


def test_max_min_level_on_a_hand_computed_two_by_two() -> None:
    # Jobs 1, 2 run 4 and 2 steps/s on type A (1 GPU), 1 and 1 on type B (2 GPUs), one GPU
    # each. An equal 1/2 share is half of A's GPU and one of B's: time 0.5 + 1 = 1.5, scaled
    # to 1/3 on A and 2/3 on B, so X^eq = 4/3 + 2/3 = 2 and 2/3 + 2/3 = 4/3. Normalized
    # rates: job 1 (2, 1/2), job 2 (3/2, 3/4). B has room for both full time, so each runs
    # all its time: with p = job 1's share of A (job 2 has 1 - p), job 1 gets 1/2 + 3p/2
    # and job 2 gets 3/4 + 3(1 - p)/4. Equal at p = 4/9: the level is 1/2 + 2/3 = 7/6.
    thr = np.array([[4.0, 1.0], [2.0, 1.0]])
    args = (thr, np.ones(2), np.ones((2, 2)), np.array([1.0, 2.0]))
    x, level = max_min_shares(*args, spread=False)
    assert level == pytest.approx(7 / 6, rel=1e-6)
    x, level = max_min_shares(*args)
    assert level == pytest.approx(7 / 6, rel=1e-5)
    np.testing.assert_allclose(x, [[4 / 9, 5 / 9], [5 / 9, 4 / 9]], atol=1e-4)


def test_max_min_on_one_type_is_weighted_least_attained_service() -> None:
    # 2 GPUs, three jobs; job 3 takes 2 GPUs and weighs 2. Equal shares (2/3 of a GPU
    # each) are 2/3, 2/3 and 1/3 of the time: the rates are 3/2, 3/2, 3. Level t with
    # 3/2 x1 = 3/2 x2 = t, 3 x3 = 2t on x1 + x2 + 2 x3 = 2 GPUs: 8t/3 = 2, t = 3/4.
    x, level = max_min_shares(
        np.ones((3, 1)), np.array([1.0, 1.0, 2.0]), np.array([[1], [1], [2]]), np.array([2.0])
    )
    assert level == pytest.approx(0.75, rel=1e-5)
    np.testing.assert_allclose(x[:, 0], [0.5, 0.5, 0.5], atol=1e-4)
    x, level = max_min_shares(np.ones((3, 1)), np.ones(3), np.ones((3, 1)), np.array([2.0]))
    np.testing.assert_allclose(x[:, 0], 2 / 3, atol=1e-4)


def test_no_feasible_allocation_beats_the_max_min_level() -> None:
    rng = np.random.default_rng(7)
    for _ in range(20):
        n, T = int(rng.integers(2, 7)), int(rng.integers(1, 4))
        thr = rng.uniform(0.1, 1.0, (n, T)) * (rng.random((n, T)) > 0.25)
        thr[:, 0] += thr.sum(1) == 0
        cap = rng.integers(1, 6, T).astype(float)
        scale = np.minimum(rng.choice([1, 2, 4], n)[:, None], cap[None, :])
        w = rng.choice([0.5, 1.0, 2.0], n)
        x, level = max_min_shares(thr, w, scale, cap)
        assert (x >= 0).all() and (x.sum(1) <= 1 + 1e-6).all()
        assert ((scale * x).sum(0) <= cap + 1e-6).all()
        assert (x[thr == 0] == 0).all()
        # the same normalization for random feasible allocations: never a higher level
        eq = np.where(thr > 0, cap / (n * scale), 0.0)
        eq /= np.maximum(eq.sum(1, keepdims=True), 1.0)
        a = thr / (thr * eq).sum(1, keepdims=True)
        assert level >= ((a * eq).sum(1) / w).min() - 1e-6  # the equal share itself
        for _ in range(200):
            y = rng.random((n, T)) * (thr > 0)
            y /= np.maximum(y.sum(1, keepdims=True), 1.0)
            y /= max(1.0, ((scale * y).sum(0) / cap).max())
            assert level >= ((a * y).sum(1) / w).min() - 1e-6


def test_the_job_that_gains_most_from_the_fast_type_gets_it(speeds: Speeds) -> None:
    speeds.update({"a": {"fast": 3.0, "slow": 1.0}, "b": {"fast": 1.0, "slow": 1.0}})
    policy = GavelPolicy(round_s=60.0)
    snap = _snap([_job("a"), _job("b")], (1, 1), ("fast", "slow"))
    for _ in range(4):
        plan = policy.schedule(snap)
        _check(snap, plan)
        assert {p.job_id: p.gpu_type for p in plan.jobs} == {"a": "fast", "b": "slow"}
        snap = _advance(snap, plan, 60.0)


def test_plans_are_valid_keep_one_type_and_honour_accepted_types(speeds: Speeds) -> None:
    speeds.update({f"j{i}": {"a": 1.0 + i, "b": 2.0} for i in range(9)})
    jobs = [
        _job(f"j{i}", requested_gpus=g, gpu_types=acc)
        for i, (g, acc) in enumerate(
            [(1, ()), (2, ("a",)), (4, ()), (8, ("b",)), (1, ("b",)), (2, ()), (3, ()), (1, ())]
        )
    ]
    jobs.append(_job("j8", requested_gpus=2, gpu_types=("c",)))  # no such type here
    snap = _snap(jobs, (4, 4, 4, 4, 2), ("a", "a", "b", "b", "a"))
    policy = GavelPolicy(round_s=60.0)
    ran: set[str] = set()
    for _ in range(8):
        plan = policy.schedule(snap)
        _check(snap, plan)
        free = {t: 0 for t in "ab"}
        for n, t in zip(snap.node_gpus, snap.node_types, strict=True):
            free[t] += n
        for p in plan.jobs:
            free[p.gpu_type] -= p.gpus
        for j in jobs:  # work conserving: a job left out fits nowhere it may go
            if j.job_id not in plan.by_id():
                assert all(j.requested_gpus > free[t] for t in j.gpu_types or "ab" if t in free)
        assert "j8" not in plan.by_id()
        for p in plan.jobs:
            job = next(j for j in jobs if j.job_id == p.job_id)
            assert p.gpus == job.requested_gpus
            assert p.global_batch == split_batch(job, p.gpus, job.requested_batch)[0]
        ran |= set(plan.by_id())
        snap = _advance(snap, plan, 60.0)
    assert ran == {f"j{i}" for i in range(8)}


def test_a_job_starved_one_round_runs_the_next() -> None:
    jobs = [_job(n) for n in "abc"]
    snap = _snap(jobs, (2,))
    policy = GavelPolicy(round_s=60.0)
    before: set[str] = set()
    runs = dict.fromkeys("abc", 0)
    for r in range(9):
        plan = policy.schedule(snap)
        _check(snap, plan)
        now = set(plan.by_id())
        assert len(now) == 2
        if r:
            assert set("abc") - before <= now  # the one left out last round
        for k in now:
            runs[k] += 1
        before = now
        snap = _advance(snap, plan, 60.0)
    assert runs == dict.fromkeys("abc", 6)


def test_between_rounds_running_jobs_keep_their_gpus() -> None:
    snap = _snap([_job("a"), _job("b")], (2,))
    policy = GavelPolicy(round_s=360.0)
    snap = _advance(snap, policy.schedule(snap), 60.0)
    snap = replace(snap, jobs=(*snap.jobs, _job("c")))
    plan = policy.schedule(snap)
    assert set(plan.by_id()) == {"a", "b"}
    snap = _advance(snap, plan, 300.0)  # a new round: the newcomer first
    assert "c" in policy.schedule(snap).by_id()


def test_a_fixed_job_keeps_its_gpus(speeds: Speeds) -> None:
    speeds.update({"a": {"x": 1.0, "y": 9.0}, "b": {"x": 1.0, "y": 9.0}})
    fixed = _job(
        "a", gpus=1, placement={1: 1}, gpu_type="y", batch=32, micro_batch=32, resizable=False
    )
    snap = _snap([fixed, _job("b", requested_gpus=2)], (2, 2), ("x", "y"))
    policy = GavelPolicy(round_s=0.0)
    for _ in range(3):
        plan = policy.schedule(snap)
        _check(snap, plan)
        assert dict(plan.by_id()["a"].placement) == {1: 1}
        assert "b" not in plan.by_id() or plan.by_id()["b"].gpu_type == "x"
        snap = _advance(snap, plan, 60.0)


def test_a_request_larger_than_a_type_runs_on_all_of_it(speeds: Speeds) -> None:
    snap = _snap([_job("a", requested_gpus=8, gpu_types=("b",))], (4, 2), ("a", "b"))
    plan = GavelPolicy().schedule(snap)
    _check(snap, plan)
    assert plan.by_id()["a"].placement == {1: 2}


def test_empty_snapshot_empty_plan() -> None:
    assert GavelPolicy().schedule(_snap([], (4, 4), ("a", "b"))) == Plan()
    assert GavelPolicy().schedule(_snap([_job("a")], ())) == Plan()


def test_with_the_real_per_type_estimates() -> None:
    pytest.importorskip("hpcorch.policy.typed")
    prof = (StepSample(1, 1, 32, 0.1, 0.0, 1, "a"), StepSample(1, 2, 16, 0.06, 0.01, 1, "a"))
    jobs = [_job("m", profile=prof), _job("n"), _job("o", requested_gpus=2, profile=prof)]
    snap = _snap(jobs, (2, 2), ("a", "b"))
    policy = GavelPolicy(round_s=60.0)
    for _ in range(3):
        plan = policy.schedule(snap)
        _check(snap, plan)
        assert plan.jobs
        snap = _advance(snap, plan, 60.0)
