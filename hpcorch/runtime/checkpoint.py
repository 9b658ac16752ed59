"""Checkpoint files: atomic writes, discovery of the newest good one, validation, RNG states.

A checkpoint is written to ``ckpt-<step>.pt.tmp``, flushed and fsynced, then renamed to
``ckpt-<step>.pt`` and the directory fsynced: a complete name always means a complete file.
Older checkpoints are deleted only after the new one is in place.
"""

from __future__ import annotations

import os
import random
import re
import time
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from hpcorch.planner import BatchPlan
from hpcorch.protocol import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_PREFIX,
    CHECKPOINT_SUFFIX,
    CHECKPOINT_VERSION,
    TMP_SUFFIX,
)

_NAME = re.compile(
    re.escape(CHECKPOINT_PREFIX)
    + r"(\d+)"
    + re.escape(CHECKPOINT_SUFFIX)
    + f"({re.escape(TMP_SUFFIX)})?$"
)


class CheckpointError(RuntimeError):
    """A checkpoint file cannot be used (truncated, wrong version, another job's)."""


class CorruptCheckpoint(CheckpointError):
    """A checkpoint file that cannot be read at all (truncated, damaged, vanished): an older
    one may take its place."""


CORRUPT_SUFFIX = ".corrupt"
"""A damaged checkpoint skipped at resume is renamed with this suffix: kept for a person
to look at, out of the way of the next resume and of pruning."""


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"{CHECKPOINT_PREFIX}{step:09d}{CHECKPOINT_SUFFIX}"


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_atomic(payload: dict[str, Any], path: Path) -> int:
    """Write ``payload`` to ``path`` atomically; returns the size in bytes."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + TMP_SUFFIX)
    with open(tmp, "wb") as f:
        torch.save(payload, f)
        f.flush()
        os.fsync(f.fileno())
        size = f.tell()
    os.replace(tmp, path)
    _fsync_dir(path.parent)
    return size


@dataclass(frozen=True)
class Found:
    """Result of looking for the checkpoint to resume from."""

    path: Path | None
    step: int | None
    torn: tuple[Path, ...]
    """Incomplete files newer than ``path`` (their writer was killed)."""


def scan(directory: Path) -> tuple[list[tuple[int, Path]], list[tuple[int, Path]]]:
    """(complete, incomplete) checkpoints in ``directory``, oldest first."""
    complete: list[tuple[int, Path]] = []
    partial: list[tuple[int, Path]] = []
    if not directory.is_dir():
        return complete, partial
    for p in directory.iterdir():
        m = _NAME.match(p.name)
        if m:
            (partial if m.group(2) else complete).append((int(m.group(1)), p))
    return sorted(complete), sorted(partial)


def find_latest(directory: Path) -> Found:
    complete, partial = scan(directory)
    if not complete:
        return Found(None, None, tuple(p for _, p in partial))
    step, path = complete[-1]
    return Found(path, step, tuple(p for s, p in partial if s >= step))


@dataclass
class Resume:
    """The checkpoint to resume from, after skipping damaged newer ones."""

    path: Path | None
    step: int
    """The checkpoint's step; -1 when there is none."""
    payload: dict[str, Any] | None
    skipped: list[tuple[Path, str]]
    """Damaged complete checkpoints newer than ``path``, with the reason each was skipped."""
    torn: tuple[Path, ...]
    """Incomplete files newer than ``path`` (their writer was killed)."""


def choose_resume(directory: Path, job_id: str | None) -> Resume:
    """The newest checkpoint that loads. A damaged (unreadable) one is skipped for the one
    before it; any other problem (another job's, another version) raises CheckpointError,
    and so does a directory whose every checkpoint is damaged: starting afresh would throw
    the job's progress away without a word."""
    complete, partial = scan(directory)
    skipped: list[tuple[Path, str]] = []
    for step, path in reversed(complete):
        try:
            payload = load(path, job_id)
        except CorruptCheckpoint as exc:
            skipped.append((path, str(exc)))
            continue
        torn = tuple(p for s, p in partial if s >= step)
        return Resume(path, step, payload, skipped, torn)
    if skipped:
        raise CheckpointError(
            f"no checkpoint of {directory} loads: {skipped[0][1]}"
            + (f" (and {len(skipped) - 1} older ones)" if len(skipped) > 1 else "")
        )
    return Resume(None, -1, None, [], tuple(p for _, p in partial))


def prune(directory: Path, keep: int, current: Path) -> None:
    """Delete all but the newest ``keep`` complete checkpoints and stale temp files."""
    complete, partial = scan(directory)
    for _, p in complete[: max(len(complete) - keep, 0)]:
        if p != current:
            p.unlink(missing_ok=True)
    for _, p in partial:
        p.unlink(missing_ok=True)


def load(path: Path, job_id: str | None) -> dict[str, Any]:
    """Read and validate a checkpoint; :class:`CheckpointError` names the problem.

    Its zip directory (at the end of the file) is read first, in Python: a file cut short
    by a failing disk is refused before torch's C++ reader sees it, which has aborted the
    process on damaged archives (a second exception while unwinding the first)."""
    try:
        with zipfile.ZipFile(path) as archive:
            archive.infolist()
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CorruptCheckpoint(f"checkpoint {path} does not exist") from None
    except Exception as e:  # torch raises many kinds for damaged files
        text = str(e).strip()
        first = text.splitlines()[0].split(". ")[0] if text else type(e).__name__
        raise CorruptCheckpoint(f"checkpoint {path} is truncated or corrupt ({first})") from e
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"{path} is not an hpcorch checkpoint")
    if payload.get("version") != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"checkpoint {path} has version {payload.get('version')!r}; "
            f"this hpcorch reads version {CHECKPOINT_VERSION}"
        )
    owner = payload.get("job")
    if job_id is not None and owner is not None and owner != job_id:
        raise CheckpointError(f"checkpoint {path} belongs to job {owner!r}, not to {job_id!r}")
    return payload


def payload(
    *,
    job: str | None,
    world_size: int,
    position: tuple[int, int, int, int],
    seed: int,
    plan: BatchPlan,
    lr: dict[str, Any],
    gns: dict[str, float],
    model: dict[str, Any],
    optimizer: dict[str, Any],
    scheduler: dict[str, Any] | None,
    user: dict[str, Any],
    rng: list[Any],
) -> dict[str, Any]:
    """What a checkpoint holds. ``position``: (global step, epoch, sample offset in the
    epoch, dataset size); ``rng``: every rank's generator states."""
    global_step, epoch, offset, dataset_size = position
    return {
        "format": CHECKPOINT_FORMAT,
        "version": CHECKPOINT_VERSION,
        "job": job,
        "written_at": time.time(),
        "world_size": world_size,
        "global_step": global_step,
        "epoch": epoch,
        "offset": offset,
        "dataset_size": dataset_size,
        "seed": seed,
        "plan": {
            "global_batch": plan.global_batch,
            "gpus": plan.gpus,
            "micro_batch": plan.micro_batch,
            "accum_steps": plan.accum_steps,
        },
        "lr": lr,
        "gns": gns,
        "model": model,
        "optimizer": optimizer,
        "scheduler": scheduler,
        "user": user,
        "rng": rng,
    }


# --- random number generators ------------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """Python, numpy, torch CPU and CUDA generator states of this process."""
    np_state = np.random.get_state(legacy=False)
    assert isinstance(np_state, dict)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {
            "key": torch.from_numpy(np.asarray(np_state["state"]["key"]).astype(np.int64)),
            "pos": int(np_state["state"]["pos"]),
            "has_gauss": int(np_state["has_gauss"]),
            "gauss": float(np_state["gauss"]),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        {
            "bit_generator": "MT19937",
            "state": {"key": n["key"].numpy().astype(np.uint32), "pos": n["pos"]},
            "has_gauss": n["has_gauss"],
            "gauss": n["gauss"],
        }
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        cuda = state["cuda"]
        torch.cuda.set_rng_state_all(cuda[: torch.cuda.device_count()])


def seed_all(seed: int) -> None:
    """Seed every generator (for ranks that did not exist when the checkpoint was taken)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _tuples(x: Any) -> Any:
    if isinstance(x, list | tuple):
        return tuple(_tuples(v) for v in x)
    return x
