"""A small real Slurm pool (2 virtual nodes x 2 fake GPUs) for the runtime's tests."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from tests.runtime.harness import REPO


@pytest.fixture(scope="session")
def runtime_pool() -> Iterator[dict[str, str]]:
    """Env (SLURM_CONF, ...) of a running pool; its own directory and ports."""
    if shutil.which("slurmctld") is None:
        pytest.skip("Slurm is not installed (slurm/pool install)")
    env = dict(os.environ)
    env["HPCORCH_POOL_DIR"] = os.environ.get(
        "HPCORCH_RUNTIME_POOL_DIR", str(REPO / ".run" / "pool-runtime-tests")
    )
    port = os.environ.get("HPCORCH_RUNTIME_POOL_PORT", "17300")
    pool = str(REPO / "slurm" / "pool")
    up = [pool, "up", "--nodes", "2", "--gpus-per-node", "2", "--cpus-per-node", "4"]
    subprocess.run([*up, "--port-base", port], env=env, check=True, capture_output=True)
    out = subprocess.run([pool, "env"], env=env, check=True, capture_output=True, text=True)
    pool_env = {}
    for line in out.stdout.splitlines():
        key, _, value = line.removeprefix("export ").partition("=")
        pool_env[key] = shlex.split(value)[0]
    try:
        yield pool_env
    finally:
        subprocess.run([pool, "down"], env=env, check=False, capture_output=True)
