"""The controller when things go wrong: killed mid-resize, a node dies, 500 jobs, bad input."""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import REPO, Pool
from tests.integration.controller_util import (
    FAST,
    ControllerProc,
    losses,
    metrics_lines,
    submit,
    wait_for,
    wait_for_phase,
)
from tests.integration.users import PYTHON, can_run, ensure_user, install_site

pytestmark = pytest.mark.slurm


def cleanup(pool: Pool, res: str) -> None:
    pool.run("scancel", f"--reservation={res}", check=False)
    time.sleep(1)
    pool.run("scontrol", "delete", "reservation", res, check=False)


def events(pool: Pool, job: int, kind: str) -> list[dict[str, Any]]:
    return [m for m in metrics_lines(pool, job) if m.get("event") == kind]


def assert_resumed_exactly(pool: Pool, job: int) -> None:
    """Every launch after the first resumed at the step of the latest checkpoint before it,
    and started only after that checkpoint was written (never two launches at once)."""
    lines = metrics_lines(pool, job)
    last_ckpt: dict[str, Any] | None = None
    launches = 0
    for m in lines:
        if m.get("event") == "checkpoint":
            last_ckpt = m
        elif m.get("event") == "start":
            launches += 1
            if launches > 1:
                assert last_ckpt is not None, "relaunched without a checkpoint"
                assert m["resumed"] and m["step"] == last_ckpt["step"], (m, last_ckpt)
                assert m["time"] >= last_ckpt["written_time"]
    assert launches >= 2


def test_controller_killed_mid_resize(env_pool: Pool, tmp_path: Path) -> None:
    res = f"t-kill-{os.getpid()}"
    ctl = ControllerProc(
        env_pool, tmp_path / "ctl", res, "--nodes", "n2", "--policy", "share", *FAST
    )
    ctl.start()
    try:
        a = submit(env_pool, res, "A", 1, 4, "--epochs", "30", "--sample-delay", "0.002")
        wait_for("A started", lambda: any(m for m in events(env_pool, a, "start")), 120, ctl.log)
        b = submit(env_pool, res, "B", 2, 2, "--epochs", "6", "--sample-delay", "0.002")
        wait_for(
            "the resize decision",
            lambda: any(d.slurm_id == a and d.action == "signal" for d in ctl.decisions()),
            120,
            ctl.log,
        )
        ctl.kill9()
        time.sleep(3)
        ctl.start()  # a new controller on the same state
        for job in (a, b):
            # A's 960 steps on 4 gloo ranks: it reached step 931 of them in 400 s in CI
            wait_for_phase(ctl, job, "done", 900)
        assert_resumed_exactly(env_pool, a)
        assert losses(env_pool, a)[-1] < losses(env_pool, a)[0]
        starts = [d for d in ctl.decisions() if d.slurm_id == a and d.action == "start"]
        # first start, the relaunch at 2 after the resize, the grow-back after B: no extra
        assert len(starts) <= 3, starts
        assert ctl.stop() == 0
    finally:
        ctl.stop()
        cleanup(env_pool, res)


def test_slurmd_killed_under_a_running_job(env_pool: Pool, tmp_path: Path) -> None:
    res = f"t-node-{os.getpid()}"
    ctl = ControllerProc(
        env_pool, tmp_path / "ctl", res, "--nodes", "n3,n4", "--policy", "share", *FAST
    )
    ctl.start()
    try:
        a = submit(env_pool, res, "A", 2, 2, "--epochs", "40", "--sample-delay", "0.002")
        wait_for(
            "a periodic checkpoint", lambda: bool(events(env_pool, a, "checkpoint")), 180, ctl.log
        )
        node = env_pool.squeue()[a].nodes
        pid = int((env_pool.dir / "run" / f"slurmd-{node}.pid").read_text())
        os.kill(pid, 9)
        wait_for(
            "Slurm to requeue the job",
            lambda: env_pool.squeue()[a].restarts >= 1,
            120,
            ctl.log,
        )
        subprocess.run(
            [str(REPO / "slurm" / "pool"), "up"], env=env_pool.env, check=True, capture_output=True
        )  # the node comes back
        wait_for_phase(ctl, a, "done", 400)
        assert_resumed_exactly(env_pool, a)
        assert "requeued: by Slurm" in ctl.log.read_text()
        assert ctl.stop() == 0
    finally:
        ctl.stop()
        subprocess.run(
            [str(REPO / "slurm" / "pool"), "up"], env=env_pool.env, check=False, capture_output=True
        )
        cleanup(env_pool, res)


def test_500_jobs_cycle_stays_bounded(env_pool: Pool, tmp_path: Path) -> None:
    res = f"t-many-{os.getpid()}"
    env_pool.run(
        "scontrol",
        "create",
        "reservation",
        f"ReservationName={res}",
        "Nodes=n1,n2",
        "Users=root",
        "StartTime=now",
        "Duration=infinite",
        "Flags=IGNORE_JOBS",
    )
    script = tmp_path / "sleeper.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    script.chmod(0o755)
    try:
        t0 = time.perf_counter()
        for i in range(10):
            env_pool.hpcorch(
                "submit",
                "--pool",
                res,
                "--min-gpus",
                "1",
                "--max-gpus",
                "2",
                "--name",
                f"s{i}",
                "--parsable",
                str(script),
            )
        per_submit = (time.perf_counter() - t0) / 10
        text = env_pool.hpcorch(
            "submit", "--pool", res, "--min-gpus", "1", "--max-gpus", "2", "--dry-run", str(script)
        ).stdout
        for _ in range(490):
            env_pool.run("sbatch", "--parsable", input=text)
        state = tmp_path / "ctl"
        ctl_args = ("controller", "--reservation", res, "--state-dir", str(state), "--once")
        for _ in range(2):
            env_pool.hpcorch(*ctl_args)
        ctl = ControllerProc(env_pool, state, res)
        store = ctl.store()
        cycles = list(reversed(store.recent_cycles(2)))
        assert [c["jobs"] for c in cycles] == [500, 500]
        decisions = store.decisions()
        assert any(d.action == "start" for d in decisions)
        # GPUs granted at once never pass the pool's 2 nodes x 4 GPUs. (ONES may take back
        # a start in the second cycle and give the GPUs to another job: a start, then a
        # hold or requeue of the same job.)
        held: dict[int, int] = {}
        for d in decisions:
            if d.action == "start" and d.status == "done":
                held[d.slurm_id] = d.to_gpus
            elif d.action in ("hold", "requeue_hold", "signal"):
                held.pop(d.slurm_id, None)
            assert sum(held.values()) <= 8, [(x.slurm_id, x.action, x.to_gpus) for x in decisions]
        # Slurm calls: squeue + sinfo (+ the reservation, first cycle) + 3 per start + at
        # most 8 user holds made the controller's own; none per job
        assert cycles[0]["slurm_calls"] <= 4 + 3 * 8 + 8
        assert cycles[1]["slurm_calls"] <= 2 + 3 * 8
        print(
            f"\n500 jobs: submit {per_submit * 1000:.0f} ms/job (CLI), cycles "
            f"{[round(c['seconds'], 2) for c in cycles]} s, decision "
            f"{[round(c['decision_s'] * 1000) for c in cycles]} ms, Slurm calls "
            f"{[c['slurm_calls'] for c in cycles]}"
        )
        assert per_submit < 5.0
    finally:
        cleanup(env_pool, res)


def test_bad_input_is_one_clear_error(env_pool: Pool, tmp_path: Path) -> None:
    from tests.conftest import EXAMPLE

    before = set(env_pool.squeue())
    r = env_pool.hpcorch(
        "submit", "--pool", "nosuchpool", "--min-gpus", "1", str(EXAMPLE), check=False
    )
    assert r.returncode == 1
    assert re.fullmatch(r"Error: pool 'nosuchpool' does not exist \(valid: .*\)", r.stderr.strip())
    assert not set(env_pool.squeue()) - before  # nothing submitted (earlier jobs may end)

    state = tmp_path / "ctl"
    state.mkdir()
    db = state / "state.db"
    db.write_bytes(b"garbage" * 1000)
    digest = hashlib.sha256(db.read_bytes()).hexdigest()
    r = env_pool.hpcorch(
        "controller", "--reservation", "t-bad", "--state-dir", str(state), "--once", check=False
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "is unreadable or corrupt" in r.stderr.strip().splitlines()[-1]
    assert hashlib.sha256(db.read_bytes()).hexdigest() == digest


def test_second_controller_on_one_state_dir_is_refused(env_pool: Pool, tmp_path: Path) -> None:
    res = f"t-lock-{os.getpid()}"
    ctl = ControllerProc(env_pool, tmp_path / "ctl", res, "--nodes", "n1", *FAST)
    ctl.start()
    try:
        r = env_pool.hpcorch(
            "controller", "--reservation", res, "--state-dir", str(ctl.state), "--once", check=False
        )
        assert r.returncode == 1
        assert r.stderr.strip().startswith(f"Error: another controller already runs on {ctl.state}")
    finally:
        ctl.stop()
        cleanup(env_pool, res)


def _second_user() -> str | None:
    """A non-root user that runs hpcorch as the site installs it (slurm/install-site)."""
    if can_run():
        return None
    ensure_user("hpcorch-test")
    install_site()
    return "hpcorch-test"


def test_a_user_cannot_resize_another_users_job(env_pool: Pool) -> None:
    name = _second_user()
    if name is None:
        pytest.skip("needs root to act as a second user")
    from tests.conftest import EXAMPLE

    out = env_pool.hpcorch(
        "submit", "--min-gpus", "1", "--max-gpus", "2", "--parsable", str(EXAMPLE),
        "--epochs", "1000",
    )  # fmt: skip
    job = int(out.stdout.strip())
    try:
        env = {k: v for k, v in env_pool.env.items() if k != "PYTHONPATH"}
        r = subprocess.run(
            [
                "runuser",
                "-u",
                name,
                "--",
                PYTHON,
                "-m",
                "hpcorch",
                "resize",
                str(job),
                "--gpus",
                "2",
            ],
            env=env,
            capture_output=True,
            text=True,
            cwd="/tmp",
        )
        assert r.returncode == 1, r.stderr
        assert "Traceback" not in r.stderr
        assert r.stderr.startswith(f"Error: job {job} is not yours: Slurm refused the change"), (
            r.stderr
        )
        assert "pin=" not in env_pool.squeue()[job].comment
        # the owner (here root, who is also the admin) can
        env_pool.hpcorch("resize", str(job), "--gpus", "2")
        assert "pin=2" in env_pool.squeue()[job].comment
    finally:
        env_pool.run("scancel", str(job), check=False)
