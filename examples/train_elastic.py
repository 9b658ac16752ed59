"""Elastic DDP training on generated data: examples/train_ddp.py made elastic.

The same task and model as train_ddp.py, written against hpcorch.runtime. Run it like any
DDP script (torchrun, srun through jobscripts/hpcorch-run.sbatch, mpirun). On SIGUSR2 it
checkpoints at the next step boundary and exits 75; started again (at any number of
ranks) it continues with exactly the samples it had not yet seen.

    torchrun --nproc-per-node 2 examples/train_elastic.py --epochs 2
    sbatch --gres=gpu:2 jobscripts/hpcorch-run.sbatch examples/train_elastic.py --epochs 3
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import hpcorch.runtime as hr  # first: it holds the checkpoint signal while torch loads

# isort: split
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils.data import TensorDataset


def make_data(samples: int, features: int, classes: int, seed: int = 0) -> TensorDataset:
    """Random inputs labelled by a fixed random teacher network (as in train_ddp.py)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(samples, features, generator=g)
    teacher = torch.randn(features, 32, generator=g), torch.randn(32, classes, generator=g)
    y = torch.tanh(x @ teacher[0]) @ teacher[1]
    return TensorDataset(x, y.argmax(dim=1))


UNTIL_EVERY = 8
"""Steps between two looks for --until-file (all ranks agree on what rank 0 found)."""


def rank0_says(flag: bool, device: torch.device) -> bool:
    """Rank 0's ``flag``, on every rank (collective): all ranks leave at the same step."""
    if not dist.is_initialized():
        return flag
    t = torch.tensor([float(flag)], device=device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def make_model(
    features: int, hidden: int, layers: int, classes: int, dropout: float
) -> torch.nn.Module:
    mods: list[torch.nn.Module] = []
    width = features
    for _ in range(layers):
        mods += [torch.nn.Linear(width, hidden), torch.nn.ReLU(), torch.nn.Dropout(dropout)]
        width = hidden
    mods.append(torch.nn.Linear(width, classes))
    return torch.nn.Sequential(*mods)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--features", type=int, default=20)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--classes", type=int, default=4)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--global-batch", "--batch-size", type=int, default=64)
    p.add_argument("--max-micro-batch", type=int, default=64, help="memory bound per GPU")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--lr-scaling", default="sqrt", choices=["none", "linear", "sqrt", "adascale"])
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--step-delay", type=float, default=0.0, help="sleep per step (emulated compute)"
    )
    p.add_argument(
        "--sample-delay",
        type=float,
        default=0.0,
        help="sleep per sample on each rank (emulated GPU compute: scales with the GPU count)",
    )
    p.add_argument("--record", type=Path, help="append this rank's sample indices per step here")
    p.add_argument("--save-params", type=Path, help="rank 0 writes the final parameters here")
    p.add_argument(
        "--until-file",
        type=Path,
        help="finish (final checkpoint, done) at the first step boundary after this file "
        "appears, whatever --epochs says: slurm/demo ends a job on an event this way",
    )
    a = p.parse_args()

    torch.manual_seed(a.seed)
    job = hr.init(
        global_batch=a.global_batch,
        max_micro_batch=a.max_micro_batch,
        lr_scaling=a.lr_scaling,
        warmup_steps=a.warmup_steps,
        seed=a.seed,
    )
    model = job.wrap(make_model(a.features, a.hidden, a.layers, a.classes, a.dropout))
    opt = torch.optim.SGD(model.parameters(), lr=a.lr, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=a.epochs * 1000)
    job.track(model, opt, sched)
    data = make_data(a.samples, a.features, a.classes, a.seed)
    job.log(f"rank {job.rank}/{job.world_size}: global batch {job.batch.describe()}")

    record = open(a.record.with_suffix(f".{job.rank}.jsonl"), "a") if a.record else None  # noqa: SIM115
    stopped = False
    for step in job.steps(data, epochs=a.epochs):
        for x, y in step:
            step.backward(F.cross_entropy(model(x.to(job.device)), y.to(job.device)))
        opt.step()
        opt.zero_grad()
        sched.step()
        if record:
            line = {"step": step.index, "epoch": step.epoch, "idx": step.indices}
            record.write(json.dumps(line) + "\n")
            record.flush()
        if a.step_delay:
            time.sleep(a.step_delay)
        if a.sample_delay:
            time.sleep(a.sample_delay * job.batch.micro_batch * job.batch.accum_steps)
        told = a.until_file is not None and step.index % UNTIL_EVERY == 0
        if told and rank0_says(a.until_file.exists(), job.device):
            stopped = True
            break
    if stopped:
        job.finish()
    if a.save_params and job.is_main:
        torch.save({k: v.cpu() for k, v in model.module.state_dict().items()}, a.save_params)


if __name__ == "__main__":
    main()
