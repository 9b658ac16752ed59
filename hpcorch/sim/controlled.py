"""The production controller over the simulated Slurm side: what is benchmarked ships.

The controller (:class:`hpcorch.controller.loop.Controller`, with its SQLite store in a
temporary directory, as in production) runs its cycles on the simulated clock as its own
loop would run them on the real one: every ``interval_s`` (the production 10 s), and every
``fast_interval_s`` (1 s) while a job is starting or stopping
(:meth:`Controller.next_interval`). Between two cycles the world runs
(:meth:`SimSlurm.advance_to`): training, checkpoint exits, completions, launches.

A cycle in which nothing new can be seen is skipped: the driver jumps to the first cycle of
that schedule at or after the next thing that happens, whether in the world (an arrival, a
checkpointed job's exit, a launch that starts training, a completion:
:meth:`SimSlurm.next_event`) or in the controller's own timers (the next scheduling round,
the end of a relaunch delay, a re-signal or a forced requeue of a job slow to checkpoint).
Such a cycle would only have read the same state again, so the results are those of
running every cycle (``jump=False``; a test checks they agree), only faster.
"""

from __future__ import annotations

import math
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from hpcorch.controller.loop import Controller, LoopConfig
from hpcorch.controller.reconcile import Settings
from hpcorch.controller.store import Store
from hpcorch.policy.types import Plan, Policy, Snapshot
from hpcorch.sim.bound import lower_bound
from hpcorch.sim.config import SimConfig
from hpcorch.sim.costs import ResizeCost
from hpcorch.sim.engine import SimCluster
from hpcorch.sim.gputypes import TypedPool
from hpcorch.sim.limits import SimLimits
from hpcorch.sim.loop import MAX_SIM_TIME, JobResult, SimResult
from hpcorch.sim.regime import in_regime
from hpcorch.sim.slurm_jobs import SlurmJob
from hpcorch.sim.slurm_side import SimSlurm
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

INTERVAL_S = 10.0
"""The controller's cycle in production (``hpcorch controller --interval``)."""
FAST_INTERVAL_S = 1.0
"""Its cycle while a transition is in flight (``LoopConfig.fast_interval_s``)."""


def sim_settings(cost: ResizeCost) -> Settings:
    """The production controller's settings, with the relaunch delay of ``cost``."""
    return replace(Settings(), relaunch_delay_s=cost.requeue_s)


@dataclass
class _Timed:
    """The policy, with the CPU time of each of its decisions recorded: the cost on one
    core, whatever else runs on the machine."""

    policy: Policy
    name: str = ""
    cpu_s: list[float] = field(default_factory=list)

    @property
    def sees_fixed(self) -> bool:
        """The wrapped policy's wish to be shown the fixed jobs (split_schedule)."""
        return bool(getattr(self.policy, "sees_fixed", False))

    def schedule(self, snapshot: Snapshot) -> Plan:
        t0 = time.process_time()
        try:
            return self.policy.schedule(snapshot)
        finally:
            self.cpu_s.append(time.process_time() - t0)


def _quiet(_msg: str) -> None:
    return None


def simulate_controlled(
    workload: list[WorkloadJob],
    policy: Policy,
    apps: Mapping[str, AppTrace],
    config: SimConfig | None = None,
    on_round: Callable[[SimCluster], None] | None = None,
    *,
    cost: ResizeCost | None = None,
    restart_cost_s: float | None = None,
    interval_s: float = INTERVAL_S,
    fast_interval_s: float = FAST_INTERVAL_S,
    settings: Settings | None = None,
    jump: bool = True,
    log: Callable[[str], None] = _quiet,
    keep_state: Path | None = None,
    mix_types: bool = False,
    limits: SimLimits | None = None,
) -> SimResult:
    """Run the controller with ``policy`` over a simulated pool until every job finished.

    ``config`` gives the pool and the scheduling round (``round_s``); its ``restart_cost``
    is not used: a resize costs the parts of ``cost`` (default: the real pool's figures)
    plus the controller's own waits; the policy is told ``restart_cost_s`` (default: the
    parts' sum, ``cost.total``), as the controller's ``--restart-cost``. ``on_round`` is
    called after every cycle.
    ``keep_state``: copy the controller's store there at the end (for ``hpcorch report``;
    its times are simulated seconds). ``mix_types``: the controller lets a launch span
    GPU types (``controller --mix-gpu-types``). ``limits``: Slurm's limits on the jobs'
    users (hpcorch/sim/limits.py); the result's ``extra["limit_pending_max_s"]`` is the
    longest a released launch was kept pending for one.
    """
    cfg = config or SimConfig()
    cost = cost or ResizeCost()
    rules = settings or sim_settings(cost)
    typed = TypedPool(cfg.node_types, apps) if cfg.gpu_types else None
    side = SimSlurm(
        workload,
        apps,
        cfg.node_gpus,
        cost,
        report_s=cfg.round_s,
        node_cpus=cfg.node_cpus,
        cpu_demand=dict(cfg.cpu_demand),
        fixed_cpus=cfg.cpus_per_gpu,
        typed=typed,
        declares=cfg.regime.declares,
        limits=limits,
    )
    loop_cfg = LoopConfig(
        interval_s=interval_s,
        fast_interval_s=fast_interval_s,
        round_s=cfg.round_s,
        restart_cost_s=cost.total if restart_cost_s is None else restart_cost_s,
        max_starts_per_cycle=max(64, len(workload)),
        mix_types=mix_types,
        settings=rules,
    )
    # the jobs themselves leave out the length they do not declare (the controller shows
    # them with its placeholders): the policy's view changes only what is pooled
    policy = in_regime(policy, replace(cfg.regime, lengths="all"))
    timed = _Timed(policy, policy.name)
    cycles = 0
    with tempfile.TemporaryDirectory(prefix="hpcorch-sim-") as tmp:
        store = Store(Path(tmp) / "state.db", clock=side.now)
        try:
            ctl = Controller(side, store, timed, loop_cfg, log=log)
            t = side.now()
            while not side.all_done():
                if t > MAX_SIM_TIME:
                    raise RuntimeError(
                        f"{policy.name}: jobs still running after {MAX_SIM_TIME:.0f} s"
                    )
                step = ctl.next_interval()
                skip = 1
                if jump:
                    at = min(side.next_event(), _timers(ctl, side, rules))
                    if at == math.inf:
                        raise RuntimeError(
                            f"{policy.name}: nothing left to happen, jobs unfinished"
                        )
                    skip = max(1, math.ceil((at - t) / step - 1e-9))
                t += skip * step
                side.advance_to(t)
                ctl.cycle()
                cycles += 1
                if on_round is not None:
                    on_round(side.world)
            resizes = sum(r.resizes for r in store.jobs())
            rebatches = store.count_decisions("rebatch")
            if keep_state is not None:
                store.set_meta("total_gpus", str(sum(cfg.node_gpus)))
                store.backup(keep_state)
        finally:
            store.close()
    # every job completed or was cancelled (a job counted as ended while it ran would end the
    # run early, its JCT below zero)
    unfinished = [j.model.spec.name for j in side.unfinished()]
    if unfinished:
        raise RuntimeError(
            f"{policy.name}: the run ended with {len(unfinished)} jobs unfinished "
            f"({', '.join(unfinished[:5])})"
        )
    results = [
        JobResult(
            name=j.model.spec.name,
            application=j.model.spec.application,
            submit_time=j.model.spec.time,
            # Slurm's end, as the real pool's JCT: the last step plus the job's finish
            jct=_ended_at(j, cost.finish_s) - j.model.spec.time,
            queueing_delay=(j.first_start if j.first_start is not None else j.model.spec.time)
            - j.model.spec.time,
            restarts=max(j.launches - 1, 0),
            gpu_seconds=j.model.attained_service,
        )
        for j in side.jobs
    ]
    # A job can start in the first whole second after it arrives, paying only its start-up.
    bound_cfg = replace(cfg, round_s=1.0, restart_cost=cost.startup_s)
    return SimResult(
        policy=policy.name,
        jobs=results,
        timeline=side.world.timeline,
        total_gpus=sum(cfg.node_gpus),
        decision_s=timed.cpu_s,
        lower_bound=lower_bound(workload, typed.fastest() if typed else apps, bound_cfg),
        allocated_gpu_seconds=side.world.allocated_gpu_seconds,
        extra={
            "idle_held": 0.0,
            "cycles": float(cycles),
            "slurm_calls": float(side.calls),
            "resizes": float(resizes),
            "rebatches": float(rebatches),
            "limit_pending_max_s": max(side.limit_waits, default=0.0),
            "limit_pending": float(len(side.limit_waits)),
        },
    )


def _ended_at(j: SlurmJob, finish_s: float) -> float:
    """When ``j`` ended in Slurm: its last step plus its finish, or its cancellation."""
    if j.model.completion_time is not None:
        return j.model.completion_time + finish_s
    return j.end_time


def _timers(ctl: Controller, side: SimSlurm, s: Settings) -> float:
    """When the controller next acts with nothing new from Slurm: the next round while it
    has jobs, the end of a relaunch delay, a re-signal or a forced requeue (its rules in
    :mod:`hpcorch.controller.reconcile`; later cycles see a strictly passed deadline)."""
    now = side.now()
    nxt = math.inf
    if ctl.records.active() or side.arrived_unfinished():
        nxt = ctl.next_round()
    for j in side.awaiting_relaunch():
        if j.end_time + s.relaunch_delay_s > now:
            nxt = min(nxt, j.end_time + s.relaunch_delay_s)
    for rec in ctl.records.active():
        if rec.phase not in ("starting", "stopping"):
            continue
        # the end of its fast polling; a held start's relaunch delay and exact-shape wait
        dues = [rec.phase_since + ctl.config.fast_for_s]
        if rec.phase == "starting":
            dues += [math.floor(rec.phase_since) + s.relaunch_delay_s]
            dues += [rec.phase_since + s.exact_wait_s]
        for due in dues:  # each rule acts at its deadline itself (now >= due)
            if due > now + 1e-9:
                nxt = min(nxt, due)
    grace = max(s.grace_s, 30.0)  # managed jobs: no sidecar grace of their own
    for j in side.stopping():
        for due in (j.signalled_at + s.resignal_s, j.first_signal + grace):
            if due > now - 1e-9:
                nxt = min(nxt, due + 1e-6)
    return nxt
