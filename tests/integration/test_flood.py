"""A job that floods its metrics file, on the real pool: the controller's store and memory
stay bounded, its cycles go on, and another job is still scheduled.

The flood is a script that writes ``steps`` lines itself, as fast as it can, not through
the runtime (whose lines come at most one per interval): the controller's bounds must
hold whatever a job writes. Its lines spread over hundreds of configurations, epochs and
batch sizes, so that no per-configuration window alone bounds them.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcorch.controller.thinning import KEEP_FINISHED, MAX_SAMPLES_PER_JOB
from tests.conftest import Pool
from tests.integration.controller_util import (
    FAST,
    ControllerProc,
    job_dir,
    submit,
    wait_for,
    wait_for_phase,
)

pytestmark = pytest.mark.slurm

FLOOD_S = 60.0
RSS_GROWTH_MB = 30.0

FLOOD = """#!{python}
# rank 0 appends steps lines to the job's metrics file as fast as it can for argv[1] s
import json, os, sys, time
if os.environ.get("RANK", "0") != "0":
    sys.exit(0)
jd = os.environ["HPCORCH_JOB_DIR"]
end = time.time() + float(sys.argv[1])
n = 0
with open(os.path.join(jd, "metrics.jsonl"), "a") as f:
    f.write(json.dumps({{"time": time.time(), "event": "start", "epochs": 1000}}) + "\\n")
    while time.time() < end:
        now = time.time()
        chunk = []
        for _ in range(1000):
            n += 1
            chunk.append(json.dumps({{
                "time": now, "event": "steps", "step": n, "step_time": 0.01 + n % 7 / 1000,
                "samples_per_s": 3200.0, "gpus": 1, "global_batch": 32 * (1 + n % 3),
                "per_gpu_batch": 1 + n % 300, "accum_steps": 1 + n % 2, "epoch": n // 5000,
                "loss": 1.0 / n, "noise_scale": 100.0 + n % 50,
            }}))
        f.write("\\n".join(chunk) + "\\n")
with open(os.path.join(jd, "flood-lines"), "w") as f:
    f.write(str(n))
"""


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for {pid}")


def _query(db: Path, sql: str, *args: object) -> int:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
    try:
        return int(con.execute(sql, args).fetchone()[0] or 0)
    finally:
        con.close()


def test_a_flooding_job_keeps_the_controller_bounded(env_pool: Pool, tmp_path: Path) -> None:
    res = f"t-flood-{os.getpid()}"
    ctl = ControllerProc(
        env_pool, tmp_path / "ctl", res, "--nodes", "n1", "--policy", "share", *FAST
    )
    db = ctl.state / "state.db"
    script = tmp_path / "flood.py"
    script.write_text(FLOOD.format(python=sys.executable))
    script.chmod(0o755)
    flood = 0
    ctl.start()
    assert ctl.proc is not None
    pid = ctl.proc.pid
    try:
        flood = int(
            env_pool.hpcorch(
                "submit", "--pool", res, "--name", "flood", "--mode", "managed",
                "--min-gpus", "1", "--max-gpus", "1", "--batch-size", "32", "--parsable",
                str(script), str(FLOOD_S),
            ).stdout.strip()
        )  # fmt: skip
        rows = f"SELECT COUNT(*) FROM samples WHERE slurm_id={flood}"
        cycles = "SELECT MAX(id) FROM cycles"
        wait_for("the flood's first samples", lambda: _query(db, rows) > 0, 120, ctl.log)
        t0, rss0, cycles0 = time.time(), _rss_mb(pid), _query(db, cycles)
        other = submit(env_pool, res, "other", 1, 1, "--epochs", "2", "--sample-delay", "0.002")
        most, rss_max, other_ran = 0, rss0, False
        while env_pool.state(flood) in ("RUNNING", "PENDING", "CONFIGURING", "COMPLETING"):
            most = max(most, _query(db, rows))
            rss_max = max(rss_max, _rss_mb(pid))
            other_ran = other_ran or ctl.phase(other) in ("running", "done")
            assert time.time() - t0 < FLOOD_S + 120, "the flood job did not end"
            time.sleep(1)
        flood_s = time.time() - t0
        cycles_run = _query(db, cycles) - cycles0
        rss1 = _rss_mb(pid)
        wait_for_phase(ctl, flood, "done", 60)
        deadline = time.time() + 30  # pruned at the next round (every 2 s here)
        while _query(db, rows) > KEEP_FINISHED and time.time() < deadline:
            time.sleep(1)
        after = _query(db, rows)
        wait_for_phase(ctl, other, "done", 300)
        jd = job_dir(env_pool, flood)
        written = int((jd / "flood-lines").read_text())
        size = (jd / "metrics.jsonl").stat().st_size
        print(
            f"\nflood: {written} steps lines ({size / 2**20:.0f} MiB) in {FLOOD_S:.0f} s; "
            f"samples rows at most {most} while it ran (bound {MAX_SAMPLES_PER_JOB}), {after} "
            f"after it ended (bound {KEEP_FINISHED}); controller RSS {rss0:.1f} MB -> "
            f"{rss1:.1f} MB (max {rss_max:.1f}); {cycles_run} cycles in {flood_s:.0f} s; "
            f"the other job ran during the flood: {other_ran}"
        )
        assert written > 100 * MAX_SAMPLES_PER_JOB  # a real flood
        assert most <= MAX_SAMPLES_PER_JOB
        assert after <= KEEP_FINISHED
        assert rss_max - rss0 < RSS_GROWTH_MB
        assert cycles_run >= flood_s / 4  # interval 1 s: the loop never stalls for long
        assert other_ran
        log = ctl.log.read_text()
        assert "Traceback" not in log
        assert "invalid plan" not in log  # the flood's reports never void a round
        assert ctl.stop() == 0
    finally:
        ctl.stop()
        subprocess.run(["scancel", f"--reservation={res}"], env=env_pool.env, check=False)
        time.sleep(1)
        subprocess.run(["scontrol", "delete", "reservation", res], env=env_pool.env, check=False)
        if flood:
            (job_dir(env_pool, flood) / "metrics.jsonl").unlink(missing_ok=True)
