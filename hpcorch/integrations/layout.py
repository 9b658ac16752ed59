"""Which samples each rank trains on in each optimizer step of a training-library job.

The order is the runtime's (:class:`hpcorch.runtime.sampler.ElasticSampler`): a seeded
permutation per epoch that does not depend on the world size, so the data position is one
number per epoch (the samples of it consumed) and a job resumed at any world size and batch
continues with exactly the samples not yet consumed. A library's training loop counts the
micro-batches of an optimizer step itself, so every rank must get the same number of
micro-batches in every step, and none of them empty:

* a full step (``global_batch`` samples) gives rank r the contiguous block
  ``[r m a, (r + 1) m a)`` of its samples as ``a`` micro-batches of ``m`` (per-GPU batch m,
  accumulation a);
* a short step (n < global batch samples: the last of an epoch, or of the job) gives every
  rank ``c = ceil(n / (W m))`` micro-batches, rank r a contiguous share of n // W or
  n // W + 1 samples split as evenly as possible. Where a rank has fewer samples than c
  (only when n < W, or with a per-GPU batch of 1 when n is no multiple of W), each empty
  micro-batch takes one sample of that step a second time: at most W - 1 samples are seen
  twice in such a step, none is skipped.

Pure numpy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from hpcorch.planner import BatchPlan
from hpcorch.runtime.sampler import ElasticSampler

Position = tuple[int, int]
"""(epoch, samples of that epoch consumed)."""


@dataclass(frozen=True)
class StepSpan:
    """One optimizer step as one rank trains it."""

    index: int
    """The global step this is (0-based: the steps before it)."""
    start: Position
    end: Position
    """The data position after the step."""
    size: int
    """Samples the step consumes over all ranks."""
    micro: tuple[tuple[int, ...], ...]
    """This rank's micro-batches: dataset indices."""
    local: int
    """Samples of this rank that are its own (repeats not counted)."""
    repeats: int
    """Samples the step trains twice over all ranks to give every rank a micro-batch."""
    plan: BatchPlan


def split(
    chunk: np.ndarray, plan: BatchPlan, rank: int
) -> tuple[tuple[tuple[int, ...], ...], int, int]:
    """This rank's micro-batches of one step over the samples ``chunk`` (see the module's
    rules), the number of its own samples, and the repeats over all ranks."""
    n, world, m, a = len(chunk), plan.gpus, plan.micro_batch, plan.accum_steps
    if n == plan.global_batch:
        lo = rank * m * a
        return (
            tuple(tuple(int(i) for i in chunk[lo + j * m : lo + (j + 1) * m]) for j in range(a)),
            m * a,
            0,
        )
    if n < 1 or n > plan.global_batch:
        raise ValueError(f"a step of {n} samples at global batch {plan.global_batch}")
    c = -(-n // (world * m))
    base, extra = divmod(n, world)
    shares = [base + (1 if r < extra else 0) for r in range(world)]
    repeats = sum(max(0, c - s) for s in shares)
    lo = sum(shares[:rank])
    own = chunk[lo : lo + shares[rank]]
    out: list[tuple[int, ...]] = []
    q, rest = divmod(len(own), c)
    start = 0
    for j in range(c):
        size = q + (1 if j < rest else 0)
        if size:
            out.append(tuple(int(i) for i in own[start : start + size]))
            start += size
        else:  # fewer own samples than micro-batches: one sample of the step again
            out.append((int(own[0]) if len(own) else int(chunk[rank % n]),))
    return tuple(out), len(own), repeats


def spans(
    order: ElasticSampler,
    start: Position,
    plan: BatchPlan,
    rank: int,
    *,
    first_index: int,
    total: int | None = None,
    epoch_end: bool = False,
) -> Iterator[StepSpan]:
    """The steps from ``start`` on. ``total``: the samples of the whole job (epochs x
    dataset size, or fewer): the last step ends there, and a step may take samples of two
    epochs (every step but the job's last is full). ``epoch_end``: the steps of
    ``start``'s epoch alone, its last step short where the epoch ends (a library that counts
    epochs itself)."""
    n_data = order.dataset_size
    epoch, offset = start
    index = first_index
    g = plan.global_batch
    perms: dict[int, np.ndarray] = {}

    def perm(e: int) -> np.ndarray:  # the epochs a step reads: one or two
        if e not in perms:
            for old in [k for k in perms if k < e]:
                del perms[old]
            perms[e] = order.permutation(e)
        return perms[e]

    while True:
        done = epoch * n_data + offset
        left = (epoch + 1) * n_data - done if epoch_end else (total or 0) - done
        if left <= 0:
            return
        size = min(g, left)
        pieces, e, o, need = [], epoch, offset, size
        while need:
            take = min(need, n_data - o)
            pieces.append(perm(e)[o : o + take])
            need -= take
            e, o = (e + 1, 0) if o + take == n_data else (e, o + take)
        chunk = np.concatenate(pieces)
        micro, local, repeats = split(chunk, plan, rank)
        yield StepSpan(index, (epoch, offset), (e, o), size, micro, local, repeats, plan)
        epoch, offset, index = e, o, index + 1
        if epoch_end and o == 0:
            return


def count_steps(n_data: int, start: Position, global_batch: int, total: int) -> int:
    """How many steps :func:`spans` lays out from ``start`` to ``total`` samples."""
    left = total - (start[0] * n_data + start[1])
    return max(0, -(-left // global_batch))
