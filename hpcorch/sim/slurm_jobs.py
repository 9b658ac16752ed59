"""What the simulated Slurm knows of a job: its comment, state and launch, around the
job's true model (:class:`hpcorch.sim.engine.SimJob`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hpcorch.cluster import ObservedJob, Shape
from hpcorch.planner import LaunchPlan
from hpcorch.sim.engine import SimJob
from hpcorch.sim.traces import AppTrace
from hpcorch.sim.workload import WorkloadJob

INF = math.inf


def job_tags(
    spec: WorkloadJob, app: AppTrace, total_gpus: int, job_dir: str, declares_length: bool = True
) -> dict[str, str]:
    """The hpcorch comment of a managed submission of ``spec`` (bounds as the direct loop);
    ``declares_length``: its user gave ``--epochs`` and ``--dataset-size``."""
    cap = min(total_gpus, app.max_batch // app.min_micro)
    tags = {
        "id": spec.name,
        "min": "1",
        "max": str(max(cap, min(spec.num_replicas, total_gpus))),
        "batch": str(app.init_batch),
        "maxbatch": str(app.max_batch),
        "micro": str(app.max_micro),
        "req": str(spec.num_replicas),
        "reqbatch": str(spec.batch_size),
        "app": spec.application,
        "dir": job_dir,
    }
    if declares_length:  # the length a user declares at submission: epochs, samples per epoch
        tags["epochs"] = str(app.epochs)
        tags["dataset"] = str(max(1, round(app.progress_per_epoch_hint * app.init_batch)))
    return tags


@dataclass
class Checkpoint:
    progress: float = 0.0
    epoch: int = 0
    steps: float = 0.0
    history: int = 0


@dataclass
class SlurmJob:
    """What Slurm knows of one simulated job, around its true model."""

    slurm_id: int
    model: SimJob
    tags: dict[str, str]
    declares_length: bool = True
    """Its user and its script say how long it trains (epochs, dataset size)."""
    state: str = "PENDING"
    held: bool = True
    shape: Shape | None = None
    nodes: tuple[int, ...] = ()
    """Node indices of the running launch, in rank order."""
    counts: tuple[int, ...] = ()
    """GPUs on each of ``nodes``."""
    restarts: int = 0
    special_exit: bool = False
    """Requeued held by the job itself after a checkpoint (Slurm's SPECIAL_EXIT state)."""
    launches: int = 0
    exit_code: int = 0
    start_time: float = 0.0
    end_time: float = 0.0
    first_start: float | None = None
    stop_at: float | None = None
    """When a signalled job exits (it checkpoints until then), or a job past its last step
    ends in Slurm (``cost.finish_s``)."""
    signalled_at: float = 0.0
    first_signal: float = 0.0
    training: bool = False
    """The launch finished starting up and reported its start."""
    train_at: float = INF
    """When the launch starts training (its start-up ends)."""
    finish_at: float = INF
    """When the job completes if nothing changes (inf: not training towards it)."""
    plan: LaunchPlan | None = None
    micro: int = 0
    """Per-GPU batch of the running launch (what the job reports)."""
    steps: float = 0.0
    """Optimizer steps taken (what the job's runtime counts)."""
    ckpt: Checkpoint = field(default_factory=Checkpoint)
    lines: list[dict[str, Any]] = field(default_factory=list)
    win_steps: float = 0.0
    win_seconds: float = 0.0
    last_line: float = -1e18
    line_due: float = INF
    """When the job writes its first line at a batch it was just given (inf: none due)."""
    version: int = 0
    """Bumped on every change Slurm would show (the observation is rebuilt then)."""
    user: str = "sim"
    refused: str = ""
    """Why a released launch is kept pending for a limit (Slurm's reason; '' for none)."""
    refused_since: float = 0.0
    seen: tuple[int, ObservedJob] | None = None

    @property
    def gpus(self) -> int:
        return sum(self.counts) if self.state == "RUNNING" else 0

    @property
    def ended(self) -> bool:
        return self.state not in ("PENDING", "RUNNING")
