"""The runtime's integration tests run on the project's shared test pool (tests/conftest.py)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def runtime_pool(slurm_pool: Any) -> dict[str, str]:
    """Just what reaches the pool (its slurm.conf; the PATH and library path of the Slurm
    release it runs): the runtime tests build the rest of each job's env."""
    keys = ("SLURM_CONF", "HPCORCH_POOL_DIR", "PATH", "LD_LIBRARY_PATH")
    return {k: slurm_pool.env[k] for k in keys if k in slurm_pool.env}
