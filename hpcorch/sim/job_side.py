"""What a simulated job's own processes do, apart from Slurm: the batch split they derive
from their plan, their checkpoints and resumes, and the metrics lines they write.

:mod:`hpcorch.sim.slurm_side` is Slurm (queue, launches, job states) and calls these at the
moments a real job does each (a launch reads its plan, a signal makes it checkpoint, a
relaunch resumes it, training writes lines). The lines are those of ``hpcorch.runtime``: a
``start`` event once training begins (its model, and the length it declares: epochs and
dataset size, unless it declares none), then ``steps`` lines.
"""

from __future__ import annotations

from typing import Any

from hpcorch.planner import BatchPlanError, LaunchPlan, plan_batch
from hpcorch.sim.slurm_jobs import Checkpoint, SlurmJob


def set_batch(j: SlurmJob, plan: LaunchPlan | None) -> None:
    """The batch split the runtime derives from ``plan`` on the job's GPUs."""
    m = j.model
    gpus = m.gpus
    want = plan.global_batch if plan else int(j.tags["batch"])
    micro_cap = plan.max_micro_batch if plan else m.app.max_micro
    try:
        bp = plan_batch(max(want, gpus), gpus, micro_cap)
    except BatchPlanError:
        bp = plan_batch(gpus, gpus, 1)
    # Below the smallest measured per-GPU batch a step takes as long as at that batch.
    app = m.app
    m.batch, m.accum_steps, j.micro = bp.global_batch, bp.accum_steps, bp.micro_batch
    m.micro_batch = min(max(bp.micro_batch, app.min_micro), app.max_micro)


def checkpoint(j: SlurmJob) -> None:
    """The job writes its checkpoint (progress, epoch, steps, noise history)."""
    m = j.model
    j.ckpt = Checkpoint(m.progress, m.epoch, j.steps, len(m.grad_history))


def restore(j: SlurmJob) -> None:
    """The job resumes from its last checkpoint (what it did since is lost)."""
    m, c = j.model, j.ckpt
    m.progress, m.epoch, j.steps = c.progress, c.epoch, c.steps
    del m.grad_history[c.history :]


def iteration_time(j: SlurmJob) -> float:
    """Seconds per optimizer step of the running launch (the true model's)."""
    return j.model.iteration_time()[0]


def line(j: SlurmJob, at: float, event: str) -> None:
    """An event line (``start``, ``done``); the start says what the job is and, where it
    declares it, how long it trains."""
    m = j.model
    out: dict[str, Any] = {"time": at, "event": event, "step": int(j.steps)}
    if event == "start":
        app = m.app
        if j.declares_length:
            out["epochs"] = app.epochs
            out["dataset_size"] = max(1, round(app.progress_per_epoch_hint * app.init_batch))
        out["epoch"] = m.epoch
        out["model"] = app.name  # what the runtime reports of its model
        out["params"] = app.model_bytes // 4
        out["model_bytes"] = app.model_bytes
    j.lines.append(out)


def flush(j: SlurmJob, at: float) -> None:
    """Report what the running configuration measured before it changes."""
    if j.training and j.win_seconds > 0:
        report(j, at)


def report(j: SlurmJob, at: float, force: bool = False) -> None:
    """A ``steps`` line: what the job measured since its last line."""
    if j.win_steps <= 0 and not force:
        return
    m = j.model
    it, compute = m.iteration_time()
    noise = None
    if m.grad is not None and m.grad[0] > 0:
        noise = m.grad[1] / m.grad[0] * m.app.init_batch
    j.lines.append(
        {
            "time": at,
            "event": "steps",
            "step": int(j.steps),
            "steps": round(j.win_steps),
            "step_time": it,
            "samples_per_s": m.batch / it,
            "loss": None,
            "epoch": m.epoch,
            "global_batch": m.batch,
            "per_gpu_batch": j.micro,
            "accum_steps": m.accum_steps,
            "gpus": m.gpus,
            "noise_scale": noise,
        }
    )
    if m.cpus_per_gpu > 0:
        j.lines[-1].update(cpus_per_gpu=m.cpus_per_gpu, data_wait=it - compute)
    j.win_steps = j.win_seconds = 0.0
    j.last_line = at
