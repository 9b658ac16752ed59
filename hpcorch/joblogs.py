"""A job's files and output across its launches: where its directory is, its launches in
its Slurm output file, and when a followed job is over.

Every launch of a job (a relaunch keeps the Slurm job id) appends to the one file
``<job dir>/slurm-<id>.out`` (``--open-mode=append``), and the job wrapper starts each
launch's output with ``hpcorch-run[<id>]: launch <n>: ...`` (launch 1 is the first, as in
``hpcorch status`` and ``describe``). So the launches are the segments between those lines;
output before the first one belongs to the first launch.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from hpcorch.cluster import ENDED_STATES
from hpcorch.paths import jobs_dir
from hpcorch.protocol import EXIT_RELAUNCH, JOB_SPEC_FILE
from hpcorch.slurm.parse import SlurmJob
from hpcorch.slurm.script import parse_comment

LAUNCH_RE = re.compile(rb"^hpcorch-run\[[0-9]+\]: launch ([0-9]+):", re.MULTILINE)


def log_name(slurm_id: int) -> str:
    return f"slurm-{slurm_id}.out"


def find_job_dir(slurm_id: int, job: SlurmJob | None, home_jobs: Path | None = None) -> Path | None:
    """The job's directory: named by its Slurm comment (``dir=``, or ``id=`` under this
    user's jobs directory), else found by its job.json (a job Slurm no longer lists)."""
    base = home_jobs or jobs_dir()
    if job is not None:
        tags = parse_comment(job.comment) or {}
        for candidate in (tags.get("dir", ""), str(base / tags["id"]) if "id" in tags else ""):
            if candidate and (Path(candidate) / log_name(slurm_id)).exists():
                return Path(candidate)
            if candidate and (Path(candidate) / JOB_SPEC_FILE).exists():
                return Path(candidate)
    try:
        specs = sorted(base.glob(f"*/{JOB_SPEC_FILE}"), key=lambda p: p.stat().st_mtime)
    except OSError:
        return None
    for spec in reversed(specs):  # the newest first: the likeliest
        try:
            if json.loads(spec.read_text()).get("slurm_id") == slurm_id:
                return spec.parent
        except (OSError, ValueError, AttributeError):
            continue
    return None


@dataclass(frozen=True)
class Launch:
    number: int
    start: int
    """Byte offset of the launch's first line (0 for the first launch)."""
    end: int
    """Byte offset after its last byte."""


def launches(data: bytes) -> list[Launch]:
    """The launches in a job's output, in order (an empty output: none)."""
    marks = [(int(m.group(1)), m.start()) for m in LAUNCH_RE.finditer(data)]
    if not marks:
        return [Launch(1, 0, len(data))] if data else []
    out = []
    for i, (number, start) in enumerate(marks):
        end = marks[i + 1][1] if i + 1 < len(marks) else len(data)
        out.append(Launch(number, 0 if i == 0 else start, end))
    return out


def launch_slice(data: bytes, number: int) -> bytes:
    """The output of launch ``number``; a ValueError naming the launches there are."""
    found = launches(data)
    for launch in found:
        if launch.number == number:
            return data[launch.start : launch.end]
    have = ", ".join(str(launch.number) for launch in found) or "none yet"
    raise ValueError(f"no launch {number} in the job's output (launches: {have})")


def launch_start(data: bytes, number: int) -> int:
    for launch in launches(data):
        if launch.number == number:
            return launch.start
    raise ValueError(f"no launch {number} in the job's output yet")


def is_over(job: SlurmJob | None, pooled: bool) -> bool:
    """Whether a followed job has nothing more to write: gone from Slurm, or ended for
    good. A pool job that ended with the relaunch code is relaunched by the controller
    (for it, see :func:`relaunch_overdue`)."""
    if job is None:
        return True
    if job.state not in ENDED_STATES:
        return False
    return not (pooled and job.exit_code == EXIT_RELAUNCH)


def relaunch_overdue(job: SlurmJob, now: float, wait_s: float = 120.0) -> bool:
    """A pool job that checkpointed and was not relaunched within ``wait_s``: the
    controller ended it (time budget, --max-relaunches) or is not running."""
    return job.state in ENDED_STATES and job.end_time > 0 and now - job.end_time > wait_s


def pooled_job(job: SlurmJob | None) -> bool:
    """hpcorch's jobs run in a reservation only in a controller's pool."""
    return job is not None and bool(job.reservation) and parse_comment(job.comment) is not None


def tail(data: bytes, lines: int) -> bytes:
    """The last ``lines`` lines."""
    if lines <= 0:
        return b""
    parts = data.splitlines(keepends=True)
    return b"".join(parts[-lines:])
