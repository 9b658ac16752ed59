"""Which of a job's samples the controller keeps: a bounded number, whatever the job writes.

A job's script writes the lines its samples come from, as fast as it likes. The controller
reads at most ``MAX_READ`` bytes of them a cycle (hpcorch/slurm/files.py), takes at most
``SAMPLES_PER_CYCLE`` samples of one job from a cycle's lines, holds at most
``MAX_SAMPLES_PER_JOB`` of a running job (in memory and in the store alike: reaching the
bound thins them to ``KEEP_RUNNING``) and ``KEEP_FINISHED`` of a job that ended.

Thinning (:func:`keep`) keeps what the samples are used for:

* the step-time profiles (the policy's, and the history's of a finished job): the median of
  the last ``PROFILE_WINDOW`` measurements at each configuration (nodes, GPUs, micro-batch,
  accumulation steps, CPUs per GPU), for the ``MAX_CONFIGS`` configurations reported last;
* the live noise estimate: the last ``TAIL`` samples;
* the history's noise scale per epoch: the last samples that carry one in each epoch, at
  most ``NOISE_POINTS`` in all (the last ``NOISE_POINTS`` epochs at the least);
* ``hpcorch report``: the samples on either side of a change of configuration or global
  batch, or of a step count that did not go up (a relaunch), the last ``MAX_CHANGES`` such;
  and the last sample with a loss (the final loss).

When that is more than the budget the per-configuration window is halved, down to
``MIN_WINDOW``, and then the oldest samples go: the result is never over the budget.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence

from hpcorch.controller.snapshot import PROFILE_WINDOW
from hpcorch.controller.store import Sample

MAX_SAMPLES_PER_JOB = 4000
"""Most samples of one running job held (in memory and in the store)."""
KEEP_RUNNING = 2000
"""What a running job's samples are thinned to when they reach ``MAX_SAMPLES_PER_JOB``."""
KEEP_FINISHED = 1000
"""Most samples kept of a job that ended (what its history entry and report read)."""
SAMPLES_PER_CYCLE = 200
"""Most samples taken from one job's lines in one cycle (the runtime writes one line per
metrics interval: a few a cycle)."""

MAX_CONFIGS = 64
"""Configurations whose window is kept: the ones reported last."""
MIN_WINDOW = 5
TAIL = 50
NOISE_POINTS = 300
NOISE_PER_EPOCH = 20
MAX_CHANGES = 100

Config = tuple[int, int, int, int, int]


def config_of(s: Sample) -> Config:
    return (s.nodes, s.gpus, s.micro_batch, max(1, s.accum_steps), s.cpus_per_gpu)


def _windows(samples: Sequence[Sample], window: int) -> set[int]:
    """Indices of the last ``window`` samples of each of the last ``MAX_CONFIGS``
    configurations."""
    by_config: dict[Config, list[int]] = defaultdict(list)
    for i in range(len(samples) - 1, -1, -1):
        rows = by_config[config_of(samples[i])]
        if len(rows) < window:
            rows.append(i)
    recent = sorted(by_config.values(), key=lambda rows: rows[0], reverse=True)
    return {i for rows in recent[:MAX_CONFIGS] for i in rows}


def _noise(samples: Sequence[Sample]) -> set[int]:
    """The last samples that carry a noise scale in each epoch, ``NOISE_POINTS`` at most."""
    by_epoch: dict[int, list[int]] = defaultdict(list)
    for i, s in enumerate(samples):
        if s.noise_scale is not None and s.noise_scale > 0:
            by_epoch[s.epoch].append(i)
    if not by_epoch:
        return set()
    epochs = sorted(by_epoch)[-NOISE_POINTS:]
    each = max(1, min(NOISE_PER_EPOCH, NOISE_POINTS // len(epochs)))
    return {i for e in epochs for i in by_epoch[e][-each:]}


def _changes(samples: Sequence[Sample]) -> set[int]:
    """Both sides of the last ``MAX_CHANGES`` changes (the first sample counts as one)."""
    points = [0] if samples else []
    for i in range(1, len(samples)):
        s, prev = samples[i], samples[i - 1]
        if (
            config_of(s) != config_of(prev)
            or s.global_batch != prev.global_batch
            or s.step <= prev.step
        ):
            points.append(i)
    return {j for i in points[-MAX_CHANGES:] for j in (i - 1, i) if j >= 0}


def _last_loss(samples: Sequence[Sample]) -> set[int]:
    for i in range(len(samples) - 1, -1, -1):
        loss = samples[i].loss
        if loss is not None and math.isfinite(loss):
            return {i}
    return set()


def keep(samples: Sequence[Sample], budget: int) -> list[Sample]:
    """The samples to keep of one job's ``samples`` (oldest first), at most ``budget``, in
    their order; all of them when they are no more than ``budget``."""
    if len(samples) <= budget:
        return list(samples)
    n = len(samples)
    marks = set(range(max(0, n - TAIL), n))
    marks |= _noise(samples) | _changes(samples) | _last_loss(samples)
    window = PROFILE_WINDOW
    chosen = marks | _windows(samples, window)
    while len(chosen) > budget and window > MIN_WINDOW:
        window = max(MIN_WINDOW, window // 2)
        chosen = marks | _windows(samples, window)
    return [samples[i] for i in sorted(chosen)[-budget:]]
