"""The limits a scheduler enforces on the pool's jobs, as the cluster seam reports them.

A :class:`Cap` is one limit as it applies to a set of jobs: either to each job alone
(``per_job``: Slurm's ``MaxTRESPerJob``, ``MaxNodes``, ``MaxWall``, a partition's
``MaxTime``, ...) or to the running jobs of a group together (a user's under a QOS's
``MaxTRESPerUser``, an account's under ``GrpTRES``, ...), with what the scheduler counts
against it now from the group's jobs outside the pool (``outside``). A
:class:`LimitBook` holds the caps and which apply to each of the pool's jobs. The Slurm
side reads them from ``scontrol show assoc_mgr`` and the partitions
(:mod:`hpcorch.slurm.limits`); the simulated side models them. Pure values: no IO.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DIMENSIONS = ("gpus", "nodes", "cpus", "mem_mb", "jobs")
"""What a group's cap counts: GPUs, nodes, CPUs, memory (MB) and running jobs."""


@dataclass(frozen=True)
class Amounts:
    """An amount of each of :data:`DIMENSIONS` (None: no limit, as a cap's value)."""

    gpus: int | None = None
    nodes: int | None = None
    cpus: int | None = None
    mem_mb: int | None = None
    jobs: int | None = None

    def get(self, dim: str) -> int | None:
        value: int | None = getattr(self, dim)
        return value

    def any(self) -> bool:
        return any(self.get(d) is not None for d in DIMENSIONS)

    def tighter(self, other: Amounts) -> Amounts:
        """The smaller of the two in each dimension (None counts as no limit)."""
        return Amounts(**{d: _least(self.get(d), other.get(d)) for d in DIMENSIONS})

    def text(self) -> str:
        """``gpus=2,jobs=1``: the dimensions that are set."""
        return ",".join(f"{d}={self.get(d)}" for d in DIMENSIONS if self.get(d) is not None)


@dataclass(frozen=True)
class Cap:
    """One limit as it applies to the jobs it names.

    ``per_job``: ``limit`` bounds each job alone, and ``per_node`` each of its nodes
    (GPUs, CPUs, memory), ``wall_min`` its time limit in minutes. Else ``limit`` bounds
    the running jobs of the group together, of which ``outside`` are the group's jobs the
    pool does not hold (the scheduler's count less the pool's jobs when it was read).
    ``what``: the limit as an admin names it (``QOS normal MaxTRESPerUser``) for reasons
    and errors; ``key``: unique per limit and group."""

    key: str
    what: str
    per_job: bool = False
    limit: Amounts = field(default_factory=Amounts)
    per_node: Amounts = field(default_factory=Amounts)
    wall_min: int | None = None
    outside: Amounts = field(default_factory=Amounts)
    submit: int | None = None
    """Submitted jobs the group may have (``MaxSubmitJobs``): checked at submission."""
    submitted: int = 0
    """Jobs of the group submitted now (pending or running), as the scheduler counts."""

    def describe(self) -> str:
        """``QOS normal MaxTRESPerUser (gpus=2)``."""
        shown = self.limit.text()
        if self.per_node.any():
            shown = ",".join(p for p in (shown, f"per node {self.per_node.text()}") if p)
        if self.wall_min is not None:
            shown = ",".join(p for p in (shown, f"time={self.wall_min} min") if p)
        return f"{self.what} ({shown})" if shown else self.what


@dataclass(frozen=True)
class LimitBook:
    """The caps that apply to the pool's jobs, read at ``read_at``."""

    caps: Mapping[str, Cap] = field(default_factory=dict)
    jobs: Mapping[int, tuple[str, ...]] = field(default_factory=dict)
    """Slurm job id -> the keys of the caps that apply to it."""
    read_at: float = 0.0
    time_limits: Mapping[int, int] = field(default_factory=dict)
    """Slurm job id -> the time limit (minutes) its launches must keep to, for a job whose
    own is longer than a ``MaxWall`` or a partition's ``MaxTime`` allows."""

    def of(self, slurm_id: int) -> tuple[Cap, ...]:
        return tuple(self.caps[k] for k in self.jobs.get(slurm_id, ()) if k in self.caps)

    def wall_min(self, slurm_id: int) -> int | None:
        """The tightest time limit (minutes) of the job's caps; None: no limit."""
        walls = [c.wall_min for c in self.of(slurm_id) if c.wall_min is not None]
        return min(walls) if walls else None


def _least(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


# --- pending reasons ------------------------------------------------------------------
NOT_LIMITS = frozenset(
    {
        "", "None", "Resources", "Priority", "Dependency", "BeginTime", "JobHeldUser",
        "JobHeldAdmin", "Reservation", "ReqNodeNotAvail", "NodeDown", "BadConstraints",
        "Licenses", "Prolog", "Cleaning", "PartitionDown", "PartitionInactive", "PowerUp",
        "PowerDown", "FrontEndDown", "InvalidAccount", "InvalidQOS", "DependencyNeverSatisfied",
        "launch failed requeued held", "JobLaunchFailure", "SystemFailure", "Scheduling",
        "WaitingForScheduling", "BurstBufferResources", "BurstBufferStageIn", "ResvDeleted",
        "SpecialExit", "NonZeroExitCode", "BootFail", "NodeFail", "OutOfMemory",
        "JobArrayTaskLimit", "InactiveLimit", "TimeLimit", "DeadLine", "FedJobLock",
    }
)  # fmt: skip
"""Pending reasons that say nothing of a limit on the job's size: it waits for GPUs, a
node, a hold, a dependency, ... (Slurm's squeue(1), JOB REASON CODES)."""


@dataclass(frozen=True)
class Refusal:
    """What a pending reason that names a limit says was refused.

    ``scope``: whose limit: "job" (each job alone: ``*PerJob``, ``*PerNode``, a
    partition's), "user" (``*PerUser``, an association's ``MaxJobs``), "account"
    (``*PerAccount``, an association's ``Grp*``), "qos" (a QOS's ``Grp*``), or "unknown"
    (a reason hpcorch does not know: taken as a limit on the job below what it asked).
    ``dim``: what it counts: gpus, nodes, cpus, mem_mb, jobs, or "time" (its time limit);
    ``per_node``: a limit on each node of the job."""

    reason: str
    scope: str
    dim: str
    per_node: bool = False


def refusal(reason: str) -> Refusal | None:
    """What ``reason`` (a pending job's, as Slurm gives it) refuses; None where it names
    no limit on the job's size (:data:`NOT_LIMITS`, a node not available)."""
    r = reason.strip()
    if r in NOT_LIMITS or r.startswith(("ReqNodeNotAvail", "Nodes required", "Resv")):
        return None
    qos = r.startswith("QOS")
    assoc = r.startswith("Assoc")
    if not (qos or assoc or r.startswith(("Partition", "MaxMemPer", "MaxCpuPer", "MaxGRES"))):
        if "Limit" in r or "Max" in r:
            return Refusal(r, "job", _dimension(r), "PerNode" in r)
        return Refusal(r, "unknown", "gpus")
    dim = _dimension(r)
    per_node = "PerNode" in r or r.startswith(("MaxMemPer", "MaxCpuPer"))
    if r.startswith("Partition"):
        return Refusal(r, "job", "time" if "Time" in r else "nodes" if "Node" in r else "gpus")
    if "PerJob" in r or per_node or r.startswith(("MaxMemPer", "MaxGRES")):
        return Refusal(r, "job", dim, per_node)
    if "PerUser" in r or (assoc and r.startswith(("AssocMaxJobs", "AssocMaxSubmit"))):
        return Refusal(r, "user", dim)
    if "PerAccount" in r or assoc:
        return Refusal(r, "account", dim)
    if "Wall" in r or "TimeLimit" in r:
        return Refusal(r, "job", "time")
    return Refusal(r, "qos", dim)


def _dimension(reason: str) -> str:
    r = reason
    if "Wall" in r or r.endswith("TimeLimit"):
        return "time"
    if "Minutes" in r:  # a TRES-minutes budget: fewer GPUs spend less of it
        return "gpus"
    words = (
        ("Cpu", "cpus"),
        ("CPU", "cpus"),
        ("Mem", "mem_mb"),
        ("GRES", "gpus"),
        ("Node", "nodes"),
    )
    for word, dim in words:
        if word in r:
            return dim
    if "Job" in r:  # running (or submitted) jobs
        return "jobs"
    return "gpus"
