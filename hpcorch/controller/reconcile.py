"""The job state machine, moved along by what Slurm reports. Pure: a job's record and
what the cluster reports in, the record's next state and the actions to take out. No IO,
so every transition is testable.

Phases (the diagram is in docs/controller.md):

    queued ──start──> starting ──(Slurm runs it)──> running ──signal──> stopping
      ^                  ^                              |                  |
      |                  └── (checkpointed: requeued held, reshape, release) ┘
      └───────── (checkpointed with target 0: requeued held = preempted) ─────┘
    running/starting ──exit 0──> done;  ──failure──> starting (retry) or failed
    any ──scancel──> cancelled;  any ──gone from Slurm──> lost
    running ──time budget spent: signal──> stopping ──(exit)──> timeout
    running ──checkpointed on its own past --max-relaunches──> timeout
    running/stopping ──K launches in a row kept no checkpoint──> failed
    stopping ──no checkpoint within the grace, still running after the forced requeue
               + force_retry_s──> scancel ──> failed (it broke the pool's contract)
    any ──moved out of the reservation──> left

A checkpoint on request shows as the job requeued held by its wrapper in Slurm's
SPECIAL_EXIT state, its restart count up by one (accounting then shows a requeue, not a
failure), or, from a wrapper whose requeue Slurm refused, as an end with exit code 75.

Every action is safe to repeat, and every phase can be re-entered from what Slurm
reports, so a controller killed between two actions continues where it stopped.

Alongside: hpcorch/controller/actions.py (settings, actions), shapes.py (where and when a
start goes), decide.py (a policy's target to actions) and ends.py (how a launch ends and
what follows); the names others use are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcorch.cluster import ObservedJob
from hpcorch.controller.actions import Action, Outcome, Settings
from hpcorch.controller.actions import set_phase as _set_phase
from hpcorch.controller.decide import can_stop, decide, trained_since
from hpcorch.controller.ends import (
    UNPLANNED,
    budget_timeout,
    checkpointed,
    ended,
    left,
    missed_checkpoint,
    moved_off,
    no_checkpoints,
    queue_again,
)
from hpcorch.controller.shapes import (
    blocked_starts,
    launch_wait,
    start_claims,
    start_wait,
    target_shape,
)
from hpcorch.controller.store import JobRecord
from hpcorch.controller.waiting import silent
from hpcorch.gputypes import type_of_nodes
from hpcorch.limits import refusal
from hpcorch.protocol import EXIT_RELAUNCH
from hpcorch.timefmt import fmt_duration

__all__ = [
    "REQUEUED",
    "Action",
    "Outcome",
    "Settings",
    "blocked_starts",
    "can_stop",
    "decide",
    "launch_wait",
    "observe",
    "queue_again",
    "start_claims",
    "start_wait",
    "target_shape",
    "trained_since",
]

REQUEUED = "requeued by Slurm"
REQUEUE_WAIT_S = 30.0
"""A job Slurm requeued after a node failure is left this long for Slurm to start on its
old nodes (a node whose slurmd restarts is back within seconds); then it is held and
planned again, on the nodes in service."""


def observe(
    rec: JobRecord,
    job: ObservedJob | None,
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
    node_types: Mapping[str, str] | None = None,
    elsewhere: str | None = None,
) -> Outcome:
    """Move ``rec`` along with what the cluster reports about it. ``node_types``: the GPU
    type of each pool node by name (its launch's type is read off its nodes).
    ``elsewhere``: for a job not in the pool's observation, the reservation Slurm lists it
    in now ('' none; None: Slurm no longer lists it)."""
    out = Outcome()
    if not rec.active:
        return out
    if job is None:
        if elsewhere is not None:
            left(rec, now, elsewhere, out)
            return out
        _set_phase(rec, "lost", now, "vanished from Slurm while the controller was not looking")
        rec.finished_at = now
        out.events.append("lost: job no longer known to Slurm")
        return out
    if rec.phase == "running" and rec.gpus:
        span = max(0.0, now - max(rec.phase_since, rec.started_at))
        rec.run_seconds = max(rec.run_seconds, span)
    restarts_before = rec.slurm_restarts
    if job.ended and rec.breach:
        _set_phase(rec, "failed", now, rec.breach)
        rec.finished_at = now
        rec.exit_code = job.exit_code
        out.events.append(f"failed: {rec.breach}")
        return out
    if not job.requeue and not job.ended and now - rec.requeue_fixed_at >= s.force_retry_s:
        why = (
            "Requeue=0 set on it by its owner or an admin: set back to Requeue=1 (the pool "
            "relaunches its jobs by requeueing them)"
        )
        rec.requeue_fixed_at = now
        out.actions.append(Action("allow_requeue", rec.slurm_id, reason=why))
        out.events.append(f"contract: {why}")
    if job.state == "CANCELLED":
        _set_phase(rec, "cancelled", now, "cancelled")
        rec.finished_at = now
        out.events.append("cancelled: by its user or an admin")
    elif job.state == "COMPLETED" and job.exit_code == 0:
        _set_phase(rec, "done", now, "finished")
        # when Slurm saw it end (its JCT), not the cycle that noticed it
        rec.finished_at = job.end_time if 0 < job.end_time <= now else now
        rec.exit_code = 0
        out.events.append("done: training finished")
    elif job.ended:
        ended(rec, job, now, pool_nodes, s, out)
    elif job.special_exit and job.restarts > restarts_before and job.state == "PENDING":
        rec.exit_code = EXIT_RELAUNCH
        checkpointed(rec, now, pool_nodes, out, requeued=True)
    elif job.state == "PENDING":
        _pending(rec, job, now, pool_nodes, out, s)
    elif job.state == "COMPLETING" and job.restarts > restarts_before:
        # being requeued (by its wrapper after a checkpoint, or by Slurm): listed COMPLETING
        # on its old nodes with its restart already counted. Not running again: its restart
        # is taken once Slurm shows where it went (held in the queue, or started again)
        return out
    else:  # RUNNING, COMPLETING, CONFIGURING, SUSPENDED, ...
        _running(rec, job, now, s, out)
        # Slurm is the truth about where it runs, not the job
        if job.node_names and rec.phase in ("running", "stopping"):
            rec.gpu_type = type_of_nodes(job.node_names, node_types or {})
    rec.slurm_restarts = max(restarts_before, job.restarts)
    return out


def _pending(
    rec: JobRecord,
    job: ObservedJob,
    now: float,
    pool_nodes: tuple[str, ...],
    out: Outcome,
    s: Settings,
) -> None:
    if job.held:
        if rec.phase == "starting":  # the start was cut short (controller restart): redo it
            out.actions.append(
                Action("start", rec.slurm_id, target_shape(rec, pool_nodes), "resume start")
            )
        elif rec.phase == "stopping":  # requeued, but the relaunch was cut short
            _relaunch_from_held(rec, now, pool_nodes, out, s)
        elif rec.phase == "running":
            _set_phase(rec, "queued", now, "held by its user or an admin")
        return
    if (
        rec.phase == "starting"
        and rec.reason.startswith(REQUEUED)
        and now - rec.phase_since >= REQUEUE_WAIT_S
    ):  # requeued by Slurm and still pending on its old nodes: planned again on the nodes
        # in service (its old shape may no longer fit: 4 + 4 GPUs with one node down)
        why = "requeued by Slurm after a node failure: planned again on the nodes in service"
        out.events.append(f"replan: {why}")
        queue_again(rec, now, out, "hold", why, 0.0)
        return
    # requeued by Slurm (a node failure), also while it was being stopped for a resize, or
    # run and requeued before the controller saw its launch run
    if rec.phase == "running" or (
        rec.phase in ("starting", "stopping") and job.restarts > rec.slurm_restarts
    ):
        _set_phase(rec, "starting", now, f"{REQUEUED} (restart {job.restarts})")
        out.events.append(f"requeued: by Slurm, restart {job.restarts} (node failure?)")
        # Its node list may name the failed node. Slurm starts it there once the node is
        # back (a restarted slurmd); if it still waits after REQUEUE_WAIT_S, the controller
        # holds it and plans it again on the nodes in service (_pending).
        rec.target_gpus = rec.target_gpus or rec.gpus or rec.min_gpus
        rec.target_placement = "{}"
        rec.slurm_launch = 1
    elif rec.phase in ("queued", "stopping"):
        # released by its owner or an admin, not by the controller: held again, and started
        # by the controller alone (with its plan) when its turn comes
        why = "released outside the controller: held again (the controller starts it)"
        out.actions.append(Action("hold", rec.slurm_id, reason=why))
        out.events.append(f"hold: {why}")
        rec.reason = why
    elif rec.phase == "starting" and not rec.reason.startswith(REQUEUED):
        _launch_pending(rec, job, now, s, out)


UNTRIED_WAIT = 3
"""A launch Slurm keeps pending without a reason (``None``: its scheduler, busy, has not
looked at it yet) is planned again only after this many times ``launch_pending_s``: a hold
frees nothing there, and one sent as Slurm starts it leaves the job running unplanned."""


def _launch_pending(
    rec: JobRecord, job: ObservedJob, now: float, s: Settings, out: Outcome
) -> None:
    """A launch the controller released that Slurm keeps pending: Slurm's reason shown, and
    past ``launch_pending_s`` held again and planned afresh (its GPUs free for others).
    Pending for a limit (:func:`hpcorch.limits.refusal`), it is held at once: the loop has
    learned a cap from it (hpcorch/controller/learned.py) that the next plan keeps to.
    Without a reason, it waits ``UNTRIED_WAIT`` times as long."""
    waited = now - rec.phase_since
    slurm_reason = job.reason or "no reason given"
    if refusal(job.reason) is not None:
        why = (
            f"Slurm keeps the launch pending for a limit ({slurm_reason}): held, planned within it"
        )
        out.events.append(f"limit: {why}")
        queue_again(rec, now, out, "hold", why, s.start_backoff_s)
        return
    untried = job.reason in ("", "None")  # Slurm's scheduler has not looked at it yet
    if waited < s.launch_pending_s * (UNTRIED_WAIT if untried else 1):
        what = "Slurm has not tried it yet" if untried else "Slurm keeps it pending"
        rec.reason = f"starting: {what} ({slurm_reason}) for {waited:.0f} s"
        return
    why = f"Slurm kept the launch pending {waited:.0f} s ({slurm_reason}): held and planned again"
    out.events.append(f"replan: {why}")
    queue_again(rec, now, out, "hold", why, s.start_backoff_s)


def _relaunch_from_held(
    rec: JobRecord, now: float, pool_nodes: tuple[str, ...], out: Outcome, s: Settings
) -> None:
    forced = rec.forced_at >= rec.phase_since > 0
    moved_off(rec)
    if forced and missed_checkpoint(rec, s):
        no_checkpoints(rec, now, s, out, "it did not checkpoint when asked", cancel=True)
    elif rec.budget_spent():
        # found requeued held before its checkpoint's report was read: the same end
        budget_timeout(rec, now, out, requeued=True, forced=forced)
    elif rec.target_gpus > 0:
        out.actions.append(
            Action("start", rec.slurm_id, target_shape(rec, pool_nodes), "resume relaunch")
        )
        _set_phase(rec, "starting", now)
    else:
        _set_phase(rec, "queued", now, "preempted: checkpointed and queued")


def _running(rec: JobRecord, job: ObservedJob, now: float, s: Settings, out: Outcome) -> None:
    if rec.phase == "queued":
        # Slurm runs a job the controller did not start (released by its owner or an admin
        # before the controller could hold it again): it never trains without a plan (the
        # wrapper refuses it), and is put back, held, without counting a launch or a try
        if job.state in ("RUNNING", "CONFIGURING"):
            out.actions.append(Action("requeue_hold", rec.slurm_id, reason=UNPLANNED))
            out.events.append(f"unplanned: {UNPLANNED}")
            rec.reason = UNPLANNED
        return
    if rec.phase == "running" and job.restarts > rec.slurm_restarts:
        # requeued and started again by Slurm between two cycles (a node failure)
        rec.launches += 1
        rec.ready, rec.ready_at = 0, 0.0
        _set_phase(rec, "running", now, f"relaunched by Slurm (restart {job.restarts})")
        rec.phase_since = now
        rec.slurm_launch = 1
        out.events.append(f"requeued: by Slurm and running again, restart {job.restarts}")
    if rec.phase in ("queued", "starting"):
        rec.launches += 1
        rec.started_at = rec.started_at or now
        rec.run_seconds = 0.0
        rec.ready, rec.ready_at = 0, 0.0
        rec.launch_checkpoints = rec.checkpoints
        why = f"launch {rec.launches}"
        if rec.moved:  # why it moved stays in view
            why += f": {rec.moved}"
        _set_phase(rec, "running", now, why)
    if job.node_names and job.state != "COMPLETING":  # (completing: the nodes not done yet)
        rec.gpus = job.gpus
        rec.nodes = len(job.node_names)
        rec.node_list = ",".join(job.node_names)
        rec.node_gpus = ",".join(str(n) for n in job.per_node)
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
    if silent(rec, now, s):
        rec.reason = (
            f"launch {rec.launches}: not reported its start after {now - rec.phase_since:.0f} s "
            f"(it keeps its GPUs for the {s.startup_s:.0f} s start-up allowance at most)"
        )
    if rec.phase == "stopping":
        _stopping(rec, job, now, s, out)


def _stopping(rec: JobRecord, job: ObservedJob, now: float, s: Settings, out: Outcome) -> None:
    """A signalled job still running: signalled again every ``resignal_s``; past its grace
    requeued by force, once; and ended (scancel, failed with the reason) if Slurm still
    runs it ``force_retry_s`` after that: a preemption completes within grace + margin,
    whatever the job does."""
    waited = now - rec.phase_since
    grace = max(s.grace_s, rec.stop_grace_s + 30.0)  # the sidecar kills after its own
    forced = rec.forced_at >= rec.phase_since
    if forced and now - rec.forced_at >= s.force_retry_s and job.state == "RUNNING":
        if rec.breach:
            return  # its end is asked for: Slurm shows it soon
        bound = grace + s.force_retry_s
        cause = "Slurm refused to requeue it"
        if not job.requeue:
            cause += " (Requeue=0)"
        elif not job.batch:
            cause += " (not a batch job)"
        rec.breach = (
            f"broke the pool's contract: no checkpoint within {grace:.0f} s of the signal and "
            f"{cause}: ended after {bound:.0f} s so that its GPUs go to the jobs planned on them"
        )
        out.actions.append(Action("cancel", rec.slurm_id, reason=rec.breach))
        out.events.append(f"contract: {rec.breach}")
        rec.reason = rec.breach
    elif waited > grace and not forced:
        why = f"no checkpoint within {grace:.0f} s: requeued by force"
        out.actions.append(Action("requeue_hold", rec.slurm_id, reason=why))
        out.events.append(f"forced: {why}")
        rec.forced_at = now
        rec.reason = why
    elif not forced and now - rec.signalled_at > s.resignal_s:
        out.actions.append(Action("signal", rec.slurm_id, reason="signal again"))
        rec.signalled_at = now
