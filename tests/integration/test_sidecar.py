"""Sidecar mode on the real local pool: scripts that know nothing of hpcorch, resized by the
controller through their own checkpoints and signal conventions."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hpcorch.controller.store import JobRecord
from tests.conftest import REPO, Pool
from tests.integration.controller_util import (
    FAST,
    ControllerProc,
    job_dir,
    metrics_lines,
    wait_for,
    wait_for_phase,
)

pytestmark = pytest.mark.slurm

PLAIN = REPO / "examples" / "train_plain.py"
LIGHTNING = REPO / "examples" / "train_lightning_style.py"
ELASTIC = REPO / "examples" / "train_elastic.py"
STEP_RE = r"step (\d+)/(\d+)"


@pytest.fixture
def ctl(env_pool: Pool, tmp_path: Path) -> Iterator[ControllerProc]:
    res = f"t-side-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    # --restart-cost 2: a launch may be resized 4 s after its start (min-run), not 30 s
    # (the default cost): on an idle machine these jobs train for 15-25 s in all
    proc = ControllerProc(
        env_pool, tmp_path / "ctl", res, "--nodes", "n1", "--policy", "share",
        "--restart-cost", "2", *FAST,
    )  # fmt: skip
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()
        env_pool.run("scancel", f"--reservation={res}", check=False)
        time.sleep(1)
        env_pool.run("scontrol", "delete", "reservation", res, check=False)


def submit(pool: Pool, ctl: ControllerProc, script: Path, *args: str) -> int:
    """``args``: hpcorch's options, then ``--`` and the script's arguments."""
    ours = args[: args.index("--")] if "--" in args else args
    theirs = args[args.index("--") + 1 :] if "--" in args else ()
    out = pool.hpcorch(
        "submit", "--pool", ctl.reservation, "--parsable", "--max-gpus", "4", *ours,
        str(script), *theirs,
    )  # fmt: skip
    return int(out.stdout.strip())


def record(ctl: ControllerProc, job: int) -> JobRecord | None:
    if not (ctl.state / "state.db").exists():
        return None
    store = ctl.store()
    try:
        return store.job(job)
    finally:
        store.close()


def running_at(ctl: ControllerProc, job: int, gpus: int) -> bool:
    rec = record(ctl, job)
    return rec is not None and rec.phase == "running" and rec.gpus == gpus


def events(pool: Pool, job: int, kind: str) -> list[dict[str, Any]]:
    return [m for m in metrics_lines(pool, job) if m.get("event") == kind]


def progressing(pool: Pool, ctl: ControllerProc, job: int, past_step: int = 0) -> bool:
    """The current launch reports steps beyond ``past_step``."""
    rec = record(ctl, job)
    if rec is None or rec.phase != "running":
        return False
    launch = max((m.get("launch", 0) for m in events(pool, job, "launch")), default=-1)
    return any(
        m.get("launch") == launch and m.get("step", 0) > past_step
        for m in events(pool, job, "steps")
    )


def pin(pool: Pool, job: int, gpus: int) -> None:
    pool.hpcorch("resize", str(job), "--gpus", str(gpus))


def resizes(ctl: ControllerProc, job: int) -> list[tuple[int, int]]:
    return [
        (d.from_gpus, d.to_gpus)
        for d in ctl.decisions()
        if d.slurm_id == job and d.action == "signal" and d.detail.startswith("resize")
    ]


def output(pool: Pool, job: int) -> str:
    return "".join(p.read_text() for p in job_dir(pool, job).glob("slurm-*.out"))


def test_plain_script_resized_2_4_2(env_pool: Pool, ctl: ControllerProc, tmp_path: Path) -> None:
    """An unmodified torchrun-style script with its own checkpoints and `--resume`: the
    controller grows it 2 -> 4 and shrinks it 4 -> 2; every relaunch resumes where it
    stopped and the script trains to the end."""
    ck = tmp_path / "ck"
    job = submit(
        env_pool, ctl, PLAIN, "--min-gpus", "2", "--ckpt-dir", str(ck),
        "--resume-arg", "--resume {ckpt}", "--progress-regex", STEP_RE,
        "--", "--ckpt-dir", str(ck), "--steps", "1200", "--step-delay", "0.02",
    )  # fmt: skip
    pin(env_pool, job, 2)
    wait_for("the job at 2 GPUs", lambda: running_at(ctl, job, 2), 120, ctl.log)
    wait_for("progress at 2", lambda: progressing(env_pool, ctl, job), 90, ctl.log)
    pin(env_pool, job, 4)
    wait_for("the job grown to 4", lambda: running_at(ctl, job, 4), 120, ctl.log)
    wait_for("progress at 4", lambda: progressing(env_pool, ctl, job), 90, ctl.log)
    pin(env_pool, job, 2)
    wait_for("the job shrunk to 2", lambda: (4, 2) in resizes(ctl, job), 60, ctl.log)
    wait_for_phase(ctl, job, "done", 400)

    moves = resizes(ctl, job)
    assert (2, 4) in moves and moves.index((2, 4)) < len(moves) - 1 - moves[::-1].index((4, 2))
    out = output(env_pool, job)
    assert "step 1200/1200" in out and "--resume" in out
    # every stop was graceful and every relaunch resumed exactly where it stopped
    assert all(s["graceful"] for s in events(env_pool, job, "stop"))
    resumed = events(env_pool, job, "resumed")
    assert len(resumed) == len(moves) and all(r["lost_steps"] == 0 for r in resumed)
    worlds = {int(w) for w in re.findall(r"world (\d+)", out)}
    assert worlds == {2, 4}
    losses = [float(x) for x in re.findall(r"loss ([\d.]+)", out)]
    assert sum(losses[-20:]) < sum(losses[:20])
    rec = record(ctl, job)
    assert rec is not None and rec.mode == "sidecar" and rec.lost_steps == 0
    status = json.loads(env_pool.hpcorch("status", "--json").stdout)
    assert any(j["job_id"] == job and j["mode"] == "sidecar" for j in status["jobs"])


def test_lightning_style_script(env_pool: Pool, ctl: ControllerProc, tmp_path: Path) -> None:
    """A script that on SIGUSR1 saves hpc_ckpt_N.ckpt and requeues its own job (Lightning's
    Slurm convention), with progress in a JSON-lines file: the sidecar turns its requeue
    into a controller relaunch at the new size, and it resumes from its hpc checkpoint."""
    root = tmp_path / "root"
    job = submit(
        env_pool, ctl, LIGHTNING, "--min-gpus", "2", "--stop-signal", "USR1",
        "--ckpt-dir", str(root), "--progress-file", str(root / "progress.jsonl"),
        "--", "--root-dir", str(root), "--max-steps", "700", "--step-delay", "0.02",
    )  # fmt: skip
    wait_for("the job at 4 GPUs", lambda: running_at(ctl, job, 4), 120, ctl.log)
    wait_for("progress", lambda: progressing(env_pool, ctl, job, 20), 90, ctl.log)
    pin(env_pool, job, 2)
    wait_for("the job at 2", lambda: running_at(ctl, job, 2), 120, ctl.log)
    wait_for_phase(ctl, job, "done", 400)

    assert (root / "hpc_ckpt_1.ckpt").exists()
    out = output(env_pool, job)
    assert "SIGUSR1: saved hpc_ckpt_1.ckpt" in out
    # the script's own `scontrol requeue` went to the controller, not to Slurm
    assert (job_dir(env_pool, job) / "requeue-requested").exists() or "requeueing" in out
    rec = record(ctl, job)
    assert rec is not None and rec.slurm_restarts == rec.launches - 1
    steps = [json.loads(x)["step"] for x in (root / "progress.jsonl").read_text().splitlines()]
    assert steps[-1] == 700
    resumed = events(env_pool, job, "resumed")
    assert resumed and 0 <= resumed[0]["lost_steps"] <= 5  # one logging interval at most


def test_script_ignoring_the_stop_is_killed_and_resumes(
    env_pool: Pool, ctl: ControllerProc, tmp_path: Path
) -> None:
    """A script that ignores SIGTERM is killed after the grace period; it restarts from its
    last periodic checkpoint and the steps done again are reported."""
    ck = tmp_path / "ck"
    job = submit(
        env_pool, ctl, PLAIN, "--min-gpus", "2", "--grace", "3", "--ckpt-dir", str(ck),
        "--resume-arg", "--resume {ckpt}", "--progress-regex", STEP_RE,
        "--", "--ckpt-dir", str(ck), "--steps", "500", "--ckpt-every", "40",
        "--ckpt-until", "40", "--step-delay", "0.02", "--ignore-signals",
    )  # fmt: skip
    wait_for("the job at 4 GPUs", lambda: running_at(ctl, job, 4), 120, ctl.log)
    # one checkpoint (step 40), then steps that only that checkpoint can restart
    wait_for("steps past it", lambda: progressing(env_pool, ctl, job, 50), 120, ctl.log)
    pin(env_pool, job, 2)
    wait_for("the job at 2", lambda: running_at(ctl, job, 2), 120, ctl.log)
    wait_for_phase(ctl, job, "done", 400)

    stop = events(env_pool, job, "stop")
    assert stop and stop[0]["graceful"] is False and stop[0]["waited_s"] >= 3
    resumed = events(env_pool, job, "resumed")
    assert resumed and resumed[0]["lost_steps"] > 0
    rec = record(ctl, job)
    assert rec is not None and rec.kills == 1 and rec.lost_steps == resumed[0]["lost_steps"]
    described = env_pool.hpcorch("describe", str(job), "--state-dir", str(ctl.state)).stdout
    assert f"steps lost to stops {rec.lost_steps}" in described
    assert "killed after the grace 1" in described
    assert "did not exit within 3 s" in output(env_pool, job)


def test_script_without_checkpoints_is_never_resized(
    env_pool: Pool, ctl: ControllerProc, tmp_path: Path
) -> None:
    """With no checkpoint configured the job keeps its GPUs, and says why; with no progress
    source it is started at the GPUs it asked for (least attained service)."""
    own = str(tmp_path / "own")  # the script saves here, but hpcorch was not told
    job = submit(
        env_pool, ctl, PLAIN, "--min-gpus", "2", "--", "--ckpt-dir", own, "--steps", "99999"
    )
    wait_for("the job at 2 GPUs", lambda: running_at(ctl, job, 2), 120, ctl.log)
    rec = record(ctl, job)
    assert rec is not None and not rec.predictable and not rec.resumable
    pin(env_pool, job, 4)
    time.sleep(8)  # several scheduling rounds
    assert running_at(ctl, job, 2) and resizes(ctl, job) == []
    rec = record(ctl, job)
    assert rec is not None and rec.reason.startswith("not resizable: its script keeps no")
    env_pool.run("scancel", str(job))


def test_runtime_script_is_detected_at_launch(env_pool: Pool, ctl: ControllerProc) -> None:
    """A script submitted as sidecar that uses the runtime after all is found at its first
    launch; from then on it is modelled and resized through the runtime's own checkpoint."""
    job = submit(
        env_pool, ctl, ELASTIC, "--min-gpus", "2", "--mode", "sidecar", "--batch-size", "64",
        "--", "--global-batch", "64", "--samples", "2048", "--epochs", "40",
        "--sample-delay", "0.002",
    )  # fmt: skip
    wait_for(
        "the runtime found",
        lambda: (r := record(ctl, job)) is not None and bool(r.mode_detected),
        120,
        ctl.log,
    )
    wait_for("the job grown to 4", lambda: running_at(ctl, job, 4), 120, ctl.log)
    described = env_pool.hpcorch("describe", str(job), "--state-dir", str(ctl.state)).stdout
    assert "mode managed (detected at launch)" in described
    status = env_pool.hpcorch("status", "--json", "--state-dir", str(ctl.state)).stdout
    assert any(
        j["job_id"] == job and j["mode"] == "managed (detected)" for j in json.loads(status)["jobs"]
    )
    pin(env_pool, job, 2)
    wait_for("the job at 2", lambda: running_at(ctl, job, 2), 120, ctl.log)
    wait_for_phase(ctl, job, "done", 400)
    starts = events(env_pool, job, "start")
    ckpts = {c["step"] for c in events(env_pool, job, "checkpoint") if "source" not in c}
    assert len(starts) >= 3 and all(s["resumed"] and s["step"] in ckpts for s in starts[1:])


def test_standalone_sidecar_requeues_itself(env_pool: Pool, tmp_path: Path) -> None:
    """Without a controller, the checkpoint signal (as at the time limit) stops the script,
    the job requeues itself and resumes from the script's checkpoint."""
    ck = tmp_path / "ck"
    out = env_pool.hpcorch(
        "submit", "--min-gpus", "2", "--parsable", "--ckpt-dir", str(ck),
        "--resume-arg", "--resume {ckpt}",
        str(PLAIN), "--ckpt-dir", str(ck), "--steps", "400", "--step-delay", "0.02",
    )  # fmt: skip
    job = int(out.stdout.strip())
    wait_for("the script stepping", lambda: "step 20/400" in _out_or_empty(env_pool, job), 120)
    env_pool.run("scancel", "--signal=USR2", "-b", str(job))
    env_pool.wait_state(job, {"COMPLETED"}, 300)
    text = output(env_pool, job)
    assert "requeueing job" in text and "(resuming from ckpt-" in text
    assert "step 400/400" in text


def _out_or_empty(pool: Pool, job: int) -> str:
    try:
        return output(pool, job)
    except AssertionError:
        return ""


def test_wrapper_runs_plain_scripts_under_the_sidecar(env_pool: Pool) -> None:
    """The batch script of a plain script names sidecar mode; a runtime script's does not."""
    plain = env_pool.hpcorch("submit", "--min-gpus", "1", "--dry-run", str(PLAIN)).stdout
    managed = env_pool.hpcorch("submit", "--min-gpus", "1", "--dry-run", str(ELASTIC)).stdout
    assert "export HPCORCH_MODE=sidecar" in plain and "resume=no" in plain
    assert "HPCORCH_MODE" not in managed
