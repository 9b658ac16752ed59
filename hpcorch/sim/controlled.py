"""The production controller over the simulated Slurm side: what is benchmarked ships.

Every ``interval_s`` of simulated time the world advances (:meth:`SimSlurm.advance`) and
the controller runs one cycle (:meth:`hpcorch.controller.loop.Controller.cycle`): it
observes the pool, moves every job's state machine, reads the jobs' metric lines, asks
the policy for a plan each round and carries it out through start / signal / requeue,
keeping its state in a SQLite store in a temporary directory, as in production.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path

from hpcorch.controller.loop import Controller, LoopConfig
from hpcorch.controller.reconcile import Settings
from hpcorch.controller.store import Store
from hpcorch.policy.types import Policy
from hpcorch.sim.bound import lower_bound
from hpcorch.sim.engine import SimCluster
from hpcorch.sim.loop import MAX_SIM_TIME, JobResult, SimConfig, SimResult
from hpcorch.sim.regime import in_regime
from hpcorch.sim.slurm_side import SimSlurm
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

SIM_SETTINGS = Settings(min_run_s=0.0, startup_s=0.0, relaunch_delay_s=0.0)
"""The simulated jobs report their start and checkpoint on time; the policies themselves
decide when a resize is worth its restart cost."""


def _quiet(_msg: str) -> None:
    return None


def simulate_controlled(
    workload: list[WorkloadJob],
    policy: Policy,
    apps: Mapping[str, AppTrace],
    config: SimConfig | None = None,
    on_round: Callable[[SimCluster], None] | None = None,
    *,
    interval_s: float | None = None,
    checkpoint_s: float = 5.0,
    settings: Settings = SIM_SETTINGS,
    log: Callable[[str], None] = _quiet,
) -> SimResult:
    """Run the controller with ``policy`` over a simulated pool until every job finished.

    ``interval_s`` (default: the round) is the controller's cycle period; a round is
    scheduled every ``config.round_s`` seconds and whenever a job arrives or ends.
    """
    cfg = config or SimConfig()
    interval = interval_s or cfg.round_s
    side = SimSlurm(
        workload, apps, cfg.node_gpus, cfg.restart_cost, checkpoint_s, report_s=cfg.round_s
    )
    loop_cfg = LoopConfig(
        interval_s=interval,
        round_s=cfg.round_s,
        restart_cost_s=cfg.restart_cost,
        max_starts_per_cycle=max(64, len(workload)),
        settings=settings,
    )
    policy = in_regime(policy, cfg.regime)
    decisions: list[float] = []
    cycles = 0
    with tempfile.TemporaryDirectory(prefix="hpcorch-sim-") as tmp:
        store = Store(Path(tmp) / "state.db")
        try:
            ctl = Controller(side, store, policy, loop_cfg, log=log)
            while not side.all_done():
                if side.now() > MAX_SIM_TIME:
                    raise RuntimeError(
                        f"{policy.name}: jobs still running after {MAX_SIM_TIME:.0f} s"
                    )
                side.advance(interval)
                stats = ctl.cycle()
                cycles += 1
                if ctl.last_round == stats.time and stats.jobs:
                    decisions.append(stats.decision_s)
                if on_round is not None:
                    on_round(side.world)
            resizes = sum(r.resizes for r in store.jobs())
        finally:
            store.close()
    results = [
        JobResult(
            name=j.model.spec.name,
            application=j.model.spec.application,
            submit_time=j.model.spec.time,
            jct=(j.model.completion_time or 0.0) - j.model.spec.time,
            queueing_delay=(j.first_start if j.first_start is not None else j.model.spec.time)
            - j.model.spec.time,
            restarts=max(j.launches - 1, 0),
            gpu_seconds=j.model.attained_service,
        )
        for j in side.jobs
    ]
    return SimResult(
        policy=policy.name,
        jobs=results,
        timeline=side.world.timeline,
        total_gpus=sum(cfg.node_gpus),
        decision_s=decisions,
        lower_bound=lower_bound(workload, apps, cfg),
        allocated_gpu_seconds=side.world.allocated_gpu_seconds,
        extra={
            "idle_held": 0.0,
            "cycles": float(cycles),
            "slurm_calls": float(side.calls),
            "resizes": float(resizes),
        },
    )
