"""Resolving a launch's settings: plan file > environment (submit options) > script defaults."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from hpcorch import logsetup
from hpcorch.planner import (
    LR_SCALING_RULES,
    BatchPlan,
    BatchPlanError,
    LaunchPlan,
    PlanFileError,
    clamp_global_batch,
    plan_batch,
    read_plan,
)
from hpcorch.protocol import (
    CHECKPOINT_SIGNAL,
    ENV_CKPT_INTERVAL,
    ENV_CKPT_SIGNAL,
    ENV_GLOBAL_BATCH,
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_MAX_GLOBAL_BATCH,
    ENV_MAX_PER_GPU_BATCH,
    ENV_METRICS_INTERVAL,
    ENV_MIN_GLOBAL_BATCH,
    ENV_PLAN,
    EXIT_CONFIG,
    PLAN_FILE,
)


class ConfigError(ValueError):
    """Bad settings for this launch (plan file, environment or arguments)."""


@dataclass(frozen=True)
class Settings:
    """Everything a launch decided before the first step."""

    job_dir: Path
    job_id: str | None
    plan_path: Path | None
    """The plan file read, None when running on defaults."""
    plan_gpus: int | None
    """GPUs the plan was made for (the batch is planned for the actual world size)."""
    requested_batch: int
    """Global batch asked for, before the bounds."""
    batch: BatchPlan
    lr_scaling: str
    signals: tuple[signal.Signals, ...]
    checkpoint_interval: float
    metrics_interval: float
    min_global_batch: int | None = None
    max_global_batch: int | None = None
    """Bounds on the global batch (a rewritten plan is clamped into them too)."""
    plan_launch: int | None = None
    trained_step: int = 0
    """The furthest step earlier launches reached (the plan's ``trained_step``)."""
    """The launch number of the plan read (a rewritten plan for an older one is ignored)."""


def parse_signals(spec: str) -> tuple[signal.Signals, ...]:
    """``"USR2"``, ``"SIGUSR2,TERM"`` or ``"12"`` -> signals."""
    out = []
    for raw in spec.split(","):
        name = raw.strip().upper()
        if not name:
            continue
        try:
            sig = (
                signal.Signals(int(name))
                if name.isdigit()
                else signal.Signals[name if name.startswith("SIG") else "SIG" + name]
            )
        except (KeyError, ValueError):
            raise ConfigError(f"unknown signal {raw.strip()!r} in {spec!r}") from None
        if sig in (signal.SIGKILL, signal.SIGSTOP):
            raise ConfigError(f"signal {sig.name} cannot be caught")
        out.append(sig)
    if not out:
        raise ConfigError(f"no signal named in {spec!r}")
    return tuple(out)


def _env_int(env: Mapping[str, str], name: str) -> int | None:
    raw = env.get(name)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < 1:
        raise ConfigError(f"{name}={raw!r} must be >= 1")
    return value


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if value < 0:
        raise ConfigError(f"{name}={raw!r} must be >= 0")
    return value


def resolve(
    env: Mapping[str, str],
    *,
    world_size: int,
    global_batch: int,
    max_micro_batch: int,
    lr_scaling: str,
    min_global_batch: int | None,
    max_global_batch: int | None,
    job_dir: str | os.PathLike[str] | None,
    checkpoint_signal: str | None,
    checkpoint_interval: float | None,
    metrics_interval: float | None,
) -> Settings:
    """Settings of this launch; :class:`ConfigError` names the first problem."""
    if lr_scaling not in LR_SCALING_RULES:
        raise ConfigError(
            f"unknown lr_scaling {lr_scaling!r}; valid: {', '.join(LR_SCALING_RULES)}"
        )
    directory = Path(env.get(ENV_JOB_DIR) or job_dir or "hpcorch-job").absolute()
    job_id = env.get(ENV_JOB_ID) or None
    plan_path: Path | None = Path(env[ENV_PLAN]) if env.get(ENV_PLAN) else None
    if plan_path is None and (directory / PLAN_FILE).exists():
        plan_path = directory / PLAN_FILE
    plan: LaunchPlan | None = None
    if plan_path is not None:
        try:
            plan = read_plan(plan_path)
        except PlanFileError as e:
            raise ConfigError(str(e)) from None
        if job_id is not None and plan.job is not None and plan.job != job_id:
            raise ConfigError(f"plan {plan_path} is for job {plan.job!r}, not for {job_id!r}")
        job_id = job_id or plan.job
    requested = plan.global_batch if plan else _env_int(env, ENV_GLOBAL_BATCH) or global_batch
    micro = (
        plan.max_micro_batch if plan else _env_int(env, ENV_MAX_PER_GPU_BATCH) or max_micro_batch
    )
    try:
        lower = _env_int(env, ENV_MIN_GLOBAL_BATCH) or min_global_batch
        upper = _env_int(env, ENV_MAX_GLOBAL_BATCH) or max_global_batch
        bounded = clamp_global_batch(requested, lower, upper)
        batch = plan_batch(bounded, world_size, micro)
    except BatchPlanError as e:
        raise ConfigError(f"cannot plan the batch: {e}") from None
    rule = (plan.lr_scaling if plan and plan.lr_scaling else None) or lr_scaling
    sig_spec = checkpoint_signal or env.get(ENV_CKPT_SIGNAL) or CHECKPOINT_SIGNAL
    return Settings(
        job_dir=directory,
        job_id=job_id,
        plan_path=plan_path,
        plan_gpus=plan.gpus if plan else None,
        requested_batch=requested,
        batch=batch,
        lr_scaling=rule,
        signals=parse_signals(sig_spec),
        checkpoint_interval=checkpoint_interval
        if checkpoint_interval is not None
        else _env_float(env, ENV_CKPT_INTERVAL, 0.0),
        metrics_interval=metrics_interval
        if metrics_interval is not None
        else _env_float(env, ENV_METRICS_INTERVAL, 5.0),
        min_global_batch=lower,
        max_global_batch=upper,
        plan_launch=plan.launch if plan else None,
        trained_step=plan.trained_step if plan else 0,
    )


EARLY_SIGNAL: dict[str, float] = {}
"""Time of a checkpoint signal that arrived before the job object existed."""


def settings_or_exit(rank: int, **options: Any) -> Settings:
    """:func:`resolve` from this process's environment; a bad plan or setting ends the
    launch with one error line (rank 0) and exit code 78 (EXIT_CONFIG), nothing written."""
    try:
        return resolve(os.environ, **options)
    except ConfigError as e:
        if rank == 0:
            logsetup.ensure("hpcorch").error("%s", e)
        raise SystemExit(EXIT_CONFIG) from None


def _early_handler(signum: int, frame: FrameType | None) -> None:
    EARLY_SIGNAL.setdefault("time", time.time())


def catch_signals_early(spec: str) -> None:
    """Hold checkpoint signals from import time on (their default action would kill us).

    Called by ``hpcorch.runtime`` before it imports torch, which takes seconds."""
    try:
        for sig in parse_signals(spec):
            signal.signal(sig, _early_handler)
    except (ConfigError, ValueError):
        pass  # a bad name is reported by init(); not in the main thread: nothing to do
