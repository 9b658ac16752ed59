"""Where hpcorch keeps things: the state directory and the job wrapper."""

from __future__ import annotations

import os
from pathlib import Path

from hpcorch.errors import HpcorchError

WRAPPER_NAME = "hpcorch-run.sbatch"


def state_dir() -> Path:
    """$HPCORCH_HOME, else ~/.hpcorch: job directories, plans, metrics, checkpoints."""
    env = os.environ.get("HPCORCH_HOME")
    return Path(env).expanduser().resolve() if env else Path.home() / ".hpcorch"


STATE_DB = "state.db"


def controller_dir(given: str | None = None) -> Path:
    """The controller's state directory: given, $HPCORCH_CONTROLLER_DIR, or
    $HPCORCH_HOME/controller."""
    if given:
        return Path(given).expanduser().resolve()
    env = os.environ.get("HPCORCH_CONTROLLER_DIR")
    return Path(env).expanduser().resolve() if env else state_dir() / "controller"


def jobs_dir() -> Path:
    return state_dir() / "jobs"


def wrapper_path() -> Path:
    """The job wrapper: $HPCORCH_WRAPPER, else jobscripts/ of this checkout."""
    env = os.environ.get("HPCORCH_WRAPPER")
    path = (
        Path(env) if env else Path(__file__).resolve().parent.parent / "jobscripts" / WRAPPER_NAME
    )
    if not path.is_file():
        raise HpcorchError(
            f"job wrapper not found at {path}: set HPCORCH_WRAPPER to jobscripts/{WRAPPER_NAME}"
        )
    return path
