"""hpcorch.runtime: the in-job elastic runtime a DDP training script imports.

    import hpcorch.runtime as hr

    job = hr.init(global_batch=256, max_micro_batch=64)   # process group, plan, signal
    model = job.wrap(Net())                               # DDP on this rank's device
    opt = torch.optim.SGD(model.parameters(), lr=0.1)     # LR tuned at global_batch=256
    job.track(model, opt)                                 # checkpointed; restored on resume
    for step in job.steps(dataset, epochs=3):             # resumes exactly where it stopped
        for x, y in step:                                 # this rank's micro-batches
            step.backward(loss_fn(model(x), y))
        opt.step()
        opt.zero_grad()

On the checkpoint signal (SIGUSR2 by default) every rank stops at the next step boundary,
rank 0 writes the checkpoint atomically and the processes exit with code 75 (relaunch me).
"""

from __future__ import annotations

import os
import time
from typing import Any

from hpcorch.protocol import CHECKPOINT_SIGNAL, ENV_CKPT_SIGNAL
from hpcorch.runtime.config import catch_signals_early
from hpcorch.runtime.metrics import process_age

catch_signals_early(os.environ.get(ENV_CKPT_SIGNAL) or CHECKPOINT_SIGNAL)  # before torch
_AT_IMPORT = process_age()  # process start -> here, which includes importing torch
_t0 = time.perf_counter()
import torch  # noqa: E402, F401  (timed: the share of start-up spent importing torch)

_TORCH_IMPORT = time.perf_counter() - _t0  # 0 when the script imported torch first

from hpcorch import logsetup  # noqa: E402
from hpcorch.planner import BatchPlan, LaunchPlan, lr_scale, plan_batch  # noqa: E402
from hpcorch.protocol import EXIT_CONFIG, EXIT_DONE, EXIT_RELAUNCH  # noqa: E402
from hpcorch.runtime.checkpoint import CheckpointError  # noqa: E402
from hpcorch.runtime.config import ConfigError, settings_or_exit  # noqa: E402
from hpcorch.runtime.dist import DistInfo, LaunchError, init_process_group  # noqa: E402
from hpcorch.runtime.job import ElasticJob  # noqa: E402
from hpcorch.runtime.step import Step  # noqa: E402

__all__ = [
    "EXIT_CONFIG",
    "EXIT_DONE",
    "EXIT_RELAUNCH",
    "BatchPlan",
    "CheckpointError",
    "ConfigError",
    "DistInfo",
    "ElasticJob",
    "LaunchError",
    "LaunchPlan",
    "Step",
    "init",
    "lr_scale",
    "plan_batch",
]


def init(
    *,
    global_batch: int,
    max_micro_batch: int,
    lr_scaling: str = "sqrt",
    base_batch: int | None = None,
    warmup_steps: int = 20,
    min_global_batch: int | None = None,
    max_global_batch: int | None = None,
    seed: int = 0,
    job_dir: str | os.PathLike[str] | None = None,
    launcher: str | None = None,
    backend: str | None = None,
    checkpoint_signal: str | None = None,
    checkpoint_interval: float | None = None,
    metrics_interval: float | None = None,
    keep_checkpoints: int = 2,
    final_checkpoint: bool = True,
    fast_exit: bool = True,
) -> ElasticJob:
    """Join the process group and settle this launch's batch, LR rule and checkpoint.

    ``global_batch`` and ``max_micro_batch`` are the script's defaults; the plan file
    (HPCORCH_PLAN, else ``<job dir>/plan.json``) and then HPCORCH_GLOBAL_BATCH /
    HPCORCH_MAX_PER_GPU_BATCH override them. The optimizer's LR is taken as tuned for
    ``base_batch`` (default ``global_batch``) and scaled by ``lr_scaling`` (none, linear,
    sqrt, adascale), ramped over ``warmup_steps`` after every change of the global batch.
    A bad plan, environment or checkpoint ends the process with one error line and exit
    code 78 (EXIT_CONFIG); nothing is written. After a checkpoint on request the process
    exits with code 75; with ``fast_exit`` (default) atexit handlers run but the slow
    interpreter teardown is skipped (``finally`` blocks around the loop do not run).
    """
    try:
        info = init_process_group(backend=backend, launcher=launcher)
    except LaunchError as e:
        logsetup.ensure("hpcorch").error("%s", e)
        raise SystemExit(EXIT_CONFIG) from None
    settings = settings_or_exit(
        info.rank,
        world_size=info.world_size,
        global_batch=global_batch,
        max_micro_batch=max_micro_batch,
        lr_scaling=lr_scaling,
        min_global_batch=min_global_batch,
        max_global_batch=max_global_batch,
        job_dir=job_dir,
        checkpoint_signal=checkpoint_signal,
        checkpoint_interval=checkpoint_interval,
        metrics_interval=metrics_interval,
    )
    timings: dict[str, Any] = {
        "since_start_at_import": round(_AT_IMPORT, 3),
        "torch_import_seconds": round(_TORCH_IMPORT, 3),
        "pg_init_seconds": round(info.init_seconds, 3),
        "since_start_at_init": round(process_age(), 3),
    }
    return ElasticJob(
        info,
        settings,
        base_batch=base_batch or global_batch,
        warmup_steps=warmup_steps,
        seed=seed,
        keep_checkpoints=keep_checkpoints,
        final_checkpoint=final_checkpoint,
        fast_exit=fast_exit,
        timings=timings,
    )
