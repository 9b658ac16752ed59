"""Pooled knowledge is per owner unless the site opts in, and then robust to lying jobs.

Jobs report step times as the controller stores them: one median per configuration,
without the all-reduce part (``sync_time`` 0). The honest model below is what every honest
job measures; liars claim what they like, at shapes of their choosing.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
import pytest

from hpcorch.model.throughput import Network
from hpcorch.policy.estimate import estimate
from hpcorch.policy.pooling import AcrossOwners, group_of, model_keys, owner_of
from hpcorch.policy.share import SharePolicy
from hpcorch.policy.types import CompletedJob, JobView, Plan, Snapshot, StepSample

NODES = (4, 4)
FP = "model:Net:250:1000"
HONEST = [(1, 1, 32), (1, 2, 32), (1, 4, 32), (1, 4, 64), (2, 8, 32)]
"""(nodes, GPUs, micro-batch) an honest owner measured."""


def honest_time(nodes: int, gpus: int, micro: int, accum: int = 1) -> float:
    compute = 0.01 + 0.002 * micro
    sync = 0.0 if gpus == 1 else (0.02 * (gpus - 1) if nodes == 1 else 0.15)
    return accum * compute + sync


def profile(configs: list[tuple[int, int, int]], factor: float = 1.0) -> tuple[StepSample, ...]:
    return tuple(StepSample(n, g, m, honest_time(n, g, m) * factor, 0.0) for n, g, m in configs)


def job(job_id: str, app: str, prof: tuple[StepSample, ...]) -> JobView:
    return JobView(
        job_id, app, 0.0, 1, 64, 1, 8, 64, 512, 1, 64, 10, 100.0, gpus=2,
        placement={0: 2}, batch=64, micro_batch=32, profile=prof, model_bytes=4000,
    )  # fmt: skip


def done(job_id: str, app: str, prof: tuple[StepSample, ...]) -> CompletedJob:
    return CompletedJob(job_id, app, 100.0, 200.0, 10.0, 1, prof, (), (), 4000)


def honest_site() -> tuple[tuple[JobView, ...], tuple[CompletedJob, ...]]:
    """alice's running job (measured on 1 and 2 GPUs), bob's and carol's finished ones."""
    alice = job("a1", f"alice/{FP}", profile(HONEST[:2]))
    return (alice,), (done("b1", f"bob/{FP}", profile(HONEST)),
                      done("c1", f"carol/{FP}", profile(HONEST[1:])))  # fmt: skip


LIES = [(1, 2, 32), (1, 4, 32), (2, 8, 32), (2, 8, 64)]
"""Where the colluders claim their throughput: shapes the honest jobs ran, and beyond."""


def colluders(owners: list[str], factor: float) -> tuple[JobView, ...]:
    return tuple(job(f"m{i}", f"{o}/{FP}", profile(LIES, factor)) for i, o in enumerate(owners, 1))


def same_row(got: np.ndarray, want: np.ndarray) -> None:
    """One job's predicted times (the table's width follows the widest job)."""
    np.testing.assert_allclose(got[: len(want)], want, rtol=1e-12)
    assert np.isinf(got[len(want) :]).all()


def test_keys_name_their_owner_and_only_a_fingerprint_is_shared_across_owners() -> None:
    assert owner_of(f"alice/{FP}") == owner_of("alice/train") == "alice"
    assert owner_of("job:5") == owner_of("cifar10") == ""
    assert group_of(f"alice/{FP}", across_owners=False) == f"alice/{FP}"
    assert group_of(f"alice/{FP}", across_owners=True) == FP
    for own in ("alice/train", "job:5", "cifar10"):  # a name its user chose: never shared
        assert group_of(own, across_owners=True) == own


def test_by_default_a_job_of_one_owner_never_joins_another_owner_s_group() -> None:
    jobs, history = honest_site()
    mallory = colluders(["mallory"] * 3, 0.01)
    keys, hist = model_keys(jobs + mallory, history)
    assert keys["a1"] == f"alice/{FP}"
    assert set(hist.values()) == {f"bob/{FP}", f"carol/{FP}"}
    assert {keys[j.job_id] for j in mallory} == {f"mallory/{FP}"}
    net = Network()
    est = estimate(Snapshot(0.0, NODES, jobs + mallory, history), network=net)
    alone = estimate(Snapshot(0.0, NODES, jobs, ()), network=net)
    same_row(est.time[0], alone.time[0])


def test_the_site_opt_in_pools_honest_owners() -> None:
    jobs, history = honest_site()
    keys, hist = model_keys(jobs, history, across_owners=True)
    assert keys == {"a1": FP} and set(hist.values()) == {FP}
    est = estimate(Snapshot(0.0, NODES, jobs, history, pool_across_owners=True))
    assert est.keys == {"a1": FP}
    assert est.models[FP].max_gpus_seen == 8  # bob's measurements reach alice's job


def test_three_colluding_jobs_leave_the_group_and_move_nothing() -> None:
    """Three jobs of mallory claim 100x the honest throughput on 2-8 GPUs: with the site's
    opt-in they are modelled on their own, and what the policy predicts for alice's job is
    what it predicts without them."""
    jobs, history = honest_site()
    mallory = colluders(["mallory"] * 3, 0.01)
    keys, _ = model_keys(jobs + mallory, history, across_owners=True)
    assert keys["a1"] == FP
    assert all(keys[m.job_id] != FP for m in mallory)
    net = Network()
    snap = Snapshot(0.0, NODES, jobs + mallory, history, pool_across_owners=True)
    est = estimate(snap, network=net)
    ref = estimate(replace(snap, jobs=jobs), network=net)
    same_row(est.time[0], ref.time[0])


def test_points_without_a_sync_time_no_longer_escape_the_check() -> None:
    """alice's own two jobs under one name: one measured on several GPUs only (no sync
    time, so nothing the old check compared) at a tenth of the other's step times."""
    a = job("a1", "alice/train", profile(HONEST))
    b = job("a2", "alice/train", profile(HONEST[1:4], 0.1))
    keys, _ = model_keys((a, b), ())
    assert keys["a1"] != keys["a2"]  # which of two is the other model, nothing tells
    fine = job("a3", "alice/train", profile(HONEST[1:4], 1.3))  # within the tolerance
    keys, _ = model_keys((a, fine), ())
    assert keys["a3"] == "alice/train"


def test_a_single_absurd_point_is_enough_to_leave() -> None:
    """Honest everywhere but at one shape nobody else measured, where it claims 20x."""
    jobs, history = honest_site()
    sly = job("m1", f"mallory/{FP}", profile(HONEST[:4]) + profile([(2, 8, 64)], 0.05))
    keys, _ = model_keys((*jobs, sly), history, across_owners=True)
    assert keys["m1"] != FP and keys["a1"] == FP


def test_liars_within_the_tolerance_are_outvoted_per_configuration() -> None:
    """Three jobs of one owner claim 0.6x the honest step times (inside the factor 2 a
    job's own noise may take): they stay in the group, one owner's vote against two, and
    move no configuration an honest owner measured."""
    jobs, history = honest_site()
    mallory = colluders(["mallory"] * 3, 0.6)
    keys, _ = model_keys(jobs + mallory, history, across_owners=True)
    assert {keys[j] for j in ("a1", "m1", "m2", "m3")} == {FP}
    est = estimate(Snapshot(0.0, NODES, jobs + mallory, history, pool_across_owners=True))
    measured = {(n, g, m) for n, g, m in HONEST}
    for s in est.models[FP].samples:
        true = honest_time(s.nodes, s.gpus, s.micro_batch)
        # where honest owners measured: their value; where only mallory did, mallory's
        want = true if (s.nodes, s.gpus, s.micro_batch) in measured else 0.6 * true
        assert s.step_time == pytest.approx(want)


@pytest.mark.parametrize("factor", [0.01, 0.3, 4.0, 100.0])
@pytest.mark.parametrize("liars", [["m"] * 3, ["m1", "m2", "m3"]])
@pytest.mark.parametrize("honest", [1, 2, 3])
def test_no_group_holds_an_honest_job_and_a_liar(
    factor: float, liars: list[str], honest: int
) -> None:
    """Whoever outnumbers whom, an honest job is never modelled together with a liar: the
    liars leave, or (where they are the majority) the honest jobs do."""
    owners = ["alice", "bob", "carol"][:honest]
    good = tuple(job(f"h{i}", f"{o}/{FP}", profile(HONEST[i % 2 :])) for i, o in enumerate(owners))
    bad = colluders(liars, factor)
    keys, _ = model_keys(good + bad, (), across_owners=True)
    honest_keys = {keys[j.job_id] for j in good}
    assert not honest_keys & {keys[j.job_id] for j in bad}
    if honest > len(set(liars)):  # the honest owners are the majority: they stay pooled
        assert honest_keys == {FP}


class Seen:
    name = "seen"
    sees_fixed = True

    def __init__(self) -> None:
        self.flags: list[bool] = []

    def schedule(self, snapshot: Snapshot) -> Plan:
        self.flags.append(snapshot.pool_across_owners)
        return SharePolicy().schedule(snapshot)


def test_the_opt_in_is_a_wrapper_around_any_policy() -> None:
    inner = Seen()
    policy = AcrossOwners(inner)
    assert policy.name == "seen" and policy.sees_fixed is True
    jobs, history = honest_site()
    policy.schedule(Snapshot(0.0, NODES, jobs, history))
    inner.schedule(Snapshot(0.0, NODES, jobs, history))
    assert inner.flags == [True, False]


def test_many_groups_stay_fast() -> None:
    """One check per group and job: 300 jobs of 30 owners in one group."""
    import time

    jobs = tuple(
        job(f"j{i}", f"u{i % 30}/{FP}", profile(HONEST[i % 3 :]))
        for i in itertools.islice(itertools.count(), 300)
    )
    t0 = time.perf_counter()
    keys, _ = model_keys(jobs, (), across_owners=True)
    assert time.perf_counter() - t0 < 2.0
    assert set(keys.values()) == {FP}
