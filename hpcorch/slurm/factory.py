"""Choose the Slurm backend: pyslurm when it imports and is new enough, Slurm's commands
otherwise. ``HPCORCH_SLURM_BACKEND`` (``cli`` or ``pyslurm``) forces one."""

from __future__ import annotations

import importlib
import os
from collections.abc import Mapping
from types import ModuleType

from hpcorch.errors import HpcorchError
from hpcorch.slurm.backend import SlurmBackend, SlurmCLI

BACKEND_ENV = "HPCORCH_SLURM_BACKEND"
BACKENDS = ("cli", "pyslurm")
PYSLURM_MIN = (25, 11)
"""pyslurm's version follows Slurm's; the mapping is written against pyslurm 25.11."""


def load_pyslurm() -> tuple[ModuleType | None, str]:
    """(the pyslurm module, "") if a usable pyslurm imports, else (None, why not)."""
    try:
        module = importlib.import_module("pyslurm")
    except ImportError as exc:  # not installed, or built against another libslurm
        return None, f"pyslurm cannot be imported ({exc})"
    version = str(getattr(module, "__version__", "") or "")
    parts = version.split(".")
    try:
        found = (int(parts[0]), int(parts[1]))
    except (IndexError, ValueError):
        return None, f"pyslurm reports no usable version ({version or 'none'})"
    if found < PYSLURM_MIN:
        need = ".".join(map(str, PYSLURM_MIN))
        return None, f"pyslurm {version} is older than {need}"
    return module, ""


def backend_choice(env: Mapping[str, str] | None = None) -> str:
    """ "cli", "pyslurm" or "" (automatic), from HPCORCH_SLURM_BACKEND."""
    environ = os.environ if env is None else env
    choice = environ.get(BACKEND_ENV, "").strip().lower()
    if choice not in ("", "auto", *BACKENDS):
        raise HpcorchError(
            f"{BACKEND_ENV}={choice!r} is not a Slurm backend (valid: {', '.join(BACKENDS)})"
        )
    return "" if choice == "auto" else choice


def make_backend(env: Mapping[str, str] | None = None) -> SlurmBackend:
    """The backend to use: ``PySlurmBackend`` when pyslurm (>= 25.11) imports and
    HPCORCH_SLURM_BACKEND is not ``cli``, ``SlurmCLI`` otherwise. Asking for ``pyslurm``
    when it cannot be used is an error naming why."""
    choice = backend_choice(env)
    if choice == "cli":
        return SlurmCLI()
    module, why = load_pyslurm()
    if module is None:
        if choice == "pyslurm":
            raise HpcorchError(
                f"{BACKEND_ENV}=pyslurm but {why}: install pyslurm 25.11 built against "
                f"Slurm 25.11 (pip install 'hpcorch[pyslurm]') or set {BACKEND_ENV}=cli "
                f"(valid: {', '.join(BACKENDS)})"
            )
        return SlurmCLI()
    from hpcorch.slurm.pyslurm_backend import PySlurmBackend

    return PySlurmBackend(module)


def backend_name(backend: SlurmBackend) -> str:
    """How the log names ``backend``: "pyslurm" or "Slurm's commands"."""
    return "pyslurm" if type(backend).__name__ == "PySlurmBackend" else "Slurm's commands"
