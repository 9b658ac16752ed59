"""The training loop shared by the example scripts that know nothing of hpcorch.

A small classifier learns a synthetic task (train_ddp.make_data) with plain PyTorch DDP from
the torchrun variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT). The batch of
every step is drawn from the step number alone, so a run resumed at another world size sees
the same samples. Only the checkpoint and signal conventions differ between the scripts.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from train_ddp import make_data


@dataclass
class Toy:
    rank: int
    world: int
    model: nn.Module
    opt: torch.optim.Optimizer
    data_x: torch.Tensor
    data_y: torch.Tensor
    per_gpu_batch: int
    seed: int

    def state(self, step: int) -> dict[str, Any]:
        module = self.model.module if hasattr(self.model, "module") else self.model
        return {"model": module.state_dict(), "opt": self.opt.state_dict(), "step": step}

    def load(self, state: dict[str, Any]) -> int:
        module = self.model.module if hasattr(self.model, "module") else self.model
        module.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        return int(state["step"])

    def any_rank(self, flag: bool) -> bool:
        """True on every rank when ``flag`` is true on one (all ranks stop at one step)."""
        t = torch.tensor([1.0 if flag else 0.0])
        if self.world > 1:
            dist.all_reduce(t)  # the sum: positive when any rank's flag is set
        return bool(t.item() > 0)

    def barrier(self) -> None:
        if self.world > 1:
            dist.barrier()

    def steps(self, first: int, last: int, delay: float) -> Iterator[tuple[int, float]]:
        """Train steps first+1 .. last; yields (step done, loss)."""
        for step in range(first, last):
            g = torch.Generator().manual_seed(self.seed * 100003 + step)
            idx = torch.randint(len(self.data_x), (self.per_gpu_batch * self.world,), generator=g)
            mine = idx[self.rank :: self.world]
            loss = nn.functional.cross_entropy(self.model(self.data_x[mine]), self.data_y[mine])
            self.opt.zero_grad()
            loss.backward()
            self.opt.step()
            if delay:
                time.sleep(delay)
            yield step + 1, float(loss.item())


def setup(per_gpu_batch: int, lr: float, samples: int, seed: int) -> Toy:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    if world > 1:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    torch.manual_seed(seed)
    data = make_data(samples, 20, 4, seed)
    model: nn.Module = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Linear(64, 4))
    if world > 1:
        model = DistributedDataParallel(model)
    per_gpu = int(os.environ.get("HPCORCH_PER_GPU_BATCH") or per_gpu_batch)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    x, y = data.tensors
    return Toy(rank, world, model, opt, x, y, per_gpu, seed)


def save_atomic(state: dict[str, Any], path: str) -> None:
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    torch.save(state, tmp)
    os.replace(tmp, path)


def finish(toy: Toy, log: Callable[[str], None]) -> None:
    toy.barrier()
    if toy.world > 1:
        dist.destroy_process_group()
    log("done")
