"""A node dies under a running job and stays down past SlurmdTimeout (issue 13, item 4):
Slurm requeues the job and the controller relaunches it on another node while the old
launch's ranks may still run on the dead node. The relaunch must never overlap the old
launch (every line the job writes carries its launch generation: no line of an older
generation after the first of a newer one), and the dead launch must not report success."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, Pool
from tests.integration.controller_util import (
    FAST,
    ControllerProc,
    job_dir,
    metrics_lines,
    submit,
    wait_for,
)

pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.releases]


def cleanup(pool: Pool, res: str) -> None:
    pool.run("scancel", f"--reservation={res}", check=False)
    time.sleep(1)
    pool.run("scontrol", "delete", "reservation", res, check=False)


def generations(lines: list[dict[str, Any]]) -> list[int]:
    return [int(m["launch"]) for m in lines if m.get("launch") is not None]


def test_node_down_past_timeout_never_two_launches(env_pool: Pool, tmp_path: Path) -> None:
    res = f"t-nodefail-{os.getpid()}"
    ctl = ControllerProc(
        env_pool, tmp_path / "ctl", res, "--nodes", "n3,n4", "--policy", "share", *FAST
    )
    ctl.start()
    pid = 0
    try:
        a = submit(env_pool, res, "A", 2, 2, "--epochs", "60", "--sample-delay", "0.002")
        wait_for(
            "a periodic checkpoint",
            lambda: any(m.get("event") == "checkpoint" for m in metrics_lines(env_pool, a)),
            180,
            ctl.log,
        )
        node = env_pool.squeue()[a].nodes
        pid = int((env_pool.dir / "run" / f"slurmd-{node}.pid").read_text())
        os.kill(pid, 9)  # the node dies; its job's processes live on, cut off from Slurm
        wait_for(
            "the relaunch on the other node",
            lambda: any(
                m.get("event") == "start" and m.get("launch", 0) >= 1
                for m in metrics_lines(env_pool, a)
            ),
            240,
            ctl.log,
        )
        time.sleep(15)  # the old launch would go on writing here
        lines = metrics_lines(env_pool, a)
        gens = generations(lines)
        assert gens, "metrics lines carry no launch generation"
        first_new = next(i for i, g in enumerate(gens) if g >= 1)
        late = [g for g in gens[first_new:] if g < 1]
        assert not late, f"{len(late)} lines of launch 1 after launch 2 began"
        heartbeat = json.loads((job_dir(env_pool, a) / "heartbeat").read_text())
        assert heartbeat.get("launch", 1) >= 1, heartbeat
        out = (job_dir(env_pool, a) / f"slurm-{a}.out").read_text()
        first = out.split("launch 2:")[0]
        assert "training finished" not in first, first[-2000:]
    finally:
        ctl.stop()
        subprocess.run(
            [str(REPO / "slurm" / "pool"), "up"], env=env_pool.env, check=False, capture_output=True
        )
        cleanup(env_pool, res)
        print((job_dir(env_pool, a) / f"slurm-{a}.out").read_text()[-6000:] if pid else "")
