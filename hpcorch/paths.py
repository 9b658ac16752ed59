"""Where hpcorch keeps things: the state directory and the job wrapper."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from hpcorch.errors import HpcorchError
from hpcorch.protocol import ENV_SPOOL

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


def spool_dir(given: str | None = None) -> Path:
    """The controller's spool, where it writes each job's plan: given, $HPCORCH_SPOOL, or
    <controller state directory>/jobs. Jobs find their plan at <spool>/<Slurm id>/plan.json."""
    if given:
        return Path(given).expanduser().resolve()
    env = os.environ.get(ENV_SPOOL)
    return Path(env).expanduser().resolve() if env else controller_dir() / "jobs"


def jobs_dir() -> Path:
    return state_dir() / "jobs"


def wrapper_path() -> Path:
    """The job wrapper: $HPCORCH_WRAPPER, else jobscripts/ of this checkout, else the one
    slurm/install-site put beside this installation (<prefix>/share/hpcorch/jobscripts)."""
    env = os.environ.get("HPCORCH_WRAPPER")
    checkout = Path(__file__).resolve().parent.parent / "jobscripts" / WRAPPER_NAME
    installed = Path(sys.prefix) / "share" / "hpcorch" / "jobscripts" / WRAPPER_NAME
    path = Path(env) if env else checkout if checkout.is_file() else installed
    if not path.is_file():
        raise HpcorchError(
            f"job wrapper not found at {path}: set HPCORCH_WRAPPER to jobscripts/{WRAPPER_NAME}"
        )
    return path
