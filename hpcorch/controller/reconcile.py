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

A checkpoint on request shows as the job requeued held by its wrapper in Slurm's
SPECIAL_EXIT state, its restart count up by one (accounting then shows a requeue, not a
failure), or, from a wrapper whose requeue Slurm refused, as an end with exit code 75.

Every action is safe to repeat, and every phase can be re-entered from what Slurm
reports, so a controller killed between two actions continues where it stopped.

Alongside: hpcorch/controller/actions.py (settings, actions), shapes.py (where and when a
start goes) and decide.py (a policy's target to actions); their names are re-exported here.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpcorch.cluster import ObservedJob, Shape
from hpcorch.controller.actions import Action, Outcome, Settings
from hpcorch.controller.actions import set_phase as _set_phase
from hpcorch.controller.decide import can_stop, decide, trained_since
from hpcorch.controller.shapes import launch_wait, start_claims, start_wait, target_shape
from hpcorch.controller.store import JobRecord
from hpcorch.gputypes import type_of_nodes
from hpcorch.limits import refusal
from hpcorch.protocol import EXIT_CONFIG, EXIT_RELAUNCH, EXIT_STORAGE, EXIT_UNPLANNED
from hpcorch.timefmt import fmt_duration

__all__ = [
    "REQUEUED",
    "Action",
    "Outcome",
    "Settings",
    "can_stop",
    "decide",
    "launch_wait",
    "observe",
    "start_claims",
    "start_wait",
    "target_shape",
    "trained_since",
]

REQUEUED = "requeued by Slurm"
REQUEUE_WAIT_S = 30.0
"""A job Slurm requeued after a node failure is left this long for Slurm to start on its
old nodes (a node whose slurmd restarts is back within seconds); then it is restarted
anywhere in the pool, without the node list that names the failed node."""


def observe(
    rec: JobRecord,
    job: ObservedJob | None,
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
    node_types: Mapping[str, str] | None = None,
) -> Outcome:
    """Move ``rec`` along with what the cluster reports about it. ``node_types``: the GPU
    type of each pool node by name (its launch's type is read off its nodes)."""
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
        # when Slurm saw it end (its JCT), not the cycle that noticed it
        rec.finished_at = job.end_time if 0 < job.end_time <= now else now
        rec.exit_code = 0
        out.events.append("done: training finished")
    elif job.ended:
        _ended(rec, job, now, pool_nodes, s, out)
    elif job.special_exit and job.restarts > restarts_before and job.state == "PENDING":
        rec.exit_code = EXIT_RELAUNCH
        _checkpointed(rec, now, pool_nodes, out, requeued=True)
    elif job.state == "PENDING":
        _pending(rec, job, now, pool_nodes, out, s)
    else:  # RUNNING, COMPLETING, CONFIGURING, SUSPENDED, ...
        _running(rec, job, now, s, out)
        # Slurm is the truth about where it runs, not the job
        if job.node_names and rec.phase in ("running", "stopping"):
            rec.gpu_type = type_of_nodes(job.node_names, node_types or {})
    rec.slurm_restarts = max(restarts_before, job.restarts)
    return out


def _relaunch(
    rec: JobRecord,
    now: float,
    pool_nodes: tuple[str, ...],
    out: Outcome,
    why: str,
    requeued: bool = False,
) -> None:
    """Back in the queue held (``requeued``: the job requeued itself held), and started at
    its target size, or left queued when its target is 0."""
    rec.slurm_launch = 0
    if not requeued:
        out.actions.append(Action("requeue_hold", rec.slurm_id, reason=why))
    if rec.target_gpus > 0:
        out.actions.append(Action("start", rec.slurm_id, target_shape(rec, pool_nodes), why))
        _set_phase(rec, "starting", now, why)
    else:
        _set_phase(rec, "queued", now, why)
    rec.phase_since = now  # when the end was seen: the relaunch waits from here


def _ended(
    rec: JobRecord,
    job: ObservedJob,
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
    out: Outcome,
) -> None:
    rec.exit_code = job.exit_code
    if rec.budget_spent():
        _budget_timeout(rec, now, out, requeued=False)
        return
    if job.exit_code == EXIT_RELAUNCH:
        _checkpointed(rec, now, pool_nodes, out, requeued=False)
        return
    if job.exit_code == EXIT_STORAGE:
        _storage_failed(rec, now, s, out)
        return
    if job.exit_code == EXIT_UNPLANNED:
        _unplanned(rec, now, s, out)
        return
    if rec.slurm_launch and not rec.ready:
        _node_refused(rec, job, now, s, out)
        return
    rec.failures += 1
    what = f"{job.state.lower()} with exit code {job.exit_code}"
    if job.exit_code == EXIT_CONFIG:
        _set_phase(rec, "failed", now, f"{what}: a bad plan or checkpoint, not retried")
        rec.finished_at = now
        out.events.append(f"failed: {rec.reason}")
        return
    if rec.failures <= s.max_retries:
        # back in the queue, its GPUs free for others, started again after a back-off: a
        # launch that fails at once (a full disk, a bad node) does not loop
        delay = min(s.start_backoff_max_s, s.start_backoff_s * 2 ** (rec.failures - 1))
        why = f"{what}: retry {rec.failures}/{s.max_retries} from the last checkpoint"
        out.events.append(f"retry: {why} in {delay:.0f} s")
        _queue_again(rec, now, out, "requeue_hold", why, delay, f"{why} in {delay:.0f} s")
    else:
        _set_phase(rec, "failed", now, f"{what}; gave up after {s.max_retries} retries")
        rec.finished_at = now
        out.events.append(f"failed: {rec.reason}")


def _checkpointed(
    rec: JobRecord, now: float, pool_nodes: tuple[str, ...], out: Outcome, requeued: bool
) -> None:
    """The job checkpointed and asks to be relaunched: at its new size after the
    controller's signal (a resize, or a preemption to 0 GPUs), at its size when it did so
    on its own (its time limit), unless its time budget or relaunch cap is spent.
    ``requeued``: the job is already back in the queue, held (its wrapper requeued it)."""
    if requeued and rec.budget_spent():
        _budget_timeout(rec, now, out, requeued=True)
        return
    if rec.phase != "stopping":
        rec.time_relaunches += 1
        if 0 <= rec.max_relaunches < rec.time_relaunches:
            _timeout(
                rec,
                now,
                out,
                f"checkpointed on its own (time limit?) {rec.time_relaunches} times: "
                f"--max-relaunches {rec.max_relaunches} reached",
                requeued,
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
    _relaunch(rec, now, pool_nodes, out, why, requeued)


def _budget_timeout(rec: JobRecord, now: float, out: Outcome, requeued: bool) -> None:
    why = (
        f"time budget spent: ran {fmt_duration(rec.run_total_s)} of "
        f"{fmt_duration(rec.time_budget_s)} over {rec.launches} launch(es)"
    )
    _timeout(rec, now, out, why, requeued)


UNPLANNED = "started without the controller's plan (released by its user or an admin): held again"


def _unplanned(rec: JobRecord, now: float, s: Settings, out: Outcome) -> None:
    """The wrapper found no plan of the controller's and ran nothing (EXIT_UNPLANNED).
    Released by its owner or an admin while queued: held again, not a try. Released while
    the controller was starting it (the plan not written yet, or unreadable on the node):
    planned again after a back-off, counted as a failed start (:func:`_back_off`)."""
    if rec.phase != "queued":
        what = (
            "its launch found no plan from the controller (exit 77: is the job's HPCORCH_SPOOL "
            "the controller's --spool, readable on the nodes?)"
        )
        _back_off(rec, now, s, out, what)
        return
    out.actions.append(Action("requeue_hold", rec.slurm_id, reason=UNPLANNED))
    rec.target_gpus = 0
    rec.target_placement = "{}"
    out.events.append(f"unplanned: {UNPLANNED} (not a try)")
    rec.reason = UNPLANNED


def _queue_again(
    rec: JobRecord,
    now: float,
    out: Outcome,
    kind: str,
    why: str,
    delay: float,
    reason: str | None = None,
) -> None:
    """Back to the queue, its GPUs free for others, planned afresh after ``delay``: the job
    requeued held (``kind`` "requeue_hold": its run ended) or held (``kind`` "hold": a
    launch still pending). ``reason``: the job's reason, when not ``why``."""
    out.actions.append(Action(kind, rec.slurm_id, reason=why))
    rec.target_gpus = 0
    rec.target_placement = "{}"
    rec.retry_at = now + delay
    _set_phase(rec, "queued", now, reason or why)
    rec.phase_since = now


def _back_off(rec: JobRecord, now: float, s: Settings, out: Outcome, what: str) -> None:
    """A launch that failed for a lasting condition (``what``), not by training: requeued
    held, its GPUs released, retried after 2, 4, 8.. s like a failed start; the job failed
    at the ``max_start_failures``-th in a row (a run that reports its start resets the
    count)."""
    rec.start_failures += 1
    n = rec.start_failures
    if n >= s.max_start_failures:
        _set_phase(rec, "failed", now, f"{what}; gave up after {n} tries")
        rec.finished_at = now
        rec.retry_at = 0.0
        out.events.append(f"failed: {rec.reason}")
        return
    delay = min(s.start_backoff_max_s, s.start_backoff_s * 2 ** (n - 1))
    why = f"{what}: GPUs released, retry {n}/{s.max_start_failures - 1} in {delay:.0f} s"
    out.events.append(f"retry: {why}")
    _queue_again(rec, now, out, "requeue_hold", why, delay)


def _node_refused(rec: JobRecord, job: ObservedJob, now: float, s: Settings, out: Outcome) -> None:
    """A launch Slurm made on its own after a node failure ended before it trained: the
    returning node refused it ("Job credential revoked"), not the job's doing. Never a try of
    the job: back in the queue after a short back-off, planned afresh."""
    rec.slurm_launch = 0
    delay = s.start_backoff_s
    why = (
        f"Slurm's restart after a node failure ended at once ({job.state.lower()}, exit code "
        f"{job.exit_code}) before training: not counted as a try, planned again in "
        f"{delay:.0f} s"
    )
    out.events.append(f"requeued: {why}")
    _queue_again(rec, now, out, "requeue_hold", why, delay)


def _timeout(rec: JobRecord, now: float, out: Outcome, why: str, requeued: bool = False) -> None:
    """The job ends for good, its last checkpoint kept: a resubmission continues from it.
    ``requeued``: its wrapper had requeued it held; the controller cancels it."""
    _set_phase(rec, "timeout", now, f"{why}; not relaunched (resubmit to continue)")
    rec.finished_at = now
    out.events.append(f"timeout: {rec.reason}")
    if requeued:
        out.actions.append(Action("cancel", rec.slurm_id, reason=rec.reason))


def _storage_failed(rec: JobRecord, now: float, s: Settings, out: Outcome) -> None:
    """The runtime could not write the job directory (EXIT_STORAGE): a lasting condition,
    backed off like a failed start."""
    what = (
        f"its job directory cannot be written (exit {EXIT_STORAGE}: no space, read-only or "
        "permission denied)"
    )
    _back_off(rec, now, s, out, what)


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
            _relaunch_from_held(rec, now, pool_nodes, out)
        elif rec.phase == "running":
            _set_phase(rec, "queued", now, "held by its user or an admin")
        return
    if (
        rec.phase == "starting"
        and rec.reason.startswith(REQUEUED)
        and now - rec.phase_since >= REQUEUE_WAIT_S
    ):  # requeued by Slurm and still pending on its old nodes: restart it anywhere
        shape = target_shape(rec, pool_nodes)
        rec.reason = "restarting anywhere after a node failure"
        out.actions.append(
            Action("start", rec.slurm_id, Shape(shape.nodes, shape.gpus_per_node), rec.reason)
        )
        return
    # requeued by Slurm (a node failure), also while it was being stopped for a resize
    if rec.phase == "running" or (rec.phase == "stopping" and job.restarts > rec.slurm_restarts):
        _set_phase(rec, "starting", now, f"{REQUEUED} (restart {job.restarts})")
        out.events.append(f"requeued: by Slurm, restart {job.restarts} (node failure?)")
        # Its node list may name the failed node. Slurm starts it there once the node is
        # back (a restarted slurmd); if it still waits after REQUEUE_WAIT_S, the controller
        # restarts it anywhere in the pool (_pending).
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


def _launch_pending(
    rec: JobRecord, job: ObservedJob, now: float, s: Settings, out: Outcome
) -> None:
    """A launch the controller released that Slurm keeps pending: Slurm's reason shown, and
    past ``launch_pending_s`` held again and planned afresh (its GPUs free for others).
    Pending for a limit (:func:`hpcorch.limits.refusal`), it is held at once: the loop has
    learned a cap from it (hpcorch/controller/learned.py) that the next plan keeps to."""
    waited = now - rec.phase_since
    slurm_reason = job.reason or "no reason given"
    if refusal(job.reason) is not None:
        why = (
            f"Slurm keeps the launch pending for a limit ({slurm_reason}): held, planned within it"
        )
        out.events.append(f"limit: {why}")
        _queue_again(rec, now, out, "hold", why, s.start_backoff_s)
        return
    if waited < s.launch_pending_s:
        rec.reason = f"starting: Slurm keeps it pending ({slurm_reason}) for {waited:.0f} s"
        return
    why = f"Slurm kept the launch pending {waited:.0f} s ({slurm_reason}): held and planned again"
    out.events.append(f"replan: {why}")
    _queue_again(rec, now, out, "hold", why, s.start_backoff_s)


def _relaunch_from_held(
    rec: JobRecord, now: float, pool_nodes: tuple[str, ...], out: Outcome
) -> None:
    if rec.budget_spent():
        _timeout(rec, now, out, "time budget spent (the checkpoint was forced)", requeued=True)
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
        _set_phase(rec, "running", now, f"launch {rec.launches}")
    if job.node_names:
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
    if rec.phase == "stopping":
        waited = now - rec.phase_since
        grace = max(s.grace_s, rec.stop_grace_s + 30.0)  # the sidecar kills after its own
        if waited > grace:
            if rec.forced_at < rec.phase_since or now - rec.forced_at >= s.force_retry_s:
                again = rec.forced_at >= rec.phase_since
                why = f"no checkpoint within {grace:.0f} s: requeued by force"
                if again:
                    why += f" (again: Slurm still showed it {job.state.lower()})"
                out.actions.append(Action("requeue_hold", rec.slurm_id, reason=why))
                out.events.append(f"forced: {why}")
                rec.forced_at = now
                rec.reason = why
        elif now - rec.signalled_at > s.resignal_s:
            out.actions.append(Action("signal", rec.slurm_id, reason="signal again"))
            rec.signalled_at = now
