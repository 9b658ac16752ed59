"""What the job state machine works with: its settings, the actions it asks of the cluster
and the outcome of one step (hpcorch/controller/reconcile.py, decide.py). Pure."""

from __future__ import annotations

from dataclasses import dataclass, field

from hpcorch.cluster import Shape
from hpcorch.controller.store import JobRecord


@dataclass(frozen=True)
class Settings:
    grace_s: float = 120.0
    """How long a signalled job may take to checkpoint before it is requeued by force."""
    force_retry_s: float = 60.0
    """A job Slurm still shows running this long after its forced requeue cannot be
    requeued (its owner set Requeue=0, or it is no batch job): it is ended (scancel) and
    failed with the reason. A preemption thus completes within ``grace_s`` (the checkpoint
    allowance) + this margin, whatever the job does; the requeue is forced once, not at
    every cycle."""
    resignal_s: float = 15.0
    """A signalled job still running after this long is signalled again."""
    max_retries: int = 2
    """Relaunches after a failure before the job is left failed."""
    min_run_s: float = 60.0
    """A launch trains at least this long (and at least the restart cost the policy is
    told) after it reported its start before the controller resizes or preempts it."""
    startup_s: float = 600.0
    """A launch that has not reported its start is left alone this long (it could not
    checkpoint yet: a signal would kill it); after that it is treated as started."""
    relaunch_delay_s: float = 1.0
    """A relaunch (after a run ended) is released this many seconds after the start of
    the whole second in which the controller saw the run end; the requeue happens at
    once. slurmd refuses a job id's new launch whose credential was made in the second
    it revoked the last run's credential, or earlier ("Job credential revoked"); it
    revokes it before Slurm shows the run as ended, so the next whole second is safe
    (local pool: a release 0.55 s after the end's second was refused, 1.03 s after ran)."""
    exact_wait_s: float = 10.0
    """How long an uneven launch whose planned GPUs are free waits for its nodes' other
    free GPUs to be taken before it goes with the split Slurm picks (:func:`launch_wait`)."""
    start_backoff_s: float = 2.0
    """After a failed start (or a failed launch), the job waits this long before it is
    started again, doubled at every failure in a row."""
    start_backoff_max_s: float = 300.0
    max_start_failures: int = 5
    """Starts in a row that may fail (the plan cannot be written, Slurm refuses) before the
    job is left failed."""
    max_checkpoint_misses: int = 3
    """Launches in a row that train and end without a checkpoint (its writes fail: exit
    74; it ignores the signal and is requeued by force) before the job is failed: each
    relaunch would train from its last checkpoint again and throw the work away."""
    launch_pending_s: float = 90.0
    """A launch the controller released that Slurm still keeps pending after this long is
    held again and planned afresh (Slurm's reason in the job's reason and the log)."""


@dataclass(frozen=True)
class Action:
    """One thing to ask of the cluster."""

    kind: str
    """start, hold, signal, requeue_hold, cancel (a job its wrapper requeued held whose time
    budget or relaunch cap is spent, or one that broke the pool's contract), rebatch (a
    running job's plan rewritten with its own launch number: a new global batch at its next
    step, no restart), or allow_requeue (a pool job made Requeue=0 set back to Requeue=1)."""
    slurm_id: int
    shape: Shape | None = None
    reason: str = ""


@dataclass
class Outcome:
    actions: list[Action] = field(default_factory=list)
    events: list[str] = field(default_factory=list)
    """Decisions worth recording (resize, preempt, retry, ...), as 'kind: detail'."""


def set_phase(rec: JobRecord, phase: str, now: float, reason: str | None = None) -> None:
    if rec.phase != phase:
        rec.phase = phase
        rec.phase_since = now
    if reason is not None:
        rec.reason = reason
