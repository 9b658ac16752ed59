"""A policy's view of a job that never said how long it trains (``length_known`` False),
shared by the tests of its estimates and of the tail guards."""

from __future__ import annotations

from dataclasses import replace

from hpcorch.policy.types import JobView


def unknown_length_job(name: str, **kw: object) -> JobView:
    """One GPU to 16, batch 64 to 1024, its own application; ``kw`` replaces fields."""
    base = JobView(
        job_id=name,
        application=name,
        submit_time=0.0,
        requested_gpus=1,
        requested_batch=64,
        min_gpus=1,
        max_gpus=16,
        min_batch=64,
        max_batch=1024,
        min_micro_batch=1,
        max_micro_batch=16,
        max_epochs=1,
        progress_per_epoch_hint=1.0,
        length_known=False,
    )
    return replace(base, **kw)  # type: ignore[arg-type]
