"""What the controller's store keeps, as Python values: a job's record, a decision, a
sample, a cycle's figures (and their running totals). Pure; hpcorch/controller/store.py
writes and reads them, and re-exports every name here."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

ACTIVE_PHASES = ("queued", "starting", "running", "stopping")
FINAL_PHASES = ("done", "failed", "cancelled", "lost", "timeout", "refused", "left")
"""timeout: the job checkpointed, but its time budget or its cap on relaunches is spent.
refused: the job's comment failed validation, or it cannot keep the pool's contract (an
interactive allocation); the controller never acts on it. left: moved out of the pool's
reservation by its owner or an admin; Slurm still lists it, the controller no longer
schedules it."""

TOTALS_KEY = "cycle_totals"
CYCLE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Upper bounds (seconds) of the cycle-duration histogram."""
DECISION_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0)
"""Upper bounds (seconds) of the policy-decision histogram (rounds only)."""


def _observe(hist: dict[str, Any], bounds: tuple[float, ...], value: float) -> None:
    counts = hist.setdefault("counts", [0] * len(bounds))
    for i, bound in enumerate(bounds):
        if value <= bound:
            counts[i] += 1
    hist["count"] = hist.get("count", 0) + 1
    hist["sum"] = hist.get("sum", 0.0) + value


def add_to_totals(totals: dict[str, Any], c: CycleStats | None) -> dict[str, Any]:
    """``totals`` with cycle ``c`` counted in (None: just filled with zeros). Histogram
    counts are cumulative per bucket, as Prometheus wants them."""
    totals.setdefault("cycles", 0)
    totals.setdefault("slurm_calls", 0)
    for key, bounds in (("cycle_seconds", CYCLE_BUCKETS), ("decision_seconds", DECISION_BUCKETS)):
        hist = totals.setdefault(key, {})
        hist["bounds"] = list(bounds)
        if len(hist.setdefault("counts", [0] * len(bounds))) != len(bounds):
            hist["counts"] = [0] * len(bounds)  # bounds changed: start the buckets afresh
        hist.setdefault("count", 0)
        hist.setdefault("sum", 0.0)
    if c is not None:
        totals["cycles"] += 1
        totals["slurm_calls"] += c.slurm_calls
        _observe(totals["cycle_seconds"], CYCLE_BUCKETS, c.seconds)
        if c.decision_s > 0:  # a cycle without a scheduling round decided nothing
            _observe(totals["decision_seconds"], DECISION_BUCKETS, c.decision_s)
    return totals


@dataclass
class JobRecord:
    """One job as the controller remembers it."""

    slurm_id: int
    job_key: str
    name: str
    user: str
    job_dir: str
    app: str
    min_gpus: int
    max_gpus: int
    batch: int
    max_batch: int
    max_micro: int
    submit_time: float
    phase: str
    phase_since: float
    gpus: int = 0
    nodes: int = 0
    node_list: str = ""
    target_gpus: int = 0
    target_placement: str = "{}"
    global_batch: int = 0
    micro_batch: int = 0
    accum_steps: int = 1
    launches: int = 0
    resizes: int = 0
    failures: int = 0
    started_at: float = 0.0
    finished_at: float = 0.0
    gpu_seconds: float = 0.0
    run_seconds: float = 0.0
    reason: str = ""
    metrics_offset: int = 0
    progress: float = 0.0
    samples_per_s: float = 0.0
    exit_code: int = 0
    signalled_at: float = 0.0
    epoch: int = 0
    epochs: int = 0
    """Epochs the job trains for, once it reports them (0: unknown)."""
    steps_per_epoch: float = 0.0
    """Optimizer steps per epoch at the job's initial batch size (0: unknown)."""
    target_batch: int = 0
    """Global batch the policy chose for the next launch."""
    ready: int = 0
    """1 once the current launch reported that training started (it can checkpoint)."""
    slurm_restarts: int = 0
    """Slurm's restart count of the job when last seen."""
    mode: str = "managed"
    """managed (the script uses the runtime) or sidecar."""
    mode_detected: int = 0
    """1 when the mode was found at launch rather than declared at submit."""
    resumable: int = 1
    """0 for a sidecar job whose script keeps no checkpoint: never stopped to resize."""
    predictable: int = 1
    """0 for a sidecar job with no progress source: scheduled by attained service."""
    needs_ckpt: int = 0
    """1 when its checkpoint directory is watched: resizable once a checkpoint is there."""
    checkpoints: int = 0
    """Checkpoints the job reported (or the sidecar saw) so far."""
    lost_steps: int = 0
    """Steps done again after stops, as the relaunches reported them."""
    kills: int = 0
    """Stops where the script ignored the stop signal and was killed after the grace."""
    stop_grace_s: float = 0.0
    """The sidecar's grace period for this job's script (0: managed)."""
    cpus_per_gpu: int = 0
    """CPUs per GPU of the current launch, as the job reports it (0: unknown)."""
    target_cpus: int = 0
    """CPUs per GPU the policy chose for the next launch (0: as submitted)."""
    min_cpus: int = 1
    """The fewest CPUs per GPU the job asked for."""
    time_budget_s: float = 0.0
    """Run time the job may use across all its launches (0: no budget)."""
    max_relaunches: int = -1
    """Relaunches allowed after the job checkpointed on its own (time limit; -1: no cap)."""
    time_relaunches: int = 0
    """Relaunches so far after the job checkpointed on its own."""
    run_total_s: float = 0.0
    """Run time across all launches so far (running or stopping)."""
    uid: int = -1
    """The Unix user id of the job's owner, as Slurm reports it (-1: unknown)."""
    start_failures: int = 0
    """Starts in a row that failed (the plan could not be written, Slurm refused)."""
    retry_at: float = 0.0
    """A queued job whose start failed is not started again before this time."""
    forced_at: float = 0.0
    """When a stopping job was last requeued by force (0: not in this stop)."""
    fingerprint: str = ""
    """The model the job's runtime reported (class:parameters:dataset size; '' unknown)."""
    model_bytes: int = 0
    """Gradient bytes per step the job's runtime reported (0: unknown)."""

    node_gpus: str = ""
    """GPUs on each node of ``node_list`` ("4,2"), as Slurm reports them; empty: the same
    on every node."""
    ready_at: float = 0.0
    """When the current launch reported that training started (0: not yet)."""
    slurm_launch: int = 0
    """1 while the current launch is one Slurm made on its own after a node failure (its
    requeue), not one the controller started: such a launch failing before it trains is
    the node's doing (a returning node refuses it), never counted as a try of the job."""
    gpu_types: str = ""
    """The GPU types the job accepts, comma-separated (``submit --gpu-types``; '': any)."""
    gpu_type: str = ""
    """The GPU type of the nodes Slurm shows for the running (or last) launch, sorted and
    ``+``-joined if they are of several ('': untyped, or not launched yet)."""
    target_type: str = ""
    """The GPU type the plan chose for the next launch ('': any)."""
    breach: str = ""
    """How the job broke the pool's contract when the controller ended it ('' none): the
    reason it is failed with once Slurm shows it ended."""
    checkpoint_misses: int = 0
    """Launches in a row that trained and ended without a checkpoint (failed writes, or
    stopped by force): the next launch starts from the last checkpoint again."""
    launch_checkpoints: int = 0
    """``checkpoints`` when the current launch started (a checkpoint since: it kept some)."""
    trained_step: int = 0
    """The highest step the job has reported (a launch that starts below it lost work)."""
    requeue_fixed_at: float = 0.0
    """When the controller last set a Requeue=0 job back to Requeue=1."""
    time_limit_min: int = 0
    """The job's own time limit per launch, as Slurm first showed it (minutes; -1 none;
    0 not known)."""
    limit_cut: str = ""
    """Why its launch's time limit is cut short to end before a window on its nodes (the
    node and the window; '' while it is not)."""
    moved: str = ""
    """Why its last relaunch moved it off a node (a drain, a window; '' it did not)."""

    def accepted_types(self) -> tuple[str, ...]:
        return tuple(t for t in self.gpu_types.split(",") if t)

    def budget_spent(self) -> bool:
        return 0 < self.time_budget_s <= self.run_total_s

    @property
    def movable(self) -> bool:
        """Whether the job can be stopped and resumed (resized, preempted) now."""
        if self.mode != "sidecar":
            return True
        return bool(self.resumable) and (not self.needs_ckpt or self.checkpoints > 0)

    def fixed_reason(self) -> str:
        if not self.resumable:
            return (
                "not resizable: its script keeps no checkpoint (submit with --ckpt-dir, "
                "--resume-arg or --resume-cmd)"
            )
        return "not resizable until its first checkpoint"

    @property
    def active(self) -> bool:
        return self.phase in ACTIVE_PHASES

    def placement(self) -> dict[int, int]:
        return {int(k): int(v) for k, v in json.loads(self.target_placement or "{}").items()}


@dataclass(frozen=True)
class Decision:
    id: int
    time: float
    slurm_id: int
    action: str
    from_gpus: int
    to_gpus: int
    global_batch: int
    detail: str
    status: str
    done_at: float


@dataclass(frozen=True)
class Sample:
    slurm_id: int
    time: float
    gpus: int
    nodes: int
    micro_batch: int
    accum_steps: int
    global_batch: int
    step_time: float
    samples_per_s: float
    loss: float | None = None
    noise_scale: float | None = None
    step: int = 0
    cpus_per_gpu: int = 0
    data_wait: float | None = None
    """Seconds per step the job waited for its input (None: not measured)."""
    epoch: int = 0
    """The epoch the job was in when it reported."""
    gpu_type: str = ""
    """The GPU type of the launch it reported from ('': untyped)."""


@dataclass
class CycleStats:
    time: float
    seconds: float
    decision_s: float
    slurm_calls: int
    jobs: int
    actions: int
    extra: dict[str, float] = field(default_factory=dict)
    full: bool = True
    """A full cycle (every job's metrics read), not a fast one."""
