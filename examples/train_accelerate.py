"""A plain Hugging Face Accelerate loop made elastic with hpcorch's runtime.

hpcorch recommends the runtime for an Accelerate script: ``accelerator.prepare`` of the
model and the data loader (DDP, the sampler, gradient accumulation) is exactly what the
runtime does elastically (``job.wrap``, ``job.steps``: planned batch, exact resume at any
size, live batch changes), and the ``Accelerator`` keeps what it adds on top: the device,
mixed precision (``accelerator.autocast()``) and its collectives for metrics. The
``Accelerator`` is made after ``hr.init``: it takes the process group the runtime formed.
The change to an Accelerate loop (docs/integrations.md):

    -model, opt, loader = accelerator.prepare(model, opt, loader)
    -for epoch in range(epochs):
    -    for x, y in loader:
    -        with accelerator.accumulate(model), accelerator.autocast():
    -            accelerator.backward(loss_fn(model(x), y))
    +job = hr.init(global_batch=64, max_micro_batch=16)    # before Accelerator()
    +model = job.wrap(model)
    +job.track(model, opt)
    +for step in job.steps(data, epochs=epochs):
    +    for x, y in step:
    +        with accelerator.autocast():
    +            step.backward(loss_fn(model(x.to(job.device)), y.to(job.device)))
             opt.step()
             opt.zero_grad()

``--record FILE`` appends the dataset indices each rank trained, per step, to
``FILE.<rank>.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import hpcorch.runtime as hr  # first: holds the checkpoint signal while torch loads

# isort: split
import torch
from accelerate import Accelerator
from torch.utils.data import TensorDataset


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--global-batch", type=int, default=64)
    p.add_argument("--max-micro-batch", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--record", type=Path)
    p.add_argument("--step-delay", type=float, default=0.0)
    a = p.parse_args()

    job = hr.init(global_batch=a.global_batch, max_micro_batch=a.max_micro_batch)
    accelerator = Accelerator(cpu=job.device.type == "cpu")
    assert accelerator.num_processes == job.world_size  # the runtime's process group
    g = torch.Generator().manual_seed(0)
    x = torch.randn(a.samples, 8, generator=g)
    data = TensorDataset(x, x @ torch.randn(8, 1, generator=g) + 0.1 * torch.randn(a.samples, 1))
    torch.manual_seed(0)
    model = job.wrap(
        torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
    )
    opt = torch.optim.SGD(model.parameters(), lr=a.lr)
    job.track(model, opt)
    record = open(a.record.with_suffix(f".{job.rank}.jsonl"), "a") if a.record else None  # noqa: SIM115
    for step in job.steps(data, epochs=a.epochs):
        for xb, yb in step:
            with accelerator.autocast():
                loss = torch.nn.functional.mse_loss(model(xb.to(job.device)), yb.to(job.device))
            step.backward(loss)
        opt.step()
        opt.zero_grad()
        if record:
            record.write(json.dumps({"epoch": step.epoch, "idx": step.indices}) + "\n")
            record.flush()
        time.sleep(a.step_delay)
    accelerator.print("training done")


if __name__ == "__main__":
    main()
