"""A tiny elastic DDP job that records where each rank ran (tests of exact placements).

Each rank writes ``<job dir>/ranks/<rank>.json`` with its node and the torchrun variables
the job wrapper gave it, then trains a few steps over real DDP (gloo) so that the process
group, formed at rank 0's node, proves the layout works end to end.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import hpcorch.runtime as hr  # first: it holds the checkpoint signal while torch loads

# isort: split
import torch
from torch.utils.data import TensorDataset


def main() -> None:
    job = hr.init(global_batch=12, max_micro_batch=2)
    out = Path(os.environ["HPCORCH_JOB_DIR"]) / "ranks"
    out.mkdir(exist_ok=True)
    info = {
        "rank": job.rank,
        "world": job.world_size,
        "node": os.environ.get("SLURMD_NODENAME", ""),
        "local_rank": int(os.environ.get("LOCAL_RANK", "-1")),
        "local_world": int(os.environ.get("LOCAL_WORLD_SIZE", "-1")),
        "master": os.environ.get("MASTER_ADDR", ""),
        "gpus_on_node": int(os.environ.get("SLURM_GPUS_ON_NODE", "0") or 0),
        "cpus_per_gpu": job.cpus_per_gpu,
    }
    (out / f"{job.rank}.json").write_text(json.dumps(info))
    model = job.wrap(torch.nn.Linear(2, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    job.track(model, opt)
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(24, 2, generator=g), torch.randn(24, 1, generator=g))
    for step in job.steps(data, epochs=1):
        for x, y in step:
            step.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        opt.zero_grad()


if __name__ == "__main__":
    main()
