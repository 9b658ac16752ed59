"""The production controller over the simulated Slurm side: the default engine."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from hpcorch.planner import plan_batch
from hpcorch.policy import make_policy
from hpcorch.policy.common import place_packed, split_batch
from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.types import JobPlan, Plan, Policy, Snapshot
from hpcorch.sim.config import SimConfig
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.costs import ResizeCost
from hpcorch.sim.engine import SimCluster
from hpcorch.sim.loop import SimResult, simulate
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob, load_workload

COST = ResizeCost()


def _isolated(app: AppTrace, gpus: int, batch: int, start: float, cfg: SimConfig) -> float:
    """Seconds from ``start`` to the end of a job alone at a fixed configuration."""
    bp = plan_batch(batch, gpus, app.max_micro)
    full, rem = divmod(gpus, cfg.gpus_per_node)
    counts = (cfg.gpus_per_node,) * full + ((rem,) if rem else ())
    micro = min(max(bp.micro_batch, app.min_micro), app.max_micro)
    it = app.iteration_time(counts, micro, bp.accum_steps)
    run = sum(
        (app.epoch_end[e + 1] - app.epoch_end[e]) * it / app.gain(bp.global_batch, e)
        for e in range(app.epochs)
    )
    return start + COST.startup_s + run


@pytest.mark.parametrize(
    ("app", "gpus", "batch", "interval"),
    [("ncf", 1, 256, 60.0), ("cifar10", 4, 512, 10.0), ("bert", 8, 96, 10.0)],
)
def test_single_job_alone_finishes_in_its_isolated_time(
    apps: dict[str, AppTrace], app: str, gpus: int, batch: int, interval: float
) -> None:
    cfg = SimConfig()
    job = WorkloadJob(f"{app}-0", 17.0, app, gpus, batch)
    res = simulate_controlled([job], make_policy("fifo"), apps, cfg, interval_s=interval)
    # the first cycle after the arrival adopts the job and starts it
    start = math.floor(job.time / interval + 1) * interval
    expect = _isolated(apps[app], gpus, batch, start, cfg) - job.time
    assert res.jobs[0].jct == pytest.approx(expect, abs=0.5 * apps[app].epochs + 1)
    assert res.jobs[0].restarts == 0
    assert res.jobs[0].queueing_delay == pytest.approx(start - job.time)


def _jobs(data_dir: Path, apps: dict[str, AppTrace], name: str, n: int) -> list[WorkloadJob]:
    path = data_dir / "workloads" / f"{name}.csv"
    if not path.is_file():
        pytest.skip(f"no workload {path}")
    return load_workload(path, apps)[:n]


def _check_allocation(peak: list[int]) -> Callable[[SimCluster], None]:
    def check(world: SimCluster) -> None:
        per_node = [0] * len(world.node_gpus)
        for j in world.jobs:
            for node, n in j.placement:
                per_node[node] += n
        assert all(u <= g for u, g in zip(per_node, world.node_gpus, strict=True)), per_node
        peak[0] = max(peak[0], sum(per_node))

    return check


def _completed(res: SimResult, n: int, gpus: int, peak: int) -> None:
    assert len(res.jobs) == n
    assert all(j.jct > 0 and j.queueing_delay >= 0 for j in res.jobs)
    assert res.avg_jct >= res.lower_bound * 0.999
    assert 0 < peak <= gpus
    assert max(u for _, u in res.timeline) <= gpus
    assert res.decision_s and res.extra["slurm_calls"] > 0


def test_first_jobs_of_a_workload_complete_under_fifo(
    data_dir: Path, apps: dict[str, AppTrace]
) -> None:
    jobs = _jobs(data_dir, apps, "load-1.0/workload-3", 10)
    peak = [0]
    cfg = SimConfig(nodes=4, gpus_per_node=4)
    res = simulate_controlled(jobs, make_policy("fifo"), apps, cfg, _check_allocation(peak))
    _completed(res, len(jobs), 16, peak[0])
    assert all(j.restarts == 0 for j in res.jobs)  # FIFO never resizes: one launch each
    assert res.extra["rebatches"] == 0  # nor changes a batch


def test_small_workload_completes_under_ones(
    apps: dict[str, AppTrace], small_workload: Path
) -> None:
    jobs = load_workload(small_workload, apps)
    peak = [0]
    cfg = SimConfig(nodes=2, gpus_per_node=4)
    a = simulate_controlled(jobs, make_policy("ones", 5), apps, cfg, _check_allocation(peak))
    _completed(a, len(jobs), 8, peak[0])
    assert a.extra["resizes"] > 0  # ONES resized through checkpoint -> requeue -> start
    b = simulate_controlled(jobs, make_policy("ones", 5), apps, cfg)  # same seed, same run
    assert [(j.jct, j.restarts) for j in a.jobs] == [(j.jct, j.restarts) for j in b.jobs]
    assert a.timeline == b.timeline


@pytest.mark.parametrize("policy", ["tiresias", "ones"])
def test_skipping_idle_cycles_changes_nothing(
    apps: dict[str, AppTrace], small_workload: Path, policy: str
) -> None:
    """The driver jumps over cycles in which nothing could be seen; running every cycle
    (1 s while a job starts or stops, 10 s else) gives the same run. A simulated job writes
    a steps line when the world is advanced at least ``report_s`` past its last one (its
    first at a batch it was given live when it is 5 s past the change), so the lines'
    windows follow the driver's steps: the gradient-noise samples ONES picks its
    batch sizes from differ a little (same decisions, JCTs within 1%); a policy that
    reads no samples (Tiresias) gives exactly the same run. ONES holds a job that is
    probing its batch until the probe's steps line is in, so the hold's length follows the
    same windows: in five jobs that alone moves whole decisions, so it is off here (on the
    bundled workloads both drivers agree with it on: docs/benchmarks.md). Fewer than half
    the cycles are run (a first report at a new batch is an event: it brings the next
    round forward)."""
    jobs = load_workload(small_workload, apps)
    cfg = SimConfig(nodes=2, gpus_per_node=4)

    def make() -> Policy:
        return OnesPolicy(seed=3, probe_hold_s=0.0) if policy == "ones" else make_policy(policy, 3)

    fast = simulate_controlled(jobs, make(), apps, cfg)
    every = simulate_controlled(jobs, make(), apps, cfg, jump=False)
    assert [j.restarts for j in fast.jobs] == [j.restarts for j in every.jobs]
    if policy == "tiresias":
        assert [j.jct for j in fast.jobs] == [j.jct for j in every.jobs]
    else:
        assert [j.jct for j in fast.jobs] == pytest.approx([j.jct for j in every.jobs], rel=0.01)
    assert fast.extra["cycles"] < every.extra["cycles"] / 2


@pytest.mark.parametrize("policy", ["fifo", "tiresias"])
def test_the_direct_loop_agrees_when_it_models_the_same_loop(
    data_dir: Path, apps: dict[str, AppTrace], policy: str
) -> None:
    """The direct loop (one round a minute, a flat restart cost) is the oracle: the
    controller engine cycling once a round with the same costs gives the same figures."""
    jobs = _jobs(data_dir, apps, "load-1.0/workload-6", 60)
    cfg = SimConfig(restart_cost=30.0)
    direct = simulate(jobs, make_policy(policy), apps, cfg)
    ctl = simulate_controlled(
        jobs,
        make_policy(policy),
        apps,
        cfg,
        cost=ResizeCost(0.0, 0.0, 0.0, 30.0),
        interval_s=60.0,
        fast_interval_s=60.0,
    )
    assert ctl.avg_jct == pytest.approx(direct.avg_jct, rel=0.01)


class FlipFlop:
    """A policy that resizes every job every round (1 GPU, then 2, then 1, ...)."""

    name = "flipflop"

    def __init__(self) -> None:
        self.rounds = 0

    def schedule(self, snapshot: Snapshot) -> Plan:
        self.rounds += 1
        free = list(snapshot.node_gpus)
        plans = []
        for j in snapshot.jobs:
            want = 1 + (self.rounds + int(j.job_id)) % 2
            if not j.resizable and j.gpus:  # the controller will not move it now
                want = j.gpus
            where = place_packed(free, want)
            if where is not None:
                batch, micro, accum = split_batch(j, want, j.min_batch * want)
                plans.append(JobPlan(j.job_id, want, where, batch, micro, accum))
        return Plan(tuple(plans))


def test_a_policy_that_resizes_every_round_cannot_starve_a_job(
    apps: dict[str, AppTrace],
) -> None:
    """Rounds every 10 s, a start-up of 22 s: resized at every round a job would never
    train. The controller stops a launch only once it trained for its restart cost (and
    min_run_s): every job finishes and every launch makes progress."""
    jobs = [WorkloadJob(f"ncf-{i}", 20.0 * i, "ncf", 1, 256) for i in range(4)]
    cfg = SimConfig(nodes=1, gpus_per_node=8, round_s=10.0)
    policy = FlipFlop()
    res = simulate_controlled(jobs, policy, apps, cfg)
    assert len(res.jobs) == 4 and all(j.jct > 0 for j in res.jobs)
    assert sum(j.restarts for j in res.jobs) > 4  # it did resize them
    min_launch = COST.startup_s + max(60.0, COST.total)
    for j in res.jobs:
        assert (j.restarts + 1) * min_launch <= j.jct + min_launch


def test_ones_finishes_every_job_of_a_busy_workload(
    data_dir: Path, apps: dict[str, AppTrace]
) -> None:
    """The first 30 jobs of load-1.0 workload-6 once left 3 jobs running forever."""
    jobs = _jobs(data_dir, apps, "load-1.0/workload-6", 30)
    res = simulate_controlled(jobs, make_policy("ones"), apps, SimConfig())
    assert len(res.jobs) == 30 and all(0 < j.jct < 50_000 for j in res.jobs)
    assert res.extra["rebatches"] > 0  # batch-only changes, without restarts


def test_cli_engine_controller_is_the_default(data_dir: Path, small_workload: Path) -> None:
    from click.testing import CliRunner

    from hpcorch.cli import main

    args = ["simulate", str(small_workload), "--policy", "fifo", "--nodes", "2", "--json"]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.stderr
    (row,) = json.loads(res.stdout)["results"]
    assert row["policy"] == "fifo" and row["avg_jct"] >= row["lower_bound"]
    slow = CliRunner().invoke(main, [*args, "--startup-s", "300"])
    assert json.loads(slow.stdout)["results"][0]["avg_jct"] > row["avg_jct"] + 200
    bad = CliRunner().invoke(main, [*args, "--engine", "slurm"])
    assert bad.exit_code == 2 and "'slurm' is not one of" in bad.stderr
    mixed = CliRunner().invoke(main, [*args, "--restart-cost", "30"])
    assert mixed.exit_code == 2 and "--engine direct" in mixed.stderr
    direct = CliRunner().invoke(main, [*args, "--engine", "direct", "--restart-cost", "30"])
    assert direct.exit_code == 0, direct.stderr
