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
        "", "None", "Prolog", "Priority", "Dependency", "Resources", "PartitionDown",
        "PartitionInactive", "JobHeldAdmin", "JobHeldUser", "NvidiaImexChannels",
        "BeginTime", "Licenses", "Reservation", "ReqNodeNotAvail", "SchedDefer", "NodeDown",
        "BadConstraints", "SystemFailure", "JobLaunchFailure", "NonZeroExitCode",
        "RaisedSignal", "TimeLimit", "InactiveLimit", "InvalidAccount", "InvalidQOS",
        "Cleaning", "QOSNotAllowed", "AccountNotAllowed", "DependencyNeverSatisfied",
        "JobHoldMaxRequeue", "JobArrayTaskLimit", "BurstBufferResources",
        "BurstBufferStageIn", "BurstBufferOperation", "DeadLine", "FedJobLock", "OutOfMemory",
        "ReservationDeleted", "ReservationInvalid", "Constraints", "MaxPoweredUpNodes",
        "MpiPortsBusy", "InvalidReason", "QOSUsageThreshold", "QOSMinCpuNotSatisfied",
        "SpecialExit", "launch failed requeued held", "WaitingForScheduling", "BootFail",
        "NodeFail", "PowerUp", "PowerDown", "FrontEndDown", "ResvDeleted", "Scheduling",
    }
)  # fmt: skip
"""Pending reasons (Slurm's ``job_state_reason.c``, 22.05 to 25.11) that say nothing of a
limit on the job's size: it waits for GPUs, a node, a hold, a dependency, a usage
threshold, or a minimum it is below (``QOSMin*``)."""


@dataclass(frozen=True)
class Refusal:
    """What a pending reason that names a limit says was refused.

    ``scope``: whose limit: "job" (each job alone: ``*PerJob``, ``*PerNode``, a
    partition's, ``MaxMemPerLimit``), "user" (``*PerUser``, an association's ``MaxJobs``
    and ``MaxSubmitJobs``), "account" (``*PerAccount``, an association's ``Grp*``), "qos"
    (a QOS's ``Grp*``), or "unknown" (a reason hpcorch does not know: taken as a limit on
    the job below what it asked for). ``dim``: what it counts: gpus, nodes, cpus, mem_mb,
    jobs, or "time" (its time limit); ``per_node``: a limit on each node of the job."""

    reason: str
    scope: str
    dim: str
    per_node: bool = False


def refusal(reason: str) -> Refusal | None:
    """What ``reason`` (a pending job's, as Slurm gives it) refuses; None where it names
    no limit on the job's size (:data:`NOT_LIMITS`, a node not available)."""
    r = reason.strip()
    if r in NOT_LIMITS or r.startswith(("ReqNodeNotAvail", "Nodes required", "QOSMin")):
        return None
    dim = _dimension(r)
    per_node = "PerNode" in r or r == "MaxMemPerLimit"
    if "PerUser" in r or r.startswith(("AssocMaxJobs", "AssocMaxSubmit")):
        return Refusal(r, "user", dim)
    if "PerAccount" in r:
        return Refusal(r, "account", dim)
    if "PerJob" in r or per_node or r.startswith(("Partition", "MaxMemPer")):
        return Refusal(r, "job", dim, per_node)
    if r.startswith(("AssocGrp", "Association")):
        return Refusal(r, "account", dim)
    if r.startswith(("QOSGrp", "QOSJob", "QOSResource", "QOSTime")):
        return Refusal(r, "qos", dim)
    return Refusal(r, "unknown", "gpus")


def _dimension(reason: str) -> str:
    r = reason
    if "Wall" in r or r.endswith(("TimeLimit", "TimeLimit)")):
        return "time"
    if "Minutes" in r or "RunMins" in r:  # a TRES-minutes budget: fewer GPUs spend less
        return "gpus"
    words = ("Cpu", "cpus"), ("CPU", "cpus"), ("Mem", "mem_mb"), ("GRES", "gpus")
    for word, dim in (*words, ("Node", "nodes")):
        if word in r:
            return dim
    if "Jobs" in r or "SubmitJob" in r or r in ("QOSJobLimit", "AssociationJobLimit"):
        return "jobs"  # running (or submitted) jobs
    return "gpus"  # GPUs, and what more GPUs use more of (billing, energy, licenses...)
