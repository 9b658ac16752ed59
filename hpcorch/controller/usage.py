"""GPU time by user, from the controller's job records. Pure: records in, rows out.

Inside the pool Slurm's fairshare no longer orders the jobs, so the controller's own
accounting is what an admin reads to see who used the pool: ``hpcorch status`` prints
``render_usage`` and ``hpcorch metrics`` exports the same figures.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hpcorch.controller.store import JobRecord
from hpcorch.status import render_table

HOLDING = ("running", "stopping")


@dataclass(frozen=True)
class UserUsage:
    user: str
    active_jobs: int
    """Jobs queued, starting, running or stopping."""
    gpus: int
    """GPUs the user's jobs hold now."""
    gpu_seconds: float
    """GPU time of all the user's jobs the controller has seen."""
    share: float
    """The user's part of all GPU time (0..1)."""


def user_usage(jobs: Sequence[JobRecord]) -> list[UserUsage]:
    """One row per user, most GPU time first."""
    by_user: dict[str, list[JobRecord]] = {}
    for j in jobs:
        by_user.setdefault(j.user or "?", []).append(j)
    total = sum(j.gpu_seconds for j in jobs)
    rows = [
        UserUsage(
            user=user,
            active_jobs=sum(1 for j in js if j.active),
            gpus=sum(j.gpus for j in js if j.phase in HOLDING),
            gpu_seconds=sum(j.gpu_seconds for j in js),
            share=sum(j.gpu_seconds for j in js) / total if total > 0 else 0.0,
        )
        for user, js in by_user.items()
    ]
    return sorted(rows, key=lambda r: (-r.gpu_seconds, r.user))


def render_usage(rows: Sequence[UserUsage]) -> str:
    """The per-user section of ``hpcorch status``."""
    if not rows:
        return "USAGE  no GPU time recorded yet"
    return "USAGE by user (GPU time in the pool since the controller's state was created)\n" + (
        render_table(
            ["USER", "ACTIVE", "GPUS", "GPU-HOURS", "SHARE"],
            [
                [
                    r.user,
                    str(r.active_jobs),
                    str(r.gpus),
                    f"{r.gpu_seconds / 3600:.2f}",
                    f"{100 * r.share:.0f}%",
                ]
                for r in rows
            ],
        )
    )
