"""The job requeues itself after a checkpoint, as the job wrapper does
(jobscripts/hpcorch-run.sbatch ``requeue_self``): Slurm then ends the batch script with
SIGTERM, answered with exit 0, so accounting shows the launch as a requeue (job REQUEUED,
steps COMPLETED) instead of a failure with exit code 75."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from hpcorch.budget import record_relaunch
from hpcorch.protocol import EXIT_DONE, EXIT_RELAUNCH

REQUEUE_NOTE = " (Slurm notes the requeue as 'CANCELLED ... DUE TO JOB REQUEUE')"
"""Said before the requeue: the line Slurm's requeue writes to the job's output next."""
REQUEUE_WAIT_S = 300.0
"""How long the batch script waits for Slurm to end it after its requeue."""


def requeue_command(job_id: str, controlled: bool) -> list[str]:
    """Under the controller: requeued held in Slurm's SPECIAL_EXIT state (the controller
    relaunches it at its new size); standalone: requeued to run again as it is."""
    if controlled:
        return ["scontrol", "requeuehold", "State=SpecialExit", job_id]
    return ["scontrol", "requeue", job_id]


def _ended_by_slurm(signum: int, frame: FrameType | None) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_DONE)


def requeue_self(job_id: str, controlled: bool, wait_s: float = REQUEUE_WAIT_S) -> None:
    """Requeue job ``job_id`` from inside it; this process exits 0 when Slurm's requeue ends
    it. Returns only when Slurm refused the requeue or did not end the job within
    ``wait_s``: the caller exits 75 instead."""
    before = signal.signal(signal.SIGTERM, _ended_by_slurm)
    try:
        done = subprocess.run(requeue_command(job_id, controlled), check=False)
        if done.returncode == 0:
            time.sleep(wait_s)
    finally:
        signal.signal(signal.SIGTERM, before)


def relaunch(
    job_id: str, controlled: bool, job_dir: Path, started: float, log: Callable[..., None]
) -> int:
    """The sidecar's script stopped after a checkpoint: requeue the job (standalone, within
    its time budget and relaunch cap, counted in the job directory) and end with Slurm's
    requeue (exit 0), or exit EXIT_RELAUNCH when there is no requeue."""
    if controlled:
        log(f"stopped: requeued held for the controller's relaunch{REQUEUE_NOTE}")
    elif (why := record_relaunch(job_dir, time.time() - started)) is not None:
        log(f"stopped; {why}")
        return EXIT_RELAUNCH
    else:
        log(f"stopped: requeueing job {job_id} to resume{REQUEUE_NOTE}")
    requeue_self(job_id, controlled)  # ended by Slurm's requeue: exits 0, or returns
    if controlled:
        log(f"the requeue failed: the controller relaunches the job on exit code {EXIT_RELAUNCH}")
    else:
        log("requeue failed: resubmit to resume", logging.ERROR)
    return EXIT_RELAUNCH
