"""The production controller under Slurm's limits, over the simulated Slurm
(hpcorch/sim/limits.py), which keeps a launch over a limit pending with Slurm's reason as
slurmctld does: an elastic 1-8 GPU job under a QOS cap of 2 GPUs per user is planned at 2
when the limits can be read, and when they cannot, its refused launch is held within the
cycle and it runs at 2; the caps taught are kept across a controller restart and
unlearned when the limits read show more room; jobs over a per-job cap, a count of
running jobs, and users' jobs outside the pool, all within their limits."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcorch.controller.learned import META_KEY, Learned, keep, loads
from hpcorch.controller.loop import Controller, LoopConfig
from hpcorch.controller.store import Store
from hpcorch.limits import Amounts, Cap, LimitBook
from hpcorch.policy import make_policy
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.costs import ResizeCost
from hpcorch.sim.engine import SimCluster
from hpcorch.sim.limits import SimLimits
from hpcorch.sim.loop import SimConfig
from hpcorch.sim.slurm_side import SimSlurm
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

CFG = SimConfig(nodes=2, gpus_per_node=4, round_s=60.0)
ONE = [WorkloadJob("cifar10-0", 0.0, "cifar10", 8, 256)]


def _peak(
    apps: dict[str, AppTrace], jobs: list[WorkloadJob], limits: SimLimits, policy: str = "share"
) -> tuple[dict[str, int], float, float]:
    """(each user's most GPUs at once, the longest a launch waited pending for a limit,
    how many did) of a controlled simulation."""
    peak: dict[str, int] = {}

    def watch(world: SimCluster) -> None:
        held: dict[str, int] = {}
        for i, m in enumerate(world.jobs):  # the workload's order: users in turn
            held[limits.user(i)] = held.get(limits.user(i), 0) + m.gpus
        for u, g in held.items():
            peak[u] = max(peak.get(u, 0), g)

    res = simulate_controlled(
        jobs, make_policy(policy, 0), apps, CFG, on_round=watch, limits=limits
    )
    assert all(j.jct > 0 for j in res.jobs)
    return peak, res.extra["limit_pending_max_s"], res.extra["limit_pending"]


@pytest.mark.parametrize("policy", ["share", "ones"])
def test_the_issues_case_planned_within_the_read_limit(
    apps: dict[str, AppTrace], policy: str
) -> None:
    peak, _, refused = _peak(apps, ONE, SimLimits(user_gpus=2), policy)
    assert peak == {"u0": 2}
    assert refused == 0  # no launch was ever kept pending for the limit


def test_a_limit_that_cannot_be_read_is_learned_within_a_cycle(
    apps: dict[str, AppTrace],
) -> None:
    """Before: planned at 8, pending QOSMaxGRESPerUser, held after 90 s, planned at 8
    again, for ever (the simulation never ended)."""
    peak, waited, refused = _peak(apps, ONE, SimLimits(user_gpus=2, visible=False))
    assert peak == {"u0": 2}
    assert refused >= 1 and waited <= 1.0  # held at the next (fast) cycle


def test_jobs_users_and_jobs_outside_the_pool(apps: dict[str, AppTrace]) -> None:
    jobs = [WorkloadJob(f"cifar10-{i}", 10.0 * i, "cifar10", 4, 256) for i in range(4)]
    limits = SimLimits(users=2, user_gpus=3, job_gpus=2, user_jobs=2, outside={"u1": 1})
    peak, _, refused = _peak(apps, jobs, limits)
    assert peak["u0"] <= 3 and peak["u1"] <= 2, peak  # u1 holds 1 outside the pool
    assert refused == 0
    hidden = SimLimits(users=2, user_gpus=3, job_gpus=2, outside={"u1": 1}, visible=False)
    peak, waited, _ = _peak(apps, jobs, hidden)
    assert peak["u0"] <= 3 and peak["u1"] <= 2, peak
    assert waited <= 1.0


def test_learned_caps_survive_a_restart_and_are_unlearned_by_a_read(
    apps: dict[str, AppTrace], tmp_path: Path
) -> None:
    side = SimSlurm(ONE, apps, CFG.node_gpus, ResizeCost(), limits=SimLimits(user_gpus=2,
                    visible=False))  # fmt: skip
    store = Store(tmp_path / "state.db", clock=side.now)
    ctl = Controller(side, store, make_policy("share", 0), LoopConfig(round_s=0))
    for _ in range(30):  # until it runs: refused at 8, then at 4, runs at 2
        side.advance(1.0)
        ctl.cycle()
        if ctl.records.active()[0].phase == "running":
            break
    assert ctl.records.active()[0].gpus == 2
    taught = loads(store.get_meta(META_KEY))
    assert [(c.key, c.dim, c.value, c.reason) for c in taught] == [
        ("user/u0", "gpus", 2, "QOSMaxGRESPerUser")
    ]
    store.close()
    again = Controller(side, Store(tmp_path / "state.db", clock=side.now),
                       make_policy("share", 0), LoopConfig(round_s=0))  # fmt: skip
    assert again.limits.learned == taught
    # a read of the limits that shows more room than when the cap was learned unlearns it
    cap = Learned("qos/normal/user/u0", "gpus", 2, "QOSMaxGRESPerUser", 10.0, 1000, "u0", 2)
    rec = again.records.active()[0]
    book = LimitBook(
        {cap.key: Cap(cap.key, "QOS normal MaxTRESPerUser", limit=Amounts(gpus=8))},
        {rec.slurm_id: (cap.key,)},
        read_at=20.0,
    )
    assert not keep(cap, [rec], book, 30.0)
    tight = LimitBook(book.caps, book.jobs, read_at=5.0)  # read before it was learned
    assert keep(cap, [rec], tight, 30.0)
