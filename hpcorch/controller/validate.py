"""What a user controls, checked before the controller uses it. Pure.

Two inputs reach the controller from users: the tags of a job's Slurm comment (the job's
owner can rewrite them with ``scontrol update``) and the lines of the job's metrics file
(the owner's training script writes them). Integers are ASCII digits within a range,
floats finite within a range, names from a safe alphabet, paths absolute and plain. A
comment that fails is refused with a reason (:class:`TagError`); a metrics value that
fails is dropped (the helpers return None).
"""

from __future__ import annotations

import math
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hpcorch.gputypes import MAX_TYPES, GpuTypeError, parse_tag
from hpcorch.protocol import (
    MAX_CPUS_PER_GPU,
    MAX_DECLARED_EPOCHS,
    MAX_DECLARED_SAMPLES,
    MAX_GLOBAL_BATCH,
    MAX_GPUS,
    MAX_GRACE_S,
    MAX_PATH_LENGTH,
)

KEY_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,127}")
"""Job keys (``name-YYYYmmdd-HHMMSS-hex``) and application names."""
PATH_RE = re.compile(r"/[A-Za-z0-9_./+@%=-]*")
DIGITS_RE = re.compile(r"[0-9]+")

MAX_COUNT = 2**53
"""Largest step, epoch or sample count taken from a metrics line."""
MAX_SECONDS = 1e7
"""Longest step time, wait or grace (in seconds) taken from a metrics line."""
MAX_BUDGET_S = 10**9
"""Longest time budget across launches (about 31 years)."""
MAX_RELAUNCHES = 10**6


class TagError(ValueError):
    """A tag of a job's comment is malformed or out of range: the job is refused."""


def printable(text: str, limit: int = 64) -> str:
    """``text`` as printable ASCII, at most ``limit`` characters: safe in logs and tables."""
    out = "".join(c if " " <= c <= "~" else "?" for c in text[:limit])
    return out + ("..." if len(text) > limit else "")


# --- the comment -----------------------------------------------------------------------


def tag_int(tags: Mapping[str, str], key: str, lo: int, hi: int) -> int | None:
    """Tag ``key`` as an integer in [lo, hi]; None when absent; TagError when malformed."""
    raw = tags.get(key)
    if raw is None:
        return None
    if not DIGITS_RE.fullmatch(raw):
        raise TagError(f"{key}={printable(raw, 24)!s} is not a number of ASCII digits")
    value = int(raw) if len(raw) <= 19 else hi + 1
    if not lo <= value <= hi:
        raise TagError(f"{key}={printable(raw, 24)} is outside {lo}..{hi}")
    return value


def tag_name(tags: Mapping[str, str], key: str) -> str | None:
    raw = tags.get(key)
    if raw is None:
        return None
    if not KEY_RE.fullmatch(raw):
        raise TagError(
            f"{key}={printable(raw, 24)} is not 1-128 letters, digits and _ . + - "
            "(starting with a letter or digit)"
        )
    return raw


def tag_choice(tags: Mapping[str, str], key: str, choices: tuple[str, ...]) -> str | None:
    raw = tags.get(key)
    if raw is None:
        return None
    if raw not in choices:
        raise TagError(f"{key}={printable(raw, 24)} is not one of {', '.join(choices)}")
    return raw


def tag_path(tags: Mapping[str, str], key: str) -> str:
    """An absolute, normalised path of safe characters ('' when absent)."""
    raw = tags.get(key)
    if raw is None or raw == "":
        return ""
    if len(raw) > MAX_PATH_LENGTH or not PATH_RE.fullmatch(raw):
        raise TagError(
            f"{key}={printable(raw, 48)} is not an absolute path of letters, digits and "
            f"_ . / + @ % = - (at most {MAX_PATH_LENGTH} characters)"
        )
    if posixpath.normpath(raw) != raw or raw.startswith("//"):
        raise TagError(f"{key}={printable(raw, 48)} is not a plain path (., .. or //)")
    return raw


def tag_types(tags: Mapping[str, str], key: str) -> tuple[str, ...]:
    """GPU type names joined by ``+`` (:mod:`hpcorch.gputypes`); () when absent."""
    raw = tags.get(key)
    if raw is not None and len(raw) > MAX_TYPES * 33:
        raise TagError(f"{key}={printable(raw, 24)} is too long")
    try:
        return parse_tag(raw)
    except GpuTypeError as exc:
        raise TagError(printable(str(exc), 200)) from None


@dataclass(frozen=True)
class JobTags:
    """A job's comment, checked. Bounds left out of the comment are None."""

    key: str | None
    min_gpus: int | None
    max_gpus: int | None
    batch: int | None
    max_batch: int | None
    micro: int | None
    app: str | None
    job_dir: str
    sidecar: bool
    resumable: bool
    predictable: bool
    grace_s: int
    min_cpus: int | None
    budget_s: int
    """Run time across all launches (0: no budget)."""
    max_relaunches: int | None
    """Relaunches after the job checkpointed on its own (None: not given)."""
    epochs: int | None = None
    """The length its user declared: epochs (None: not given)."""
    dataset: int | None = None
    """Samples per epoch its user declared (None: not given)."""
    gpu_types: tuple[str, ...] = ()
    """The GPU types the job accepts (``types=a100+h100``; empty: any)."""


def parse_tags(tags: Mapping[str, str]) -> JobTags:
    """The checked tags of a job's comment; :class:`TagError` names the first bad one."""
    lo = tag_int(tags, "min", 1, MAX_GPUS)
    hi = tag_int(tags, "max", 1, MAX_GPUS)
    if lo is not None and hi is not None and hi < lo:
        raise TagError(f"max={hi} is below min={lo}")
    batch = tag_int(tags, "batch", 1, MAX_GLOBAL_BATCH)
    max_batch = tag_int(tags, "maxbatch", 1, MAX_GLOBAL_BATCH)
    if batch is not None and max_batch is not None and max_batch < batch:
        raise TagError(f"maxbatch={max_batch} is below batch={batch}")
    return JobTags(
        key=tag_name(tags, "id"),
        min_gpus=lo,
        max_gpus=hi,
        batch=batch,
        max_batch=max_batch,
        micro=tag_int(tags, "micro", 1, MAX_GLOBAL_BATCH),
        app=tag_name(tags, "app"),
        job_dir=tag_path(tags, "dir"),
        sidecar=tag_choice(tags, "mode", ("managed", "sidecar")) == "sidecar",
        resumable=tag_choice(tags, "resume", ("yes", "no")) != "no",
        predictable=tag_choice(tags, "progress", ("yes", "no")) != "no",
        grace_s=tag_int(tags, "grace", 0, MAX_GRACE_S) or 0,
        min_cpus=tag_int(tags, "mincpus", 1, MAX_CPUS_PER_GPU),
        budget_s=tag_int(tags, "budget", 0, MAX_BUDGET_S) or 0,
        max_relaunches=tag_int(tags, "relaunches", 0, MAX_RELAUNCHES),
        epochs=tag_int(tags, "epochs", 1, MAX_DECLARED_EPOCHS),
        dataset=tag_int(tags, "dataset", 1, MAX_DECLARED_SAMPLES),
        gpu_types=tag_types(tags, "types"),
    )


def pin_of(tags: Mapping[str, str], lo: int = 1, hi: int = MAX_GPUS) -> int | None:
    """The GPU count a job is pinned to (``hpcorch resize``), or None; TagError when it is
    outside the job's bounds ``lo..hi`` (a comment edited past ``hpcorch resize``)."""
    return tag_int(tags, "pin", max(1, lo), min(hi, MAX_GPUS))


def request_of(tags: Mapping[str, str]) -> tuple[int, int] | None:
    """The GPUs and batch a user asked for (policies that honour requests), or None."""
    if "req" not in tags and "reqbatch" not in tags:
        return None
    return (
        tag_int(tags, "req", 0, MAX_GPUS) or 0,
        tag_int(tags, "reqbatch", 0, MAX_GLOBAL_BATCH) or 0,
    )


# --- metrics lines ---------------------------------------------------------------------


def as_int(value: Any, lo: int, hi: int) -> int | None:
    """An integer (not a bool, not a float) in [lo, hi], else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value if lo <= value <= hi else None


def as_float(value: Any, lo: float, hi: float) -> float | None:
    """A finite number in [lo, hi] as a float, else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        f = float(value)
    except OverflowError:
        return None
    return f if math.isfinite(f) and lo <= f <= hi else None


@dataclass(frozen=True)
class StepsLine:
    """A checked ``steps`` line of a job's metrics."""

    time: float
    step_time: float
    step: int
    epoch: int | None
    gpus: int | None
    global_batch: int | None
    micro_batch: int
    accum_steps: int
    samples_per_s: float
    cpus_per_gpu: int | None
    total_steps: int | None
    loss: float | None
    noise_scale: float | None
    data_wait: float | None


def steps_line(line: Mapping[str, Any]) -> StepsLine | None:
    """A ``steps`` line with every value checked, or None when a required one is bad."""
    step_time = as_float(line.get("step_time"), 0.0, MAX_SECONDS)
    if step_time is None:
        return None
    return StepsLine(
        time=as_float(line.get("time", 0.0), 0.0, 1e11) or 0.0,
        step_time=step_time,
        step=as_int(line.get("step", 0), 0, MAX_COUNT) or 0,
        epoch=as_int(line.get("epoch"), 0, MAX_COUNT),
        gpus=as_int(line.get("gpus"), 1, MAX_GPUS),
        global_batch=as_int(line.get("global_batch"), 1, MAX_GLOBAL_BATCH),
        micro_batch=as_int(line.get("per_gpu_batch"), 0, MAX_GLOBAL_BATCH) or 0,
        accum_steps=as_int(line.get("accum_steps"), 1, MAX_GLOBAL_BATCH) or 1,
        samples_per_s=as_float(line.get("samples_per_s"), 0.0, 1e12) or 0.0,
        cpus_per_gpu=as_int(line.get("cpus_per_gpu"), 1, MAX_CPUS_PER_GPU),
        total_steps=as_int(line.get("total_steps"), 1, MAX_COUNT),
        loss=as_float(line.get("loss"), -1e30, 1e30),
        noise_scale=as_float(line.get("noise_scale"), 0.0, 1e30),
        data_wait=as_float(line.get("data_wait"), 0.0, MAX_SECONDS),
    )
