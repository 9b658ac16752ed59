"""An emulated training job: one of the bundled Pollux applications, on the real runtime.

It trains nothing and needs no GPU: each optimizer step takes the time the application's
measured profile gives for the job's placement (its GPUs per node, read from Slurm's node
names), per-GPU batch and accumulation, spent sleeping; each step advances the job's
statistical progress by the profile's gain at the global batch and epoch (as the
simulator's model of the job does, :class:`hpcorch.sim.engine.SimJob`); the job ends when
the application's last epoch is done. Everything around the steps is the real runtime: the
plan, the checkpoint on the signal and the exact resume (progress and epoch are in the
checkpoint), live batch changes, metrics, on gloo ranks.

On nodes of a GPU type (``Gres=gpu:a100:4``, ``slurm/pool up --gpu-types``) it runs at
the application's speed factor for that type (``hpcorch/sim/data/gpu-types``: compute
scaled, all-reduce as measured), at the slowest type's where its nodes mix types, as the
simulator's pool of several types does.

``--time-scale F`` gives each epoch F times the measured work (as ``hpcorch simulate
--time-scale F``): steps keep their measured time, so the job takes about F times as long.

What it reports is what the simulated job reports: the application's epochs and samples
per epoch at start, its statistical epoch and the profile's gradient noise scale in every
steps line.

    hpcorch submit --min-gpus 1 --max-gpus 8 --app cifar10 ... \\
        benchmarks/emulated_job.py --app cifar10 --time-scale 0.05
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import hpcorch.runtime as hr  # first: it holds the checkpoint signal while torch loads

# isort: split
import torch
import torch.distributed as dist

from hpcorch.runtime.gns import NoiseScale
from hpcorch.sim.gputypes import load_speeds
from hpcorch.sim.traces import AppTrace, TraceError, load_apps


class TraceNoise(NoiseScale):
    """The application's gradient noise scale at the job's batch and statistical epoch
    (the simulator's), in place of the one measured from this emulator's gradients."""

    def __init__(self, app: AppTrace, emu: dict[str, Any], batch: Any) -> None:
        super().__init__()
        self.app, self.emu, self.batch = app, emu, batch

    def update(self, local_sq: float, global_sq: float, b_small: int, b_big: int) -> None:
        return None

    @property
    def value(self) -> float | None:
        sqr, var = self.app.grad_stats(self.batch(), int(self.emu["epoch"]))
        return var / sqr * self.app.init_batch if sqr > 0 else None


def node_gpu_type(node: str) -> str:
    """The GPU type Slurm gives ``node`` (``Gres=gpu:a100:4``), "" when untyped or unknown."""
    try:
        out = subprocess.run(
            ["scontrol", "-o", "show", "node", node], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""
    m = re.search(r"\bGres=gpu:([A-Za-z0-9_.-]+):\d", out)
    return m[1] if m else ""


def placement(job: hr.ElasticJob) -> tuple[tuple[int, ...], set[str]]:
    """GPUs (ranks) on each node of this launch, in the order of the first rank on it, and
    the GPU types of its nodes."""
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    mine = (node, node_gpu_type(node))
    names: list[Any] = [None] * job.world_size
    if job.world_size > 1:
        dist.all_gather_object(names, mine)
    else:
        names = [mine]
    counts = Counter(n for n, _ in names)
    return tuple(counts[n] for n in dict.fromkeys(n for n, _ in names)), {t for _, t in names}


def on_types(app: AppTrace, types: set[str]) -> AppTrace:
    """``app`` on nodes of ``types``: at the slowest one's speed factor (the bundled table,
    relative to the T4 its traces were measured on); as measured where a type is unknown."""
    speeds = load_speeds()
    if not types or any(t not in speeds for t in types):
        return app
    return app.on_gpu(min(speeds[t][app.name] for t in types))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--app", required=True, help="bundled application (cifar10, bert, ...)")
    p.add_argument("--time-scale", type=float, default=1.0, help="work per epoch, (0, 1]")
    args = p.parse_args()
    try:
        apps = load_apps()
        if args.app not in apps:
            raise TraceError(f"unknown application {args.app!r} (valid: {', '.join(apps)})")
        app = apps[args.app].scaled(args.time_scale)
    except TraceError as exc:
        print(f"emulated_job: {exc}", file=sys.stderr)
        raise SystemExit(hr.EXIT_CONFIG) from None
    job = hr.init(
        global_batch=app.init_batch,
        max_micro_batch=app.max_micro,
        lr_scaling="none",
        warmup_steps=0,
    )
    emu = job.state.setdefault("emu", {"progress": 0.0, "epoch": 0})
    job.noise = TraceNoise(app, emu, lambda: job.global_batch)
    _report_as_simulated(job, app, emu)
    model = job.wrap(torch.nn.Linear(1, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    job.track(model, opt)
    counts, types = placement(job)
    app = on_types(app, types)
    samples = max(1, round(app.progress_per_epoch_hint * app.init_batch))
    # the runtime's data epochs run ahead of the statistical ones (a step's gain is at most
    # its batch over the initial one): enough of them that the loop never ends first
    passes = app.epochs * max(1, app.max_batch // app.init_batch) + 1
    deadline = time.monotonic()
    if emu["epoch"] >= app.epochs:  # resumed from its final checkpoint: nothing left
        job.finish()
        return
    for step in job.steps(range(samples), epochs=passes, shuffle=False):
        b = job.batch
        micro = min(max(b.micro_batch, app.min_micro), app.max_micro)
        target = app.iteration_time(counts, micro, b.accum_steps)
        for x in step:
            step.backward(model(x.float().unsqueeze(1)).mean() * 0.0)
        deadline = max(deadline + target, time.monotonic() - target)
        wait = deadline - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        opt.step()
        opt.zero_grad()
        emu["progress"] += app.gain(job.global_batch, int(emu["epoch"]))
        if emu["progress"] >= float(app.epoch_end[int(emu["epoch"]) + 1]):
            emu["epoch"] += 1
            if emu["epoch"] >= app.epochs:
                break
    job.finish()


def _report_as_simulated(job: hr.ElasticJob, app: AppTrace, emu: dict[str, Any]) -> None:
    """The start event names the application's epochs (not the loop's data passes) and its
    model; every steps line names the statistical epoch, as the simulated job's lines do."""
    metrics = job.metrics
    event, step = metrics.event, metrics.step

    def start_as_simulated(kind: str, **fields: Any) -> None:
        if kind == "start":  # and the model the application trains (its all-reduce)
            fields.update(epochs=app.epochs, epoch=int(emu["epoch"]), model=app.name)
            fields.update(params=app.model_bytes // 4, model_bytes=app.model_bytes)
        event(kind, **fields)

    def step_as_simulated(**fields: Any) -> bool:
        fields["epoch"] = int(emu["epoch"])
        return step(**fields)

    metrics.event = start_as_simulated  # type: ignore[method-assign]
    metrics.step = step_as_simulated  # type: ignore[method-assign]


if __name__ == "__main__":
    main()
