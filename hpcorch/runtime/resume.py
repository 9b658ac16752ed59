"""Resuming a launch: the newest checkpoint that loads, agreed by every rank.

Rank 0 looks at the job's checkpoints, skips damaged newer ones (renaming each aside with
the suffix ``.corrupt`` and saying so) and tells the other ranks which step to load; each
rank loads that file. A checkpoint that belongs to another job or another format version
still stops the job (exit code 78): that is no damage an older file can make up for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from hpcorch.runtime import checkpoint as ckpt

if TYPE_CHECKING:
    from hpcorch.runtime.job import ElasticJob


def restore(job: ElasticJob) -> None:
    """Set ``job``'s position, LR state and ``_resume`` payload from its checkpoint."""
    t0 = time.perf_counter()
    found: ckpt.Resume | None = None
    chosen, error = -1, ""
    if job.is_main:
        try:
            found = ckpt.choose_resume(job.checkpoint_dir, job.settings.job_id)
            job._resume = found.payload
            if found.path is not None:
                chosen = found.step
        except ckpt.CheckpointError as e:
            chosen, error = -2, str(e)
    pick = torch.tensor([chosen], dtype=torch.int64, device=job.device)
    dist.broadcast(pick, src=0)
    chosen = int(pick.item())
    if chosen == -2:
        job.fail(error)
    if chosen == -1:
        if found is not None and found.torn:
            job.log(f"ignoring incomplete checkpoint {found.torn[-1].name}; starting afresh")
        return
    path = ckpt.checkpoint_path(job.checkpoint_dir, chosen)
    if not job.is_main:
        try:
            job._resume = ckpt.load(path, job.settings.job_id)
        except ckpt.CheckpointError as e:
            job.fail(str(e))
    job.timings["checkpoint_load_seconds"] = round(time.perf_counter() - t0, 3)
    for bad, why in found.skipped if found is not None else ():
        aside = bad.with_name(bad.name + ckpt.CORRUPT_SUFFIX)
        kept = job.gate.write(bad, _renamer(bad, aside))
        job.log(f"{why}: skipped" + (f", kept as {aside.name}" if kept else ""))
    r = job._resume
    assert r is not None
    try:
        job.global_step, job.epoch, job.offset = r["global_step"], r["epoch"], r["offset"]
        job.seed, job.base_batch = r["seed"], r["lr"]["base_batch"]
        job.state = dict(r["user"])
        job.noise.load_state_dict(r["gns"])
        job.progress = r["lr"]["progress"]
        if r["plan"]["global_batch"] == job.global_batch:
            job._prev_factor = r["lr"]["prev_factor"]
            job._since_change = r["lr"]["since_change"]
        else:  # a new batch size: warm up from the factor in effect when we stopped
            job._prev_factor = r["lr"]["factor"]
            job._since_change = 0
        missing = [k for k in ("model", "optimizer", "rng", "dataset_size") if k not in r]
        if missing:
            raise KeyError(missing[0])
    except (KeyError, TypeError) as e:
        job.fail(f"checkpoint {path} lacks the field {e}")
    if found is not None and found.torn:
        job.log(
            f"checkpoint {found.torn[-1].name} is incomplete (its writer was killed); "
            f"resuming from the previous good one, {path.name}"
        )
    elif found is not None and found.skipped:
        job.log(f"resuming from the newest checkpoint that loads, {path}")
    else:
        job.log(f"resuming from {path}")


def _renamer(src: Path, dst: Path) -> Callable[[], None]:
    return lambda: os.replace(src, dst)
