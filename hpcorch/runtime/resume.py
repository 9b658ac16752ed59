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
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hpcorch.runtime import checkpoint as ckpt
from hpcorch.runtime.launch import Launch


@dataclass(frozen=True)
class Resumed:
    """The checkpoint every rank resumes from."""

    payload: dict[str, Any]
    path: Path
    note: str
    """What to say once the payload was taken: which checkpoint, and what was skipped."""
    seconds: float
    """How long choosing and loading it took."""


def find_resume(launch: Launch, directory: Path) -> Resumed | None:
    """Collective: the checkpoint in ``directory`` every rank resumes from, None when there
    is none (a fresh start). A checkpoint that cannot be used ends the launch (exit code 78)
    with one line."""
    t0 = time.perf_counter()
    found: ckpt.Resume | None = None
    payload: dict[str, Any] | None = None
    chosen, error = -1, ""
    if launch.is_main:
        try:
            found = ckpt.choose_resume(directory, launch.settings.job_id)
            payload = found.payload
            if found.path is not None:
                chosen = found.step
        except ckpt.CheckpointError as e:
            chosen, error = -2, str(e)
    pick = torch.tensor([chosen], dtype=torch.int64, device=launch.device)
    dist.broadcast(pick, src=0)
    chosen = int(pick.item())
    if chosen == -2:
        launch.fail(error)
    if chosen == -1:
        if found is not None and found.torn:
            launch.log(f"ignoring incomplete checkpoint {found.torn[-1].name}; starting afresh")
        return None
    path = ckpt.checkpoint_path(directory, chosen)
    if not launch.is_main:
        try:
            payload = ckpt.load(path, launch.settings.job_id)
        except ckpt.CheckpointError as e:
            launch.fail(str(e))
    assert payload is not None
    seconds = round(time.perf_counter() - t0, 3)
    for bad, why in found.skipped if found is not None else ():
        aside = bad.with_name(bad.name + ckpt.CORRUPT_SUFFIX)
        kept = launch.gate.write(bad, _renamer(bad, aside))
        launch.log(f"{why}: skipped" + (f", kept as {aside.name}" if kept else ""))
    if found is not None and found.torn:
        note = (
            f"checkpoint {found.torn[-1].name} is incomplete (its writer was killed); "
            f"resuming from the previous good one, {path.name}"
        )
    elif found is not None and found.skipped:
        note = f"resuming from the newest checkpoint that loads, {path}"
    else:
        note = f"resuming from {path}"
    return Resumed(payload, path, note, seconds)


def _renamer(src: Path, dst: Path) -> Callable[[], None]:
    return lambda: os.replace(src, dst)
