"""The controller on the real local pool: grow and shrink real DDP jobs through Slurm."""

from __future__ import annotations

import os
import re
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import Pool
from tests.integration.controller_util import (
    FAST,
    ControllerProc,
    losses,
    metrics_lines,
    submit,
    wait_for,
    wait_for_phase,
)

pytestmark = [pytest.mark.slurm, pytest.mark.releases]


def resizes(ctl: ControllerProc, job: int) -> list[tuple[int, int]]:
    return [
        (d.from_gpus, d.to_gpus)
        for d in ctl.decisions()
        if d.slurm_id == job and d.action == "signal" and d.detail.startswith("resize")
    ]


def test_grows_and_shrinks_three_jobs(env_pool: Pool, tmp_path: Path) -> None:
    """One node (4 GPUs): A [1,4] alone gets 4; B [2,2] arrives -> A shrinks to 2; C [1,2]
    arrives and takes what is free; when B and C have finished A grows back. All three train
    to a lower loss, every relaunch resumes from a checkpoint, the metrics count every resize."""
    res = f"t-grow-{os.getpid()}"
    ctl = ControllerProc(
        env_pool, tmp_path / "ctl", res, "--nodes", "n1", "--policy", "share", *FAST
    )
    ctl.start()
    try:
        a = submit(env_pool, res, "A", 1, 4, "--epochs", "60", "--sample-delay", "0.002")
        wait_for(
            "A running on 4 GPUs",
            lambda: (
                env_pool.state(a) == "RUNNING"
                and ctl.phase(a) == "running"
                and _gpus(env_pool, a) == 4
            ),
            90,
            ctl.log,
        )
        b = submit(env_pool, res, "B", 2, 2, "--epochs", "8", "--sample-delay", "0.002")
        submitted = time.time()
        wait_for("A shrunk for B", lambda: (4, 2) in resizes(ctl, a), 300, ctl.log)
        # the newcomer starts within 120 s; the shrunk job holds only its 2 GPUs' CPUs
        # (2 per GPU on this pool), on every Slurm release
        wait_for("B running", lambda: env_pool.state(b) == "RUNNING", 120, ctl.log)
        assert time.time() - submitted <= 120
        wait_for(
            "A running on 2 GPUs",
            lambda: ctl.phase(a) == "running" and _gpus(env_pool, a) == 2,
            120,
            ctl.log,
        )
        assert _cpus(env_pool, a) == 4, env_pool.run("scontrol", "show", "job", str(a)).stdout
        c = submit(env_pool, res, "C", 1, 2, "--epochs", "3", "--sample-delay", "0.002")
        ended: dict[int, str] = {}  # Slurm's state when the controller saw the job done
        for job in (c, b):
            wait_for_phase(ctl, job, "done", 300)
            ended[job] = env_pool.state(job)  # (read later, Slurm may have purged it)
        wait_for("A grown back", lambda: any(t > f for f, t in resizes(ctl, a)), 120, ctl.log)
        # the relaunch on 4 GPUs starts (a hung relaunch fails here, not as a slow job)
        wait_for(
            "A relaunched on 4 GPUs",
            lambda: ctl.phase(a) == "done" or (ctl.training(a) and _gpus(env_pool, a) == 4),
            300,
            ctl.log,
        )
        # what is left of 60 epochs on 4 ranks: up to 15 min on a loaded 2-core machine (CI
        # ran six lanes of tests beside it and took over 900 s)
        wait_for_phase(ctl, a, "done", 1500)
        ended[a] = env_pool.state(a)
        # Slurm agrees: each ended COMPLETED (not FAILED after a resize), none called lost
        assert ended == dict.fromkeys((c, b, a), "COMPLETED")
        assert " lost" not in ctl.log.read_text()

        for job in (a, b, c):
            ls = losses(env_pool, job)
            assert ls and ls[-1] < ls[0], f"job {job} losses {ls}"
        # every launch of A resumed where the one before checkpointed
        starts = [m for m in metrics_lines(env_pool, a) if m.get("event") == "start"]
        ckpts = [m for m in metrics_lines(env_pool, a) if m.get("event") == "checkpoint"]
        assert len(starts) == len(resizes(ctl, a)) + 1
        for later in starts[1:]:
            assert later["resumed"]
            assert later["step"] in {c["step"] for c in ckpts}
        # the metrics endpoint counts every resize
        out = env_pool.hpcorch("metrics", "--state-dir", str(ctl.state)).stdout
        total = sum(len(resizes(ctl, j)) for j in (a, b, c))
        assert f"hpcorch_resizes_total {float(total)}\n" in out
        assert total >= 2  # at least the shrink for B and the grow back
        described = env_pool.hpcorch("describe", str(a), "--state-dir", str(ctl.state)).stdout
        assert "resize to 2 GPUs" in described and "throughput by GPU count" in described
        assert ctl.stop() == 0  # SIGTERM: a clean exit
    finally:
        ctl.stop()
        subprocess.run(["scancel", f"--reservation={res}"], env=env_pool.env, check=False)
        time.sleep(1)
        subprocess.run(["scontrol", "delete", "reservation", res], env=env_pool.env, check=False)


def _cpus(pool: Pool, job: int) -> int:
    """The CPUs Slurm allocated to ``job`` (``NumCPUs``)."""
    out = pool.run("scontrol", "-o", "show", "job", str(job)).stdout
    m = re.search(r"\bNumCPUs=(\d+)", out)
    return int(m.group(1)) if m else -1


def _gpus(pool: Pool, job: int) -> int:
    j = pool.squeue().get(job)
    return j.gpus if j and j.nodes else 0


def test_a_new_pool_holds_only_the_nodes_it_is_given(env_pool: Pool, tmp_path: Path) -> None:
    """Never the whole partition unasked: a reservation to create needs --nodes, names or
    a count of idle GPU nodes (outside other reservations), and the log names what it
    holds."""
    res = f"t-nodes-{os.getpid()}"
    base = ["controller", "--reservation", res, "--once"]
    try:
        none = env_pool.hpcorch(*base, "--state-dir", str(tmp_path / "a"), check=False)
        assert none.returncode == 1 and "give --nodes" in none.stderr, none.stderr
        assert res not in env_pool.run("scontrol", "show", "reservation").stdout
        many = env_pool.hpcorch(
            *base, "--nodes", "99", "--state-dir", str(tmp_path / "b"), check=False
        )
        assert many.returncode == 1 and "idle GPU node(s)" in many.stderr, many.stderr
        one = env_pool.hpcorch(*base, "--nodes", "1", "--state-dir", str(tmp_path / "c"))
        shown = env_pool.run("scontrol", "show", "reservation", res).stdout
        node = re.search(r"Nodes=(\S+)", shown)
        assert node is not None and re.fullmatch(r"n\d", node.group(1)), shown
        assert f"(1 nodes: {node.group(1)}, all it holds)" in one.stderr
    finally:
        subprocess.run(
            ["scontrol", "delete", f"reservation={res}"], env=env_pool.env, capture_output=True
        )
