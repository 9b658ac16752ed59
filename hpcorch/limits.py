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
from dataclasses import dataclass, field, replace

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

    def of(self, slurm_id: int) -> tuple[Cap, ...]:
        return tuple(self.caps[k] for k in self.jobs.get(slurm_id, ()) if k in self.caps)

    def with_jobs(self, jobs: Mapping[int, tuple[str, ...]]) -> LimitBook:
        return replace(self, jobs=dict(jobs))


def _least(a: int | None, b: int | None) -> int | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)
