"""One optimizer step as the training loop sees it: micro-batches and weighted backward."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel

from hpcorch.runtime.sampler import MicroBatch, StepLayout


class Step:
    """One optimizer step of this rank: iterate it for the micro-batches, ``backward`` each."""

    def __init__(
        self,
        layout: StepLayout,
        batches: Iterator[Any],
        *,
        index: int,
        lr_factor: float,
        ddp: DistributedDataParallel | None,
        device: torch.device,
    ) -> None:
        self.layout = layout
        self.index = index
        """Global step number (0-based) of this step."""
        self.lr_factor = lr_factor
        """The factor on the optimizer's LR in this step."""
        self._ddp = ddp
        self._batches = batches
        self._current: MicroBatch | None = None
        self._done = 0
        self.data_wait = 0.0
        """Seconds this step waited for its input from the data loader."""
        self._loss = torch.zeros((), dtype=torch.float64, device=device)

    @property
    def epoch(self) -> int:
        return self.layout.epoch

    @property
    def indices(self) -> list[int]:
        """Dataset indices this rank processes in this step (placeholders excluded)."""
        return [i for mb in self.layout.micro if mb.real for i in mb.indices]

    def __len__(self) -> int:
        return len(self.layout.micro)

    def __iter__(self) -> Iterator[Any]:
        ddp = self._ddp
        last = len(self.layout.micro) - 1
        for j, mb in enumerate(self.layout.micro):
            if ddp is not None:  # all-reduce only on the last pass (gradient accumulation)
                ddp.require_backward_grad_sync = j == last
            self._current = mb
            t0 = time.perf_counter()
            batch = next(self._batches)
            self.data_wait += time.perf_counter() - t0
            yield batch
            if self._current is not None:
                raise RuntimeError("call step.backward(loss) once per micro-batch")
        if ddp is not None:
            ddp.require_backward_grad_sync = True

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of the micro-batch's mean loss, weighted for accumulation and the world."""
        mb = self._current
        if mb is None:
            raise RuntimeError("step.backward(loss) called outside the micro-batch loop")
        self._current = None
        self._done += 1
        torch.autograd.backward(loss * mb.weight)
        if mb.real:
            self._loss += loss.detach().double() * mb.real
