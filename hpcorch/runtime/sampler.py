"""Elastic data order: which samples every rank processes in every optimizer step.

The order of an epoch is a seeded permutation that does not depend on the world size. An
optimizer step consumes the next ``global_batch`` samples of that permutation, so the data
position is a single number (the sample offset into the epoch), and training resumed at any
world size continues with exactly the samples that were not yet consumed. Pure numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hpcorch.planner import BatchPlan


@dataclass(frozen=True)
class MicroBatch:
    """One forward/backward pass of one rank."""

    indices: tuple[int, ...]
    """Dataset indices of the samples."""
    weight: float
    """Factor on the mean loss of this micro-batch so that the gradient, after DDP averages
    it over ranks, is the mean over every sample of the optimizer step."""
    real: int
    """Samples that count (0 for the placeholder a rank without data processes so that all
    ranks take part in the gradient all-reduce)."""


@dataclass(frozen=True)
class StepLayout:
    """One optimizer step as seen by one rank."""

    epoch: int
    offset: int
    """Samples of the epoch consumed before this step."""
    size: int
    """Samples this step consumes over all ranks (the global batch, less at epoch end)."""
    micro: tuple[MicroBatch, ...]
    full: bool
    """True when the step consumes a whole global batch (False for a short last step)."""

    @property
    def local_samples(self) -> int:
        return sum(mb.real for mb in self.micro)


class ElasticSampler:
    """Deterministic, world-size-independent sample order with an exact resume point."""

    def __init__(self, dataset_size: int, seed: int = 0, shuffle: bool = True) -> None:
        if dataset_size < 1:
            raise ValueError(f"dataset must hold at least one sample, got {dataset_size}")
        self.dataset_size = dataset_size
        self.seed = seed
        self.shuffle = shuffle

    def permutation(self, epoch: int) -> np.ndarray:
        """The order of ``epoch``: the same on every rank and at every world size."""
        if not self.shuffle:
            return np.arange(self.dataset_size, dtype=np.int64)
        rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
        return rng.permutation(self.dataset_size).astype(np.int64)

    def steps(self, epoch: int, offset: int, plan: BatchPlan, rank: int) -> Iterator[StepLayout]:
        """Steps of ``epoch`` from sample ``offset`` on, as seen by ``rank`` of ``plan.gpus``."""
        if not 0 <= offset <= self.dataset_size:
            raise ValueError(f"offset {offset} outside the epoch of {self.dataset_size} samples")
        if not 0 <= rank < plan.gpus:
            raise ValueError(f"rank {rank} outside world size {plan.gpus}")
        perm = self.permutation(epoch)
        g = plan.global_batch
        while offset < self.dataset_size:
            chunk = perm[offset : offset + g]
            yield StepLayout(
                epoch, offset, len(chunk), split_step(chunk, plan, rank), len(chunk) == g
            )
            offset += len(chunk)


def split_step(chunk: np.ndarray, plan: BatchPlan, rank: int) -> tuple[MicroBatch, ...]:
    """This rank's micro-batches of one step over the samples ``chunk``."""
    n, world, m = len(chunk), plan.gpus, plan.micro_batch
    if n == plan.global_batch:
        lo, hi = rank * m * plan.accum_steps, (rank + 1) * m * plan.accum_steps
        counts = [m] * plan.accum_steps
    else:  # the short last step of an epoch: spread evenly, contiguous per rank
        base, extra = divmod(n, world)
        lo = rank * base + min(rank, extra)
        hi = lo + base + (1 if rank < extra else 0)
        counts = [m] * ((hi - lo) // m) + ([(hi - lo) % m] if (hi - lo) % m else [])
    if hi == lo:
        return (MicroBatch((int(chunk[0]),), 0.0, 0),)
    out = []
    start = lo
    for c in counts:
        idx = tuple(int(i) for i in chunk[start : start + c])
        out.append(MicroBatch(idx, c * world / n, c))
        start += c
    return tuple(out)
