"""A standalone job's time budget across its own requeues (the job wrapper's bookkeeping,
for the sidecar, which requeues its job itself). Under the controller, the controller
keeps the count (hpcorch/controller/reconcile.py).

``$HPCORCH_JOB_DIR/time-used`` holds ``RELAUNCHES SECONDS``: the requeues after the job
checkpointed on its own, and the run time of the launches that ended so. The wrapper
(jobscripts/hpcorch-run.sbatch) reads and writes the same file.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from hpcorch.protocol import BUDGET_FILE, ENV_MAX_RELAUNCHES, ENV_TIME_BUDGET

MIN_LAUNCH_S = 180
"""A launch shorter than this cannot reach a checkpoint: Slurm's checkpoint signal comes
120 s before the time limit."""


def _int(text: str | None, default: int) -> int:
    value = (text or "").strip()
    if value.lstrip("-").isascii() and value.lstrip("-").isdigit():
        return int(value)
    return default


def read_used(job_dir: Path) -> tuple[int, int]:
    try:
        parts = (job_dir / BUDGET_FILE).read_text().split()
    except OSError:
        return 0, 0
    if len(parts) != 2:
        return 0, 0
    return max(0, _int(parts[0], 0)), max(0, _int(parts[1], 0))


def record_relaunch(
    job_dir: Path, launch_seconds: float, env: Mapping[str, str] | None = None
) -> str | None:
    """Count one more relaunch after a checkpoint of the job's own and the launch's run
    time; None if the job may be requeued, else why not (one line)."""
    environ = os.environ if env is None else env
    budget = max(0, _int(environ.get(ENV_TIME_BUDGET), 0))
    cap = _int(environ.get(ENV_MAX_RELAUNCHES), -1)
    relaunches, used = read_used(job_dir)
    relaunches += 1
    used += max(0, int(launch_seconds))
    tmp = job_dir / (BUDGET_FILE + ".tmp")
    try:
        tmp.write_text(f"{relaunches} {used}\n")
        os.replace(tmp, job_dir / BUDGET_FILE)
    except OSError:
        pass  # the count is advice: a full disk must not stop the requeue
    if 0 <= cap < relaunches:
        return (
            f"not requeued: {cap} relaunches allowed ({ENV_MAX_RELAUNCHES}) and this was "
            f"number {relaunches}. Resubmit to continue from the checkpoint"
        )
    if budget and budget - used < MIN_LAUNCH_S:
        return (
            f"not requeued: time budget spent ({used} s of {budget} s). Resubmit to "
            "continue from the checkpoint"
        )
    return None
