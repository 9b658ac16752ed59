"""Jobs squeue no longer lists, from Slurm's accounting (``sacct``).

squeue forgets a job ``MinJobAge`` seconds after it ends (300 s by default); with
slurmdbd, sacct keeps it. ``hpcorch status`` and ``describe`` ask sacct for the jobs the
controller knows that squeue has dropped, so a finished job's state, nodes and exit code
stay visible. Without accounting the backend returns nothing and squeue is all there is.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from hpcorch.errors import HpcorchError
from hpcorch.protocol import JOB_COMMENT_TAG
from hpcorch.slurm.backend import SlurmBackend
from hpcorch.slurm.parse import SlurmJob

if TYPE_CHECKING:
    from hpcorch.controller.store import JobRecord

RECENT_S = 86400.0
"""Finished jobs of the controller shown by ``status`` for this long after their end."""


def with_history(
    jobs: Sequence[SlurmJob], wanted: Iterable[int], backend: SlurmBackend
) -> list[SlurmJob]:
    """``jobs`` (squeue's) and, from sacct, the ids in ``wanted`` that squeue no longer
    lists. A job whose comment sacct does not keep (no ``AccountingStoreFlags=job_comment``)
    is marked as hpcorch's with its id only. Errors reaching sacct leave ``jobs`` alone."""
    listed = {j.job_id for j in jobs}
    missing = sorted({i for i in wanted if i not in listed})
    if not missing:
        return list(jobs)
    try:
        found = backend.accounting_jobs(missing)
    except HpcorchError:
        return list(jobs)
    wanted_set = set(missing)
    extra = [
        j if j.comment.startswith(JOB_COMMENT_TAG + ":") else replace(j, comment=_tag(j))
        for j in found
        if j.job_id in wanted_set
    ]
    return [*jobs, *extra]


def _tag(job: SlurmJob) -> str:
    return f"{JOB_COMMENT_TAG}:id={job.job_id},min={job.gpus},max={job.gpus}"


def recent_ids(records: Iterable[JobRecord], now: float | None = None) -> list[int]:
    """Of the controller's job records, those worth showing: active ones and those that
    ended within ``RECENT_S``."""
    t = time.time() if now is None else now
    return [
        r.slurm_id for r in records if r.active or (r.finished_at and t - r.finished_at <= RECENT_S)
    ]
