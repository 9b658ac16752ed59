"""The integrations speak the runtime's protocol (hpcorch/protocol.py) exactly: each line
they write is one the controller takes (its own validators and digest), the plan's batch
is the one trained, the checkpoint signal ends a launch with a checkpoint in the library's
own format and EXIT_RELAUNCH (quiet: 0 with the heartbeat saying so), and the next launch
resumes from it to the ``done`` report. One rank of the real library on CPU, nothing
downloaded."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hpcorch.controller.reports import digest
from hpcorch.controller.rows import JobRecord
from hpcorch.controller.validate import steps_line
from hpcorch.integrations.core import STATE_FORMAT, STATE_VERSION
from hpcorch.planner import LaunchPlan, plan_batch, write_plan
from hpcorch.protocol import (
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_LAUNCH,
    ENV_PLAN,
    ENV_QUIET_RELAUNCH,
    EXIT_DONE,
    EXIT_RELAUNCH,
    HEARTBEAT_FILE,
    METRICS_FILE,
)
from tests.runtime.harness import free_port

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
PLAN = LaunchPlan(global_batch=24, gpus=1, max_micro_batch=8, job="j1", launch=0)
"""24 = 8 x 3 x 1: the plan's batch needs accumulation on one rank."""


def start(script: str, jd: Path, launch: int, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCORCH_"))}
    env.update(
        RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), PYTHONPATH=str(REPO),
        OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", HPCORCH_METRICS_INTERVAL="0",
        # srun's variables: Lightning resumes from its hpc_ckpt under Slurm
        SLURM_NTASKS="1", SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_NODEID="0",
        SLURM_NTASKS_PER_NODE="1", SLURM_JOB_NAME="t", SLURM_NODELIST="localhost",
    )  # fmt: skip
    env.update({ENV_JOB_DIR: str(jd), ENV_JOB_ID: "j1", ENV_PLAN: str(jd / "plan.json")})
    env.update({ENV_LAUNCH: str(launch), ENV_QUIET_RELAUNCH: "1"})
    return subprocess.Popen(
        [sys.executable, str(REPO / "examples" / script), *args],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip


def lines(jd: Path) -> list[dict[str, Any]]:
    path = jd / METRICS_FILE
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def stop_after(proc: subprocess.Popen[str], jd: Path, step: int, timeout: float = 240) -> int:
    end = time.monotonic() + timeout
    while not any(m["event"] == "steps" and m["step"] >= step for m in lines(jd)):
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert time.monotonic() < end, "no steps"
        time.sleep(0.1)
    proc.send_signal(signal.SIGUSR2)
    return proc.wait(120)


def controller_takes(jd: Path, launch: int) -> None:
    """Every line of ``launch`` is one the controller digests; its steps lines give
    throughput samples at the plan's split."""
    rec = JobRecord(1, "j1", "n", "u", str(jd), "a", 1, 4, 24, 96, 8, 0.0, "running", 0.0)
    rec.gpus, rec.nodes, rec.slurm_restarts = 1, 1, launch
    samples = []
    said: list[str] = []
    for m in lines(jd):
        if m.get("launch") != launch:
            continue
        got = digest(rec, m, said.append)
        if m["event"] == "steps":
            s = steps_line(m)
            assert s is not None and got is not None, m
            assert (s.global_batch, s.micro_batch, s.accum_steps, s.gpus) == (24, 8, 3, 1)
            assert s.samples_per_s > 0 and s.loss is not None and s.cpus_per_gpu
            samples.append(got)
    assert not said, said  # nothing dropped
    assert rec.ready == 1 and rec.epochs == 2 and rec.fingerprint
    assert samples


@pytest.mark.parametrize(
    ("script", "args"),
    [
        ("train_transformers.py", ("--output-dir", "{jd}/out")),
        ("train_lightning_elastic.py", ("--root-dir", "{jd}/out")),
    ],
)
def test_protocol_lines_checkpoint_and_resume(
    tmp_path: Path, script: str, args: tuple[str, ...]
) -> None:
    jd = tmp_path / "job"
    jd.mkdir()
    write_plan(jd / "plan.json", PLAN)
    argv = [a.format(jd=jd) for a in args]
    argv += ["--samples", "96", "--epochs", "2", "--sample-delay", "0.01"]
    assert plan_batch(24, 1, 8).describe() == "24 = 8 x 3 x 1"

    # launch 1: trains at the plan's batch; the signal: a checkpoint, exit 75 said quietly
    assert stop_after(start(script, jd, 0, *argv), jd, 2) == EXIT_DONE  # quiet relaunch
    beat = json.loads((jd / HEARTBEAT_FILE).read_text())
    assert beat["state"] == f"exit {EXIT_RELAUNCH}" and beat["launch"] == 0
    first = [m for m in lines(jd) if m.get("launch") == 0]
    assert first[0]["event"] == "start" and first[-1]["event"] == "exit"
    assert first[-1]["code"] == EXIT_RELAUNCH
    (ck,) = [m for m in first if m["event"] == "checkpoint"]
    assert ck["reason"] == "signal" and Path(ck["path"]).exists() and ck["bytes"] > 0
    last_step = [m for m in first if m["event"] == "steps"][-1]["step"]
    assert ck["step"] == first[-1]["step"] == last_step
    controller_takes(jd, 0)

    # launch 2: resumes from that checkpoint (the library's own) and finishes
    proc = start(script, jd, 1, *argv)
    assert proc.wait(300) == EXIT_DONE, proc.stderr.read() if proc.stderr else ""
    second = [m for m in lines(jd) if m.get("launch") == 1]
    begin = second[0]
    assert begin["event"] == "start" and begin["resumed"] is True
    assert begin["step"] == ck["step"] and begin["global_batch"] == 24
    assert second[-1]["event"] == "done"
    assert json.loads((jd / HEARTBEAT_FILE).read_text())["state"] == "done"
    steps = [m for m in lines(jd) if m["event"] == "steps"]
    assert [m["step"] for m in steps] == list(range(1, len(steps) + 1))  # none repeated
    assert len(steps) == 8  # 2 epochs of 96 at 24: no step lost or added by the restart
    controller_takes(jd, 1)
    if script == "train_transformers.py":
        state_files = list((jd / "out").glob("checkpoint-*/hpcorch-state.json"))
        state = json.loads(max(state_files, key=lambda p: p.stat().st_mtime).read_text())
        assert (state["format"], state["version"]) == (STATE_FORMAT, STATE_VERSION)
        assert state["job"] == "j1"
        assert (state["epoch"], state["offset"], state["global_step"]) == (2, 0, 8)
