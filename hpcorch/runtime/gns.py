"""Gradient noise scale from the gradients DDP already computes.

A DDP communication hook sees every gradient bucket twice: before the all-reduce (this
rank's gradient over its local batch b) and after it (the gradient over the global batch
B). Their squared norms estimate |G|^2 + tr(S)/b and |G|^2 + tr(S)/B, which gives unbiased
estimates of |G|^2 and tr(S) (McCandlish et al., 2018, appendix A). The noise scale
B_noise = tr(S)/|G|^2 is the ratio of their exponential moving averages. Costs one norm
per bucket and nothing extra on the wire (the local norms travel in the runtime's per-step
all-reduce).
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist


class NoiseScale:
    """Accumulates squared gradient norms from a DDP comm hook; keeps the estimate."""

    def __init__(self, decay: float = 0.9) -> None:
        self.decay = decay
        self._lock = threading.Lock()
        self._local: torch.Tensor | None = None
        self._global: torch.Tensor | None = None
        self.grad_sq = 0.0
        self.trace = 0.0
        self.weight = 0.0
        self.updates = 0

    # -- the hook --------------------------------------------------------------------------
    def hook(self, process_group: Any, bucket: Any) -> torch.futures.Future[torch.Tensor]:
        """DDP comm hook: plain averaging all-reduce that also records the two norms."""
        group = process_group if process_group is not None else dist.group.WORLD
        world = dist.get_world_size(group)
        buf: torch.Tensor = bucket.buffer()
        local = buf.detach().double().pow(2).sum()
        with self._lock:
            self._local = local if self._local is None else self._local + local
        buf.div_(world)
        fut = dist.all_reduce(buf, group=group, async_op=True).get_future()

        def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            out = f.value()[0]
            g = out.detach().double().pow(2).sum()
            with self._lock:
                self._global = g if self._global is None else self._global + g
            return out

        result: torch.futures.Future[torch.Tensor] = fut.then(done)
        return result

    def take(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(local, global) squared norms since the last call, then reset."""
        with self._lock:
            out = (self._local, self._global)
            self._local = self._global = None
        return out

    # -- the estimate ----------------------------------------------------------------------
    def update(self, local_sq: float, global_sq: float, b_small: int, b_big: int) -> None:
        """Fold in one step's mean local and global squared norms."""
        if b_big <= b_small or b_small < 1:
            return
        g2 = (b_big * global_sq - b_small * local_sq) / (b_big - b_small)
        tr = (local_sq - global_sq) / (1.0 / b_small - 1.0 / b_big)
        d = self.decay
        self.grad_sq = d * self.grad_sq + (1 - d) * g2
        self.trace = d * self.trace + (1 - d) * tr
        self.weight = d * self.weight + (1 - d)
        self.updates += 1

    @property
    def value(self) -> float | None:
        """Current gradient noise scale (samples), None before the first estimate."""
        if self.updates == 0 or self.grad_sq <= 0:
            return None
        return max(self.trace, 0.0) / self.grad_sq

    def state_dict(self) -> dict[str, float]:
        return {
            "grad_sq": self.grad_sq,
            "trace": self.trace,
            "weight": self.weight,
            "updates": float(self.updates),
        }

    def load_state_dict(self, state: dict[str, float]) -> None:
        self.grad_sq = float(state["grad_sq"])
        self.trace = float(state["trace"])
        self.weight = float(state["weight"])
        self.updates = int(state["updates"])
