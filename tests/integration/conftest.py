"""Fixtures of the controller's integration tests."""

from __future__ import annotations

import re
import time

import pytest

from tests.conftest import Pool


@pytest.fixture
def env_pool(slurm_pool: Pool) -> Pool:
    """The test pool, with jobs reporting every second and checkpointing every 4 s, and
    without reservations left by an earlier, interrupted run (they would overlap)."""
    env = {**slurm_pool.env, "HPCORCH_METRICS_INTERVAL": "1", "HPCORCH_CKPT_INTERVAL": "4"}
    out = slurm_pool.run("scontrol", "-o", "show", "reservation").stdout
    for name in re.findall(r"ReservationName=(t-\S+)", out):
        slurm_pool.run("scancel", f"--reservation={name}", check=False)
        time.sleep(1)
        slurm_pool.run("scontrol", "delete", "reservation", name, check=False)
    return Pool(slurm_pool.dir, env, slurm_pool.nodes, slurm_pool.gpus_per_node, slurm_pool.home)
