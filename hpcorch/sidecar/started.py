"""Did a task of this launch start? The sidecar's watch on a step Slurm never starts.

The job wrapper's task shim writes the launch's number to ``task-started`` in the job
directory as rank 0 starts. A step Slurm accepted but never started (its launch lost while
slurmctld was stopped or overloaded) leaves srun waiting for ever, the job holding its
GPUs; srun can also exit 0 without running a task. Either is no result (exit 79), as in the
wrapper's own path. Checked only under the wrapper, which sets
``HPCORCH_TASK_START_TIMEOUT`` (its launcher carries the shim).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from hpcorch.protocol import ENV_TASK_START_TIMEOUT, TASK_STARTED_FILE

KILL_AFTER_S = 15.0
"""Seconds between asking srun to stop (SIGTERM) and killing it."""
_SECONDS_RE = re.compile(r"[0-9]{1,6}")


class TaskStartError(ValueError):
    """HPCORCH_TASK_START_TIMEOUT is not a whole number of seconds."""


def task_start_timeout(env: Mapping[str, str]) -> float | None:
    """The seconds a task of the launch may take to start (0: no limit); None where the
    launcher is not the wrapper's (the variable unset): nothing is checked then."""
    text = env.get(ENV_TASK_START_TIMEOUT)
    if text is None:
        return None
    if not _SECONDS_RE.fullmatch(text):
        raise TaskStartError(
            f"{ENV_TASK_START_TIMEOUT} must be a whole number of seconds (0: no limit), "
            f"not {text[:40]!r}"
        )
    return float(text)


@dataclass
class TaskStart:
    """The watch over one launch (``launch``: HPCORCH_LAUNCH) of a job directory."""

    job_dir: Path
    launch: int
    timeout_s: float | None
    began: float = 0.0
    stopped_at: float | None = None
    """When srun was asked to stop for want of a task (None: it was not)."""

    @property
    def path(self) -> Path:
        return self.job_dir / TASK_STARTED_FILE

    def clear(self, now: float) -> None:
        """Before the launch: an earlier launch's mark says nothing of this one."""
        self.path.unlink(missing_ok=True)
        self.began = now

    def started(self) -> bool:
        try:
            return self.path.read_text().strip() == str(self.launch)
        except (OSError, UnicodeDecodeError):
            return False

    def due(self, now: float) -> str | None:
        """``"stop"`` when srun has waited past the limit with no task started, ``"kill"``
        when it outlived its stop by ``KILL_AFTER_S``; None otherwise."""
        if not self.timeout_s:
            return None
        if self.stopped_at is None:
            if now - self.began >= self.timeout_s and not self.started():
                self.stopped_at = now
                return "stop"
            return None
        return "kill" if now - self.stopped_at >= KILL_AFTER_S else None

    def no_result(self, rc: int) -> str | None:
        """Why the launch that ended with ``rc`` is no result for want of a task, or None."""
        if self.timeout_s is None or self.started():
            return None  # not under the wrapper (no task shim: nothing to go by), or started
        if self.stopped_at is not None:
            waited = f"{self.timeout_s:.0f} s"
            return f"srun stopped (exit code {rc}) after waiting {waited} for its step"
        if rc == 0:
            return f"srun exited 0, but no task of launch {self.launch + 1} started"
        return None
