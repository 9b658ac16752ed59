"""Per-user fairness inside the pool: each user's fair share split over their jobs
(``JobView.weight``), honoured by every policy, from Slurm's FairShare factors."""

from __future__ import annotations

from dataclasses import replace

import pytest

from hpcorch.controller.snapshot import MIN_SHARE, job_weights
from hpcorch.controller.store import JobRecord
from hpcorch.policy import POLICIES, make_policy
from hpcorch.policy.split import split_schedule
from hpcorch.policy.types import JobView, Snapshot, StepSample, validate_plan
from hpcorch.slurm.parse import parse_sshare


def _rec(sid: int, user: str, phase: str = "queued") -> JobRecord:
    return JobRecord(sid, f"k{sid}", "j", user, "", "app", 1, 4, 64, 64, 64, 0.0, phase, 0.0)


def test_weights_split_each_users_share_over_their_jobs() -> None:
    recs = [_rec(1, "alice"), _rec(2, "alice"), _rec(3, "alice"), _rec(4, "bob")]
    recs.append(_rec(5, "bob", phase="done"))  # finished jobs do not count
    w = job_weights(recs, {})
    assert w == pytest.approx({1: 2 / 3, 2: 2 / 3, 3: 2 / 3, 4: 2.0})
    assert sum(w[k] for k in (1, 2, 3)) == pytest.approx(w[4])  # one user, one share
    assert job_weights(recs[:3], {}) == {1: 1.0, 2: 1.0, 3: 1.0}  # all equal: exactly 1
    # Slurm's FairShare factors: bob used far more than his share
    w = job_weights([_rec(1, "alice"), _rec(4, "bob")], {"alice": 0.5, "bob": 0.0})
    assert w[1] / w[4] == pytest.approx(0.5 / MIN_SHARE)


def test_parse_sshare() -> None:
    text = "|1.000000\nalice|0.500000\nalice|0.750000\nbob|0.000000\ncarol|inf\n|x\n"
    assert parse_sshare(text) == {"alice": 0.75, "bob": 0.0}
    assert parse_sshare("|\nroot|0.000000\nalice|0.000000\n") == {}  # priority/basic


def _view(key: str, submit: float, weight: float, predictable: bool = True) -> JobView:
    return JobView(
        job_id=key,
        application="app",
        submit_time=submit,
        requested_gpus=2,
        requested_batch=64,
        min_gpus=2,
        max_gpus=2,
        min_batch=64,
        max_batch=64,
        min_micro_batch=32,
        max_micro_batch=32,
        max_epochs=1,
        progress_per_epoch_hint=100.0,
        predictable=predictable,
        weight=weight,
    )


def _snapshot(predictable: bool = True, weighted: bool = True) -> Snapshot:
    """Alice queued three jobs, then Bob one; room for two. Weights as job_weights
    gives them (Alice's share split three ways)."""
    wa, wb = (2 / 3, 2.0) if weighted else (1.0, 1.0)
    jobs = tuple(_view(f"a{i}", float(i), wa, predictable) for i in range(3))
    jobs += (_view("b0", 3.0, wb, predictable),)
    return Snapshot(now=10.0, node_gpus=(4,), jobs=jobs)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_policy_serves_the_user_with_one_job(name: str) -> None:
    snap = _snapshot()
    plan = make_policy(name, 0).schedule(snap)
    validate_plan(snap, plan)
    running = {p.job_id for p in plan.jobs if p.gpus}
    assert "b0" in running and len(running) == 2, (name, running)


@pytest.mark.parametrize("name", ["fifo", "tiresias", "share"])
def test_without_weights_arrival_order_decides(name: str) -> None:
    plan = make_policy(name, 0).schedule(_snapshot(weighted=False))
    assert {p.job_id for p in plan.jobs if p.gpus} == {"a0", "a1"}


def test_jobs_that_report_no_progress_are_ordered_by_weight_too() -> None:
    snap = _snapshot(predictable=False)
    plan = split_schedule(make_policy("ones", 0), snap)
    assert "b0" in {p.job_id for p in plan.jobs if p.gpus}


@pytest.mark.parametrize("weighted", [False, True])
def test_ones_gives_the_user_with_one_job_a_users_share(weighted: bool) -> None:
    """Four identical elastic jobs, three of Alice's and one of Bob's, on 8 GPUs: equal
    weights split the pool evenly; fair-share weights give Bob about what Alice's three
    jobs get together."""
    w = job_weights([_rec(i, "alice") for i in range(3)] + [_rec(3, "bob")], {})
    profile = (StepSample(1, 1, 32, 0.1, 0.0), StepSample(1, 2, 32, 0.11, 0.01))
    jobs = tuple(
        replace(
            _view(f"{'a' if i < 3 else 'b'}{i}", float(i), w[i] if weighted else 1.0),
            max_gpus=8,
            requested_gpus=1,
            min_gpus=1,
            max_batch=1024,
            profile=profile,
            progress=10.0,
            grad_sqr=1.0,
            grad_var=50.0,
        )
        for i in range(4)
    )
    snap = Snapshot(now=10.0, node_gpus=(4, 4), jobs=jobs)
    plan = make_policy("ones", 0).schedule(snap)
    gpus = {p.job_id: p.gpus for p in plan.jobs}
    alice = [gpus.get(f"a{i}", 0) for i in range(3)]
    if weighted:
        assert gpus["b3"] >= 4 and gpus["b3"] > max(alice), gpus
    else:
        assert set(gpus.values()) == {2}, gpus


def test_the_snapshot_carries_the_weights() -> None:
    from hpcorch.cluster import PoolNode
    from hpcorch.controller.snapshot import build_snapshot

    recs = [_rec(1, "alice"), _rec(2, "alice"), _rec(3, "bob")]
    nodes = [PoolNode("n1", 4, 0, True)]
    snap = build_snapshot(10.0, nodes, recs, {}, [], {}, 60.0, 30.0, None, {"bob": 0.5})
    weights = {j.job_id: j.weight for j in snap.jobs}
    assert weights["1"] == weights["2"] and weights["3"] / weights["1"] == pytest.approx(1.0)
    snap = build_snapshot(10.0, nodes, recs, {}, [], {}, 60.0, 30.0)
    weights = {j.job_id: j.weight for j in snap.jobs}
    assert weights["3"] / weights["1"] == pytest.approx(2.0)
