"""The job state machine. Pure: a job's record and what the cluster reports in, the
record's next state and the actions to take out. No IO, so every transition is testable.

Phases (the diagram is in docs/controller.md):

    queued ──start──> starting ──(Slurm runs it)──> running ──signal──> stopping
      ^                  ^                              |                  |
      |                  └──────── (exit 75: requeue held, reshape, release) ┘
      └──────────── (exit 75 with target 0: requeue held = preempted) ────────┘
    running/starting ──exit 0──> done;  ──failure──> starting (retry) or failed
    any ──scancel──> cancelled;  any ──gone from Slurm──> lost
    running ──time budget spent: signal──> stopping ──(exit)──> timeout
    running ──checkpointed on its own past --max-relaunches──> timeout

Every action is safe to repeat, and every phase can be re-entered from what Slurm
reports, so a controller killed between two actions continues where it stopped.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from hpcorch.cluster import ObservedJob, Shape
from hpcorch.controller.store import JobRecord
from hpcorch.protocol import EXIT_CONFIG, EXIT_RELAUNCH
from hpcorch.timefmt import fmt_duration


@dataclass(frozen=True)
class Settings:
    grace_s: float = 120.0
    """How long a signalled job may take to checkpoint before it is requeued by force."""
    resignal_s: float = 15.0
    """A signalled job still running after this long is signalled again."""
    max_retries: int = 2
    """Relaunches after a failure before the job is left failed."""
    min_run_s: float = 60.0
    """A launch runs at least this long before the controller resizes it."""
    startup_s: float = 600.0
    """A launch that has not reported its start is left alone this long (it could not
    checkpoint yet: a signal would kill it); after that it is treated as started."""
    relaunch_delay_s: float = 2.0
    """Seconds between the end of a run and its relaunch: slurmd refuses a job id's new
    launch on a node while the last run's credential is being revoked."""


@dataclass(frozen=True)
class Action:
    """One thing to ask of the cluster. ``kind``: start, hold, signal, requeue_hold."""

    kind: str
    slurm_id: int
    shape: Shape | None = None
    reason: str = ""


@dataclass
class Outcome:
    actions: list[Action] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    """Decisions worth recording (resize, preempt, retry, ...), as 'kind: detail'."""


def _set_phase(rec: JobRecord, phase: str, now: float, reason: str | None = None) -> None:
    if rec.phase != phase:
        rec.phase = phase
        rec.phase_since = now
    if reason is not None:
        rec.reason = reason


def target_shape(rec: JobRecord, pool_nodes: tuple[str, ...]) -> Shape:
    """The launch shape for the record's target: the planned nodes when even, else the
    fewest even nodes for Slurm to choose."""
    placement = rec.placement()
    counts = set(placement.values())
    if placement and len(counts) == 1 and all(0 <= i < len(pool_nodes) for i in placement):
        names = tuple(pool_nodes[i] for i in sorted(placement))
        return Shape(len(names), counts.pop(), names, rec.target_cpus)
    per_node = max(placement.values()) if placement else rec.target_gpus
    for nodes in range(1, rec.target_gpus + 1):
        if rec.target_gpus % nodes == 0 and rec.target_gpus // nodes <= max(per_node, 1):
            return Shape(nodes, rec.target_gpus // nodes, (), rec.target_cpus)
    return Shape(rec.target_gpus, 1, (), rec.target_cpus)


def observe(
    rec: JobRecord,
    job: ObservedJob | None,
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
) -> Outcome:
    """Move ``rec`` along with what the cluster reports about it."""
    out = Outcome()
    if not rec.active:
        return out
    if job is None:
        _set_phase(rec, "lost", now, "vanished from Slurm while the controller was not looking")
        rec.finished_at = now
        out.events.append("lost: job no longer known to Slurm")
        return out
    if rec.phase == "running" and rec.gpus:
        span = max(0.0, now - max(rec.phase_since, rec.started_at))
        rec.run_seconds = max(rec.run_seconds, span)
    restarts_before = rec.slurm_restarts
    if job.state == "CANCELLED":
        _set_phase(rec, "cancelled", now, "cancelled")
        rec.finished_at = now
        out.events.append("cancelled: by its user or an admin")
    elif job.state == "COMPLETED" and job.exit_code == 0:
        _set_phase(rec, "done", now, "finished")
        rec.finished_at = now
        rec.exit_code = 0
        out.events.append("done: training finished")
    elif job.ended:
        _ended(rec, job, now, pool_nodes, s, out)
    elif job.state == "PENDING":
        _pending(rec, job, now, pool_nodes, out)
    else:  # RUNNING, COMPLETING, CONFIGURING, SUSPENDED, ...
        _running(rec, job, now, s, out)
    rec.slurm_restarts = max(restarts_before, job.restarts)
    return out


def _relaunch(
    rec: JobRecord, now: float, pool_nodes: tuple[str, ...], out: Outcome, why: str
) -> None:
    out.actions.append(Action("requeue_hold", rec.slurm_id, reason=why))
    if rec.target_gpus > 0:
        out.actions.append(Action("start", rec.slurm_id, target_shape(rec, pool_nodes), why))
        _set_phase(rec, "starting", now, why)
    else:
        _set_phase(rec, "queued", now, why)


def _ended(
    rec: JobRecord,
    job: ObservedJob,
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
    out: Outcome,
) -> None:
    if job.end_time and now - job.end_time < s.relaunch_delay_s:
        return  # relaunch at the next cycle
    rec.exit_code = job.exit_code
    if rec.budget_spent():
        _timeout(
            rec,
            now,
            out,
            f"time budget spent: ran {fmt_duration(rec.run_total_s)} of "
            f"{fmt_duration(rec.time_budget_s)} over {rec.launches} launch(es)",
        )
        return
    if job.exit_code == EXIT_RELAUNCH:
        if rec.phase != "stopping":
            rec.time_relaunches += 1
            if 0 <= rec.max_relaunches < rec.time_relaunches:
                _timeout(
                    rec,
                    now,
                    out,
                    f"checkpointed on its own (time limit?) {rec.time_relaunches} times: "
                    f"--max-relaunches {rec.max_relaunches} reached",
                )
                return
        if rec.phase == "stopping":
            if rec.target_gpus == 0:
                why = "preempted: checkpointed and queued"
            else:
                why = f"resized {rec.gpus} -> {rec.target_gpus} GPUs"
                rec.resizes += 1
        else:
            rec.target_gpus = rec.target_gpus or rec.gpus or rec.min_gpus
            why = "checkpointed on its own (time limit?): relaunched"
        out.events.append(f"checkpointed: {why}")
        _relaunch(rec, now, pool_nodes, out, why)
        return
    rec.failures += 1
    what = f"{job.state.lower()} with exit code {job.exit_code}"
    if job.exit_code == EXIT_CONFIG:
        _set_phase(rec, "failed", now, f"{what}: a bad plan or checkpoint, not retried")
        rec.finished_at = now
        out.events.append(f"failed: {rec.reason}")
        return
    if rec.failures <= s.max_retries:
        rec.target_gpus = rec.target_gpus or rec.gpus or rec.min_gpus
        why = f"{what}: retry {rec.failures}/{s.max_retries} from the last checkpoint"
        out.events.append(f"retry: {why}")
        _relaunch(rec, now, pool_nodes, out, why)
    else:
        _set_phase(rec, "failed", now, f"{what}; gave up after {s.max_retries} retries")
        rec.finished_at = now
        out.events.append(f"failed: {rec.reason}")


def _timeout(rec: JobRecord, now: float, out: Outcome, why: str) -> None:
    """The job ends for good, its last checkpoint kept: a resubmission continues from it."""
    _set_phase(rec, "timeout", now, f"{why}; not relaunched (resubmit to continue)")
    rec.finished_at = now
    out.events.append(f"timeout: {rec.reason}")


def _pending(
    rec: JobRecord, job: ObservedJob, now: float, pool_nodes: tuple[str, ...], out: Outcome
) -> None:
    if job.held:
        if rec.phase == "starting":  # the start was cut short (controller restart): redo it
            out.actions.append(
                Action("start", rec.slurm_id, target_shape(rec, pool_nodes), "resume start")
            )
        elif rec.phase == "stopping":  # requeued, but the relaunch was cut short
            _relaunch_from_held(rec, now, pool_nodes, out)
        elif rec.phase == "running":
            _set_phase(rec, "queued", now, "held by its user or an admin")
        return
    if rec.phase == "running":
        _set_phase(rec, "starting", now, f"requeued by Slurm (restart {job.restarts})")
        out.events.append(f"requeued: by Slurm, restart {job.restarts} (node failure?)")
        # its node list may name the failed node: let Slurm place it anywhere in the pool
        rec.target_gpus = rec.target_gpus or rec.gpus or rec.min_gpus
        rec.target_placement = "{}"
        shape = target_shape(rec, pool_nodes)
        out.actions.append(
            Action(
                "start",
                rec.slurm_id,
                Shape(shape.nodes, shape.gpus_per_node),
                "restart anywhere after a node failure",
            )
        )
    elif rec.phase in ("queued", "stopping"):
        _set_phase(rec, "starting", now, "released outside the controller")


def _relaunch_from_held(
    rec: JobRecord, now: float, pool_nodes: tuple[str, ...], out: Outcome
) -> None:
    if rec.budget_spent():
        _timeout(rec, now, out, "time budget spent (the checkpoint was forced)")
    elif rec.target_gpus > 0:
        out.actions.append(
            Action("start", rec.slurm_id, target_shape(rec, pool_nodes), "resume relaunch")
        )
        _set_phase(rec, "starting", now)
    else:
        _set_phase(rec, "queued", now, "preempted: checkpointed and queued")


def _running(rec: JobRecord, job: ObservedJob, now: float, s: Settings, out: Outcome) -> None:
    if rec.phase == "running" and job.restarts > rec.slurm_restarts:
        # requeued and started again by Slurm between two cycles (a node failure)
        rec.launches += 1
        rec.ready = 0
        _set_phase(rec, "running", now, f"relaunched by Slurm (restart {job.restarts})")
        rec.phase_since = now
        out.events.append(f"requeued: by Slurm and running again, restart {job.restarts}")
    if rec.phase in ("queued", "starting"):
        rec.launches += 1
        rec.started_at = rec.started_at or now
        rec.run_seconds = 0.0
        rec.ready = 0
        _set_phase(rec, "running", now, f"launch {rec.launches}")
    if job.node_names:
        rec.gpus = job.gpus
        rec.nodes = len(job.node_names)
        rec.node_list = ",".join(job.node_names)
    if rec.phase == "running" and rec.budget_spent():
        # the budget counts across launches: ask for a checkpoint, never relaunch after it
        rec.target_gpus = 0
        why = (
            f"time budget spent ({fmt_duration(rec.run_total_s)} of "
            f"{fmt_duration(rec.time_budget_s)}): checkpointing"
        )
        out.actions.append(Action("signal", rec.slurm_id, reason=why))
        out.events.append(f"budget: {why}")
        rec.signalled_at = now
        _set_phase(rec, "stopping", now, why)
        return
    if rec.phase == "stopping":
        waited = now - rec.phase_since
        grace = max(s.grace_s, rec.stop_grace_s + 30.0)  # the sidecar kills after its own
        if waited > grace:
            why = f"no checkpoint within {grace:.0f} s: requeued by force"
            out.actions.append(Action("requeue_hold", rec.slurm_id, reason=why))
            out.events.append(f"forced: {why}")
            rec.reason = why
        elif now - rec.signalled_at > s.resignal_s:
            out.actions.append(Action("signal", rec.slurm_id, reason="signal again"))
            rec.signalled_at = now


def decide(
    rec: JobRecord,
    target_gpus: int,
    placement: dict[int, int],
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
    cpus: int = 0,
) -> Outcome:
    """Turn a policy target into actions for a job in a stable phase (queued or running).
    ``cpus``: CPUs per GPU of the target (0: as it is)."""
    out = Outcome()
    if rec.budget_spent():
        return out  # it ends at its next checkpoint (observe), never starts again
    cpus_change = bool(cpus and rec.cpus_per_gpu and cpus != rec.cpus_per_gpu)
    if rec.phase == "queued" and target_gpus > 0:
        rec.target_gpus = target_gpus
        rec.target_cpus = cpus
        rec.target_placement = json.dumps(placement)
        shape = target_shape(rec, pool_nodes)
        out.actions.append(Action("start", rec.slurm_id, shape, f"start at {target_gpus} GPUs"))
        out.events.append(f"start: {target_gpus} GPUs")
        _set_phase(rec, "starting", now, f"starting at {target_gpus} GPUs")
    elif rec.phase == "running" and (target_gpus != rec.gpus or (cpus_change and target_gpus)):
        if not rec.ready and now - rec.phase_since < s.startup_s:
            return out  # still starting up: it cannot checkpoint yet
        if target_gpus > 0 and now - rec.phase_since < s.min_run_s:
            return out  # let a fresh launch run before paying another restart
        rec.target_gpus = target_gpus
        rec.target_cpus = cpus or rec.target_cpus
        rec.target_placement = json.dumps(placement)
        kind = "preempt" if target_gpus == 0 else "resize"
        what = f"{rec.gpus} -> {target_gpus} GPUs"
        reason = f"{kind} to {target_gpus} GPUs"
        if target_gpus == rec.gpus:
            what = f"{rec.cpus_per_gpu} -> {cpus} CPUs per GPU"
            reason = f"resize to {cpus} CPUs per GPU"
        out.actions.append(Action("signal", rec.slurm_id, reason=reason))
        rec.signalled_at = now
        out.events.append(f"{kind}: {what}")
        _set_phase(rec, "stopping", now, f"{kind}: {what}")
    return out
