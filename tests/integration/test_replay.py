"""A short replay of a real workload on a real pool (issue 24): benchmarks/replay.py as it
ships, 8 jobs of a Pollux workload at time scale 0.01, submitted as two Unix users through
`hpcorch submit`, run by the production controller on its own pool, then simulated.

Every job completes; no launch the controller released waits in Slurm past the bound; and
in every cycle the GPUs Slurm shows in use on each node are those the controller counts as
held there (its meta ``gpu_view_mismatches`` stays 0). How close real and simulated come is
printed, not asserted: 8 jobs on a loaded 2-core machine are a smoke run; the 40-job replay
(benchmarks/results/replay.json) is where the targets are met.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO, pool_port_base, slurm_release
from tests.integration.users import PREFIX, can_run, install_site, world_dir

pytestmark = pytest.mark.slurm


def test_a_short_replay_completes_with_slurms_view_of_the_gpus(tmp_path: Path) -> None:
    why = can_run()
    if why:
        pytest.skip(why)
    out = tmp_path / "replay.json"
    work = world_dir("hpcorch-replay-")  # the users' homes and jobs: pytest's tmp is 0700
    install_site()  # the users' hpcorch, installed once for the session
    pool_dir = Path(os.environ.get("HPCORCH_TEST_POOL_DIR", REPO / ".run" / "test-pool"))
    argv = [
        sys.executable, str(REPO / "benchmarks" / "replay.py"), "--jobs", "8",
        "--time-scale", "0.01", "--slurm", slurm_release(),
        "--pool-dir", f"{pool_dir}-replay", "--port-base", str(pool_port_base() + 300),
        "--work", str(work), "--site", str(PREFIX), "--out", str(out),
        "--picture", str(tmp_path / "replay.png"), "--timeout", "900",
    ]  # fmt: skip
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=1200, check=False)
        log_path = work / "controller" / "controller.log"
        log = log_path.read_text() if log_path.exists() else ""
        assert res.returncode == 0, res.stderr[-3000:] + log[-3000:]
        print(res.stdout)
        doc = json.loads(out.read_text())
        real = doc["real"]
        assert doc["jobs"] == 8
        assert real["jobs_completed"] == 8, log[-3000:]
        assert real["max_wait_planned_s"] <= 120, log[-3000:]
        assert real["gpu_view_mismatches"] == 0, log[-3000:]
        assert "GPUs Slurm shows in use differ" not in log
        assert doc["sim"]["avg_jct"] > 0 and real["avg_jct"] > 0
        assert (tmp_path / "replay.png").stat().st_size > 0
    finally:
        env = {**os.environ, "HPCORCH_POOL_DIR": f"{pool_dir}-replay"}
        subprocess.run([str(REPO / "slurm" / "pool"), "down"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
