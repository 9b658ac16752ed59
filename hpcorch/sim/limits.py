"""Slurm's limits in the simulated Slurm: a QOS's ``MaxTRESPerUser`` (GPUs),
``MaxJobsPerUser`` and ``MaxTRESPerJob`` (GPUs), with each workload job given a user
(``users``, in turn) and what each user holds outside the pool (``outside``).

As slurmctld does, the simulated Slurm keeps a released launch that would pass one of them
pending with Slurm's reason (``QOSMaxGRESPerUser``, ``QOSMaxJobsPerUserLimit``,
``QOSMaxGRESPerJob``) until it fits. ``visible``: the cluster reports the limits and usage
(as ``scontrol show assoc_mgr`` does) so the controller plans within them; else it learns
them only from the launches Slurm keeps pending (a limit it cannot read). :class:`SimLimits`
is pure; :class:`LimitGate` applies it to the simulated Slurm's jobs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hpcorch.limits import Amounts, Cap, LimitBook

if TYPE_CHECKING:
    from hpcorch.sim.slurm_jobs import SlurmJob

QOS = "normal"


@dataclass(frozen=True)
class SimLimits:
    users: int = 1
    """Workload jobs are given the users ``u0``, ``u1``, ... in turn."""
    user_gpus: int | None = None
    """GPUs each user's running jobs may hold together (with ``outside``)."""
    user_jobs: int | None = None
    """Jobs each user may run at once (with ``outside_jobs``)."""
    job_gpus: int | None = None
    """GPUs one job may hold."""
    outside: Mapping[str, int] = field(default_factory=dict)
    """GPUs each user's jobs outside the pool hold (counted against ``user_gpus``)."""
    outside_jobs: Mapping[str, int] = field(default_factory=dict)
    visible: bool = True

    def user(self, index: int) -> str:
        """The user of the workload's ``index``-th job."""
        return f"u{index % max(1, self.users)}"

    def refuse(self, user: str, gpus: int, running: Iterable[tuple[str, int]]) -> str:
        """Slurm's reason to keep a launch of ``gpus`` GPUs of ``user`` pending, with the
        pool's ``running`` jobs' (user, GPUs); '' when it may run."""
        if self.job_gpus is not None and gpus > self.job_gpus:
            return "QOSMaxGRESPerJob"
        mine = [g for u, g in running if u == user]
        jobs = len(mine) + self.outside_jobs.get(user, 0) + 1
        if self.user_jobs is not None and jobs > self.user_jobs:
            return "QOSMaxJobsPerUserLimit"
        held = sum(mine) + self.outside.get(user, 0) + gpus
        if self.user_gpus is not None and held > self.user_gpus:
            return "QOSMaxGRESPerUser"
        return ""

    def book(self, jobs: Iterable[tuple[int, str]], now: float) -> LimitBook:
        """What ``scontrol show assoc_mgr`` would tell of the pool's ``jobs`` (id, user):
        empty unless ``visible``."""
        if not self.visible:
            return LimitBook()
        caps: dict[str, Cap] = {}
        keys: dict[int, tuple[str, ...]] = {}
        per_job = None
        if self.job_gpus is not None:
            per_job = Cap(f"qos/{QOS}/job", f"QOS {QOS} MaxTRESPerJob", per_job=True,
                          limit=Amounts(gpus=self.job_gpus))  # fmt: skip
            caps[per_job.key] = per_job
        for sid, user in jobs:
            mine = [per_job.key] if per_job else []
            if self.user_gpus is not None or self.user_jobs is not None:
                key = f"qos/{QOS}/user/{user}"
                if key not in caps:
                    caps[key] = Cap(
                        key,
                        f"QOS {QOS} MaxTRESPerUser/MaxJobsPerUser ({user})",
                        limit=Amounts(gpus=self.user_gpus, jobs=self.user_jobs),
                        outside=Amounts(
                            gpus=self.outside.get(user, 0), jobs=self.outside_jobs.get(user, 0)
                        ),
                    )
                mine.append(key)
            keys[sid] = tuple(mine)
        return LimitBook(caps, keys, now)


@dataclass
class LimitGate:
    """``limits`` applied to the simulated Slurm's released launches, before their
    resources are looked at (as slurmctld does), and how long each launch they kept pending
    was so (``waits``, seconds)."""

    limits: SimLimits | None
    waits: list[float] = field(default_factory=list)

    def check(self, job: SlurmJob, running: Iterable[tuple[str, int]], now: float) -> bool:
        """Set ``job.refused`` to the reason a limit keeps it pending now ('' none), with
        the pool's ``running`` jobs' (user, GPUs); True when the reason changed (squeue
        would show it)."""
        if self.limits is None or job.shape is None:
            return False
        why = self.limits.refuse(job.user, job.shape.gpus, running)
        if why == job.refused:
            return False
        if not job.refused:
            job.refused_since = now
        elif not why:
            self.waits.append(now - job.refused_since)
        job.refused = why
        return True

    def clear(self, job: SlurmJob, now: float) -> None:
        """A launch kept pending for a limit no longer is (held or cancelled)."""
        if job.refused:
            self.waits.append(now - job.refused_since)
            job.refused = ""
