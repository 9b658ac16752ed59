"""How a launch ends, and what the job's record does next: finished, relaunched after a
checkpoint, retried after a failure, backed off after a lasting condition, failed after
too many launches that kept nothing, timed out, or gone from the pool. Pure; called by
the state machine (hpcorch/controller/reconcile.py)."""

from __future__ import annotations

from hpcorch.cluster import ObservedJob
from hpcorch.controller.actions import Action, Outcome, Settings
from hpcorch.controller.actions import set_phase as _set_phase
from hpcorch.controller.shapes import target_shape
from hpcorch.controller.store import JobRecord
from hpcorch.protocol import (
    EXIT_CONFIG,
    EXIT_LAUNCH_LOST,
    EXIT_RELAUNCH,
    EXIT_STORAGE,
    EXIT_UNPLANNED,
)
from hpcorch.timefmt import fmt_duration

LEAVING = "leaving "
"""The reason a job moving off a node starts with (hpcorch/controller/availability.py)."""
MOVED = "moved off "
"""... and once it checkpointed to move."""


def left(rec: JobRecord, now: float, where: str, out: Outcome) -> None:
    """Moved out of the pool's reservation (``scontrol update ReservationName=``): Slurm
    still lists it, the controller no longer schedules it."""
    now_in = f"now in reservation {where}" if where else "now in no reservation"
    why = (
        f"moved out of the pool by its owner or an admin ({now_in}): no longer scheduled "
        "by hpcorch; a launch outside the pool runs nothing without the controller's plan "
        "(scancel it, or resubmit)"
    )
    _set_phase(rec, "left", now, why)
    rec.finished_at = now
    out.events.append(f"left: {why}")


def relaunch(
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


def ended(
    rec: JobRecord,
    job: ObservedJob,
    now: float,
    pool_nodes: tuple[str, ...],
    s: Settings,
    out: Outcome,
) -> None:
    rec.exit_code = job.exit_code
    if rec.budget_spent():
        budget_timeout(rec, now, out, requeued=False)
        return
    if job.exit_code == EXIT_RELAUNCH:
        checkpointed(rec, now, pool_nodes, out, requeued=False)
        return
    if job.exit_code == EXIT_STORAGE:
        storage_failed(rec, now, s, out)
        return
    if job.exit_code == EXIT_UNPLANNED:
        unplanned(rec, now, s, out)
        return
    if rec.slurm_launch and not rec.ready:
        node_refused(rec, job, now, s, out)
        return
    if job.exit_code == EXIT_LAUNCH_LOST and not rec.ready:
        # srun could not start its step (slurmctld stopped or overloaded): no try of its
        # training, backed off like a failed start
        what = f"its launch ended before any task of it started (exit {EXIT_LAUNCH_LOST})"
        back_off(rec, now, s, out, what)
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
        queue_again(rec, now, out, "requeue_hold", why, delay, f"{why} in {delay:.0f} s")
    else:
        _set_phase(rec, "failed", now, f"{what}; gave up after {s.max_retries} retries")
        rec.finished_at = now
        out.events.append(f"failed: {rec.reason}")


def checkpointed(
    rec: JobRecord, now: float, pool_nodes: tuple[str, ...], out: Outcome, requeued: bool
) -> None:
    """The job checkpointed and asks to be relaunched: at its new size after the
    controller's signal (a resize, or a preemption to 0 GPUs), at its size when it did so
    on its own (its time limit), unless its time budget or relaunch cap is spent.
    ``requeued``: the job is already back in the queue, held (its wrapper requeued it)."""
    if requeued and rec.budget_spent():
        budget_timeout(rec, now, out, requeued=True)
        return
    if rec.phase != "stopping" and rec.limit_cut:
        # its time limit was cut for a window on its nodes: the window's doing, not its own
        # limit (its pre-limit signal may come before the controller moves it): back to the
        # queue, planned again at the next cycle on the nodes the window leaves
        rec.moved = f"{MOVED}{rec.limit_cut}"
        out.events.append(f"checkpointed: {rec.moved}")
        queue_again(rec, now, out, "requeue_hold", rec.moved, 0.0)
        if requeued:
            out.actions.pop()  # it requeued itself held: nothing to ask of Slurm
        rec.retry_at = now  # a round at the next cycle
        return
    if rec.phase != "stopping":
        rec.time_relaunches += 1
        if 0 <= rec.max_relaunches < rec.time_relaunches:
            timeout(
                rec,
                now,
                out,
                f"checkpointed on its own (time limit?) {rec.time_relaunches} times: "
                f"--max-relaunches {rec.max_relaunches} reached",
                requeued,
            )
            return
    if rec.phase == "stopping":
        if moved_off(rec):
            why = rec.moved
            if rec.target_gpus == 0:
                why += ": checkpointed and queued"
        elif rec.target_gpus == 0:
            why = "preempted: checkpointed and queued"
        else:
            why = f"resized {rec.gpus} -> {rec.target_gpus} GPUs"
            rec.resizes += 1
    else:
        rec.target_gpus = rec.target_gpus or rec.gpus or rec.min_gpus
        why = "checkpointed on its own (time limit?): relaunched"
    out.events.append(f"checkpointed: {why}")
    relaunch(rec, now, pool_nodes, out, why, requeued)


def moved_off(rec: JobRecord) -> bool:
    """Whether the stop that ends was a move off a node an admin drains or a window takes
    (its reason says so): ``rec.moved`` keeps why, shown again once it runs elsewhere."""
    moved = rec.phase == "stopping" and rec.reason.startswith(LEAVING)
    rec.moved = MOVED + rec.reason[len(LEAVING) :] if moved else ""
    return moved


def budget_timeout(
    rec: JobRecord, now: float, out: Outcome, requeued: bool, forced: bool = False
) -> None:
    why = (
        f"time budget spent: ran {fmt_duration(rec.run_total_s)} of "
        f"{fmt_duration(rec.time_budget_s)} over {rec.launches} launch(es)"
    )
    timeout(rec, now, out, why + (" (the checkpoint was forced)" if forced else ""), requeued)


UNPLANNED = "started without the controller's plan (released by its user or an admin): held again"


def unplanned(rec: JobRecord, now: float, s: Settings, out: Outcome) -> None:
    """The wrapper found no plan of the controller's and ran nothing (EXIT_UNPLANNED).
    Released by its owner or an admin while queued: held again, not a try. Released while
    the controller was starting it (the plan not written yet, or unreadable on the node):
    planned again after a back-off, counted as a failed start (:func:`_back_off`)."""
    if rec.phase != "queued":
        what = (
            "its launch found no plan from the controller (exit 77: is the job's HPCORCH_SPOOL "
            "the controller's --spool, readable on the nodes?)"
        )
        back_off(rec, now, s, out, what)
        return
    out.actions.append(Action("requeue_hold", rec.slurm_id, reason=UNPLANNED))
    rec.target_gpus = 0
    rec.target_placement = "{}"
    out.events.append(f"unplanned: {UNPLANNED} (not a try)")
    rec.reason = UNPLANNED


def queue_again(
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


def back_off(rec: JobRecord, now: float, s: Settings, out: Outcome, what: str) -> None:
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
    queue_again(rec, now, out, "requeue_hold", why, delay)


NODE_REFUSED_WAIT_S = 15.0
"""The least wait before a job whose restart a returning node refused is planned again."""


def node_refused(rec: JobRecord, job: ObservedJob, now: float, s: Settings, out: Outcome) -> None:
    """A launch Slurm made on its own after a node failure ended before it trained: the
    returning node refused it ("Job credential revoked"), not the job's doing. Never a try of
    the job: back in the queue after a short back-off, planned afresh. The back-off is at
    least ``NODE_REFUSED_WAIT_S``: the returning node's slurmd may still hold that launch,
    and a relaunch there before it lets go is refused as a "Duplicate jobid" that drains
    the node."""
    rec.slurm_launch = 0
    delay = max(s.start_backoff_s, NODE_REFUSED_WAIT_S)
    why = (
        f"Slurm's restart after a node failure ended at once ({job.state.lower()}, exit code "
        f"{job.exit_code}) before training: not counted as a try, planned again in "
        f"{delay:.0f} s"
    )
    out.events.append(f"requeued: {why}")
    queue_again(rec, now, out, "requeue_hold", why, delay)


def timeout(rec: JobRecord, now: float, out: Outcome, why: str, requeued: bool = False) -> None:
    """The job ends for good, its last checkpoint kept: a resubmission continues from it.
    ``requeued``: its wrapper had requeued it held; the controller cancels it."""
    _set_phase(rec, "timeout", now, f"{why}; not relaunched (resubmit to continue)")
    rec.finished_at = now
    out.events.append(f"timeout: {rec.reason}")
    if requeued:
        out.actions.append(Action("cancel", rec.slurm_id, reason=rec.reason))


def storage_failed(rec: JobRecord, now: float, s: Settings, out: Outcome) -> None:
    """The runtime could not write the job directory (EXIT_STORAGE): a lasting condition,
    backed off like a failed start; failed at the ``max_checkpoint_misses``-th launch in a
    row that trained and kept nothing."""
    what = (
        f"its job directory cannot be written (exit {EXIT_STORAGE}: no space, read-only or "
        "permission denied)"
    )
    if missed_checkpoint(rec, s):
        no_checkpoints(rec, now, s, out, what)
        return
    back_off(rec, now, s, out, what)


def missed_checkpoint(rec: JobRecord, s: Settings) -> bool:
    """Count a launch that trained and ended without a checkpoint (the next one starts from
    the last checkpoint again); whether the job has now missed ``max_checkpoint_misses`` in
    a row."""
    if rec.ready and rec.checkpoints == rec.launch_checkpoints:
        rec.checkpoint_misses += 1
    return rec.checkpoint_misses >= s.max_checkpoint_misses


def no_checkpoints(
    rec: JobRecord, now: float, s: Settings, out: Outcome, what: str, cancel: bool = False
) -> None:
    """Failed: ``max_checkpoint_misses`` launches in a row trained and kept nothing.
    ``cancel``: Slurm still holds the job (requeued held): ended there too."""
    why = (
        f"{rec.checkpoint_misses} launches in a row trained and ended without a checkpoint "
        f"({what}): not relaunched, each relaunch would throw its work away again"
    )
    _set_phase(rec, "failed", now, why)
    rec.finished_at = now
    rec.retry_at = 0.0
    out.events.append(f"failed: {why}")
    if cancel:
        out.actions.append(Action("cancel", rec.slurm_id, reason=why))
