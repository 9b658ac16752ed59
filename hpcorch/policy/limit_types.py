"""The scheduler's limits as a policy sees them (:class:`Limits`, in ``Snapshot.limits``):
bounds on each job alone and caps on groups of jobs together, already net of what each
group holds outside the pool. Pure values; :mod:`hpcorch.policy.limits` fits a plan to
them and checks one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class JobLimit:
    """What one launch of a job may hold (None: no limit)."""

    max_gpus: int | None = None
    max_nodes: int | None = None
    max_gpus_per_node: int | None = None
    max_cpus: int | None = None
    max_cpus_per_node: int | None = None
    cpus_per_gpu: int = 0
    """The CPUs each of its GPUs holds where the plan does not set them (the CPUs are not
    planned): its own request, else the site default; 0: unknown (CPU limits then apply
    only where CPUs are planned)."""

    def __bool__(self) -> bool:
        return any(
            v is not None
            for v in (
                self.max_gpus,
                self.max_nodes,
                self.max_gpus_per_node,
                self.max_cpus,
                self.max_cpus_per_node,
            )
        )


@dataclass(frozen=True)
class GroupCap:
    """What the ``members``' launches may hold together (None: no limit); ``name`` says
    which limit it is (``QOS normal MaxTRESPerUser (hpcorch-alice)``)."""

    name: str
    members: tuple[str, ...]
    gpus: int | None = None
    nodes: int | None = None
    cpus: int | None = None
    jobs: int | None = None
    """Jobs holding GPUs."""


@dataclass(frozen=True)
class Limits:
    jobs: Mapping[str, JobLimit] = field(default_factory=dict)
    """Job id -> its bounds."""
    groups: tuple[GroupCap, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.groups) or any(bool(v) for v in self.jobs.values())

    def of(self, job_id: str) -> JobLimit:
        return self.jobs.get(job_id) or NO_LIMIT


NO_LIMIT = JobLimit()
