"""Did this launch lose a node or a rank? The sidecar's no-false-success check. The
decision (:func:`lost_reason`) is pure; :func:`read_launch_record` gathers its input.

srun exits 0 when it loses a node ("srun: error: Node failure on n1") while the tasks
there may still run, cut off from Slurm; Slurm has requeued the job by then. Such a launch
is never a result, whatever the script's exit code: the job wrapper checks this for
runtime jobs (``launch_lost`` in jobscripts/hpcorch-run.sbatch), the sidecar, which the
wrapper execs, checks the same before it reports ``training finished`` or a checkpoint
and exits ``EXIT_LAUNCH_LOST`` (79) instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path

_RESTARTS_RE = re.compile(r"\bRestarts=(\d+)")
_STATE_RE = re.compile(r"\bJobState=([A-Z_]+)")
_NODE_FAILURE_RE = re.compile(rb"^srun: error: Node failure on \S+", re.M)
LIVE_STATES = ("RUNNING", "COMPLETING", "SUSPENDED")


def node_failure_line(raw: bytes) -> bool:
    """Whether one line of srun's output reports a lost node."""
    return _NODE_FAILURE_RE.search(raw) is not None


def lost_reason(
    job_id: str,
    launch: int,
    owner: str | None,
    scontrol_job: str | None,
    node_failure: bool,
) -> str | None:
    """Why this launch (``job_id``, ``launch``) is not a result, or None when it is one.
    ``owner``: the text of the job directory's launch file (None: unreadable, no fencing);
    ``scontrol_job``: ``scontrol -o show job`` of the job (None: Slurm could not be asked);
    ``node_failure``: srun reported a node failure during the launch."""
    if owner is not None:
        parts = owner.split()
        if len(parts) >= 2 and (parts[0], parts[1]) != (job_id, str(launch)):
            number = int(parts[1]) + 1 if parts[1].isdigit() else parts[1]
            return f"launch {number} of job {parts[0]} owns the job directory now"
    if scontrol_job:
        restarts = _RESTARTS_RE.search(scontrol_job)
        state = _STATE_RE.search(scontrol_job)
        if restarts is not None and int(restarts[1]) > launch:
            return f"Slurm requeued the job (restart {restarts[1]}) while this launch ran"
        if state is not None and state[1] not in LIVE_STATES:
            return f"Slurm holds the job as {state[1]}"
        if "Reason=NodeDown" in scontrol_job:
            return "a node of the job is down"
    if node_failure:
        return "srun reported a node failure"
    return None


def read_launch_record(
    launch_file: Path, job_id: str, env: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """(the job directory's launch file, ``scontrol -o show job``); None for what cannot
    be read (no fencing, not under Slurm, Slurm not answering within 30 s)."""
    try:
        owner: str | None = launch_file.read_text()
    except (OSError, UnicodeDecodeError):
        owner = None
    if not job_id or shutil.which("scontrol", path=env.get("PATH")) is None:
        return owner, None
    try:
        done = subprocess.run(
            ["scontrol", "-o", "show", "job", job_id],
            capture_output=True, text=True, timeout=30, check=False, env=dict(env),
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired):
        return owner, None
    return owner, (done.stdout if done.returncode == 0 else None)
