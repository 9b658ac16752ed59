"""The thin scheduling loop over a simulated cluster: snapshot -> policy -> plan -> apply.

Every round (default 60 s) the cluster advances, the loop builds a :class:`Snapshot` from
the jobs' reports, asks the policy for a plan, checks it and applies it. With
``SimConfig.cpus_per_gpu`` set, every job gets that many CPUs per GPU whatever the policy
chose (a fixed ``--cpus-per-gpu`` in every job script).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

import numpy as np

from hpcorch.policy.types import Plan, Policy, Snapshot, validate_plan
from hpcorch.sim.bound import lower_bound
from hpcorch.sim.config import SimConfig
from hpcorch.sim.engine import SimCluster
from hpcorch.sim.regime import in_regime
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

__all__ = ["MAX_SIM_TIME", "JobResult", "SimConfig", "SimResult", "simulate"]

MAX_SIM_TIME = 60 * 24 * 3600.0


@dataclass(frozen=True)
class JobResult:
    name: str
    application: str
    submit_time: float
    jct: float
    queueing_delay: float
    restarts: int
    gpu_seconds: float


@dataclass
class SimResult:
    """Per-job and per-run figures of one simulation."""

    policy: str
    jobs: list[JobResult]
    timeline: list[tuple[float, int]]
    total_gpus: int
    decision_s: list[float]
    lower_bound: float
    allocated_gpu_seconds: float = 0.0
    extra: dict[str, float] = field(default_factory=dict)

    @property
    def jcts(self) -> np.ndarray:
        return np.array([j.jct for j in self.jobs])

    @property
    def avg_jct(self) -> float:
        return float(self.jcts.mean())

    @property
    def makespan(self) -> float:
        return float(max(j.submit_time + j.jct for j in self.jobs))

    @property
    def utilization(self) -> float:
        """Mean fraction of GPUs held by jobs from the first arrival to the makespan."""
        start = min(j.submit_time for j in self.jobs)
        span = self.makespan - start
        if span <= 0:
            return 0.0
        used = sum(j.gpu_seconds for j in self.jobs)
        return float(used / (span * self.total_gpus))

    def summary(self) -> dict[str, float]:
        jcts = self.jcts
        dec = np.array(self.decision_s or [0.0]) * 1000
        return {
            "avg_jct": self.avg_jct,
            "p50_jct": float(np.percentile(jcts, 50)),
            "p99_jct": float(np.percentile(jcts, 99)),
            "makespan": self.makespan,
            "lower_bound": self.lower_bound,
            "utilization": self.utilization,
            "restarts_per_job": float(np.mean([j.restarts for j in self.jobs])),
            "decision_ms_mean": float(dec.mean()),
            "decision_ms_max": float(dec.max()),
        }


def fixed_cpus(plan: Plan, cpus_per_gpu: int) -> Plan:
    """``plan`` with every job at ``cpus_per_gpu`` CPUs per GPU."""
    return Plan(tuple(replace(p, cpus_per_gpu=cpus_per_gpu) for p in plan.jobs))


def simulate(
    workload: list[WorkloadJob],
    policy: Policy,
    apps: Mapping[str, AppTrace],
    config: SimConfig | None = None,
    on_round: Callable[[SimCluster], None] | None = None,
) -> SimResult:
    """Run ``policy`` on ``workload`` until every job has finished."""
    cfg = config or SimConfig()
    cluster = SimCluster(
        workload, apps, cfg.node_gpus, cfg.restart_cost, cfg.node_cpus, dict(cfg.cpu_demand)
    )
    policy = in_regime(policy, cfg.regime)
    decisions: list[float] = []
    while not cluster.all_done():
        if cluster.now > MAX_SIM_TIME:
            raise RuntimeError(f"{policy.name}: jobs still running after {MAX_SIM_TIME:.0f} s")
        cluster.advance(cfg.round_s)
        views = cluster.reports()
        if views:
            snap = Snapshot(
                now=cluster.now,
                node_gpus=cfg.node_gpus,
                jobs=tuple(views),
                history=tuple(cluster.completed()),
                round_s=cfg.round_s,
                restart_cost_s=cfg.restart_cost,
                node_cpus=cfg.node_cpus,
            )
            # CPU time of the call: the cost on one core, unaffected by other work sharing
            # the machine.
            t0 = time.process_time()
            plan = policy.schedule(snap)
            decisions.append(time.process_time() - t0)
            if cfg.cpus_per_gpu > 0:
                plan = fixed_cpus(plan, cfg.cpus_per_gpu)
            validate_plan(snap, plan)
            cluster.apply(plan)
        else:
            cluster.apply(Plan())
        if on_round is not None:
            on_round(cluster)
    results = [
        JobResult(
            name=j.spec.name,
            application=j.spec.application,
            submit_time=j.spec.time,
            jct=(j.completion_time or 0.0) - j.spec.time,
            queueing_delay=(j.start_time if j.start_time is not None else j.spec.time)
            - j.spec.time,
            restarts=max(j.restarts, 0),
            gpu_seconds=j.attained_service,
        )
        for j in cluster.jobs
    ]
    bound = lower_bound(workload, apps, cfg)
    return SimResult(
        policy=policy.name,
        jobs=results,
        timeline=cluster.timeline,
        total_gpus=sum(cfg.node_gpus),
        decision_s=decisions,
        lower_bound=bound,
        allocated_gpu_seconds=cluster.allocated_gpu_seconds,
        extra={"idle_held": sum(j.idle_held for j in cluster.jobs)},
    )
