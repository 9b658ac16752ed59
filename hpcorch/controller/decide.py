"""From a policy's target to actions, for a job in a stable phase (queued or running), and
when a running launch may be stopped at all. Pure."""

from __future__ import annotations

import json

from hpcorch.controller.actions import Action, Outcome, Settings, set_phase
from hpcorch.controller.shapes import target_shape
from hpcorch.controller.store import JobRecord


def trained_since(rec: JobRecord, now: float, s: Settings) -> float | None:
    """When the running launch started training: its start report, or the end of
    ``startup_s`` for one that never reports; None while it is still starting up. The
    report's time is the job's to write: one later than ``startup_s`` after the launch
    counts as that (a job cannot make itself unstoppable with a time in the future)."""
    if rec.ready:
        if rec.ready_at <= 0:
            return rec.phase_since
        return min(rec.ready_at, rec.phase_since + s.startup_s)
    if now - rec.phase_since >= s.startup_s:
        return rec.phase_since + s.startup_s
    return None


def can_stop(rec: JobRecord, now: float, s: Settings, restart_cost_s: float = 0.0) -> bool:
    """Whether a running launch may be stopped (resized, preempted) now: once it trained at
    least ``max(min_run_s, restart_cost_s)``. Every launch gains more than its restart cost
    before the next, so no policy can keep a job restarting without progress."""
    if rec.phase != "running":
        return False
    since = trained_since(rec, now, s)
    return since is not None and now - since >= max(s.min_run_s, restart_cost_s)


def decide(
    rec: JobRecord,
    target_gpus: int,
    placement: dict[int, int],
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
    cpus: int = 0,
    plan_batch: int = 0,
    live_batch: bool = False,
    *,
    restart_cost_s: float = 0.0,
    gpu_type: str = "",
    chose_type: bool = False,
    must_move: str = "",
) -> Outcome:
    """Turn a policy target into actions for a job in a stable phase (queued or running).
    ``cpus``: CPUs per GPU of the target (0: as it is). ``plan_batch``: the global batch of
    the plan the running launch has (0: unknown: the batch it reports). A running job that
    can take a new batch while it runs (``live_batch``) and is planned at its GPUs with
    another global batch (``rec.target_batch``) gets a "rebatch": its plan rewritten.
    A running job is stopped only once it trained ``max(min_run_s, restart_cost_s)`` since
    its launch started training (``can_stop``). ``gpu_type``: the GPU type of the target's
    nodes, which the launch requests ('': any). ``chose_type``: the policy chose that type
    (a type-aware policy's plan): another type than the running launch's is then a change
    even at the same count (a move: the job restarts on the planned type). A type-blind
    policy's placement elsewhere at the same count is no change, as on one type.
    ``must_move``: why the running job must leave one of its nodes now (a drain, a pending
    reboot, a maintenance window; hpcorch/controller/availability.py): it is stopped at its
    next safe point, once it reported its start, whatever its target, without waiting for
    ``min_run_s``; it relaunches where the plan puts it."""
    out = Outcome()
    if rec.budget_spent():
        return out  # it ends at its next checkpoint (observe), never starts again
    cpus_change = bool(cpus and rec.cpus_per_gpu and cpus != rec.cpus_per_gpu)
    moved = bool(
        chose_type and target_gpus and gpu_type and rec.gpu_type and gpu_type != rec.gpu_type
    )
    if rec.phase == "queued" and target_gpus > 0:
        rec.slurm_launch = 0
        rec.target_gpus = target_gpus
        rec.target_cpus = cpus
        rec.target_placement = json.dumps(placement)
        rec.target_type = gpu_type
        shape = target_shape(rec, pool_nodes)
        out.actions.append(Action("start", rec.slurm_id, shape, f"start at {target_gpus} GPUs"))
        out.events.append(f"start: {target_gpus} GPUs")
        set_phase(rec, "starting", now, f"starting at {target_gpus} GPUs")
    elif rec.phase == "running" and must_move:
        if trained_since(rec, now, s) is None:
            return out  # its signal handler is not installed yet: a signal would kill it
        rec.target_gpus = target_gpus
        rec.target_cpus = cpus or rec.target_cpus
        rec.target_placement = json.dumps(placement)
        rec.target_type = gpu_type if target_gpus else ""
        where = f"{target_gpus} GPUs elsewhere" if target_gpus else "the queue"
        out.actions.append(Action("signal", rec.slurm_id, reason=must_move))
        rec.signalled_at = now
        out.events.append(f"move: {must_move}; to {where}")
        set_phase(rec, "stopping", now, must_move)
    elif (
        rec.phase == "running"
        and live_batch
        and rec.ready
        and target_gpus == rec.gpus > 0
        and not cpus_change
        and not moved
        and rec.target_batch > 0
        and rec.target_batch != (plan_batch or rec.global_batch or rec.batch)
    ):
        was = plan_batch or rec.global_batch or rec.batch
        out.actions.append(
            Action("rebatch", rec.slurm_id, reason=f"batch {was} -> {rec.target_batch}")
        )
        out.events.append(f"rebatch: global batch {was} -> {rec.target_batch}")
    elif rec.phase == "running" and (
        target_gpus != rec.gpus or moved or (cpus_change and target_gpus)
    ):
        if not can_stop(rec, now, s, restart_cost_s):
            return out  # still starting up, or not yet trained for a restart's worth
        rec.target_gpus = target_gpus
        rec.target_cpus = cpus or rec.target_cpus
        rec.target_placement = json.dumps(placement)
        rec.target_type = gpu_type if target_gpus else ""
        kind = "preempt" if target_gpus == 0 else "resize"
        what = f"{rec.gpus} -> {target_gpus} GPUs"
        reason = f"{kind} to {target_gpus} GPUs"
        if moved:
            what = f"{rec.gpus} GPUs of {rec.gpu_type} -> {target_gpus} GPUs of {gpu_type}"
            reason = f"resize to {target_gpus} GPUs of {gpu_type}"
        elif target_gpus == rec.gpus:
            what = f"{rec.cpus_per_gpu} -> {cpus} CPUs per GPU"
            reason = f"resize to {cpus} CPUs per GPU"
        out.actions.append(Action("signal", rec.slurm_id, reason=reason))
        rec.signalled_at = now
        out.events.append(f"{kind}: {what}")
        set_phase(rec, "stopping", now, f"{kind}: {what}")
    return out
