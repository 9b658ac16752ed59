"""GPU types on a real pool of two generations (``slurm/pool up --gpu-types t4:2,a100:2``):
a job submitted with ``--gpu-types a100`` is started by the controller on an a100 node
with a typed GPU request Slurm shows (``gres:gpu:a100:N``), and ``hpcorch status`` and
``hpcorch report`` say where it ran; a type the pool lacks is refused at submit."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import (
    POOL_SCRIPT,
    Pool,
    _slurm_installed,
    pool_env,
    pool_port_base,
    slurm_release,
)
from tests.integration.controller_util import FAST, ControllerProc, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.releases]


@pytest.fixture(scope="module")
def typed_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """Four nodes of 2 GPUs: n1, n2 of type t4 and n3, n4 of type a100 (port base + 300:
    the blocks below are the other test pools')."""
    if not _slurm_installed():
        pytest.skip("Slurm is not installed (slurm/pool install)")
    pdir = tmp_path_factory.mktemp("typed") / "pool"
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pdir)}
    up = subprocess.run(
        [str(POOL_SCRIPT), "up", "--nodes", "4", "--gpus-per-node", "2", "--gpu-types",
         "t4:2,a100:2", "--port-base", str(pool_port_base() + 300), "--slurm",
         slurm_release()],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr[-2000:]
    env = pool_env(env)
    home = tmp_path_factory.mktemp("typed-home")
    env.update(HPCORCH_HOME=str(home), HPCORCH_SPOOL=str(home / "spool"), PYTHONUNBUFFERED="1")
    try:
        yield Pool(dir=pdir, env=env, nodes=4, gpus_per_node=2, home=home)
    finally:
        subprocess.run([str(POOL_SCRIPT), "down"], env=env, check=False, capture_output=True)


def test_an_a100_job_runs_on_a100_with_a_typed_request(typed_pool: Pool, tmp_path: Path) -> None:
    pool, res = typed_pool, f"t-types-{os.getpid()}"
    ctl = ControllerProc(pool, tmp_path / "ctl", res, "--nodes", "n[1-4]", "--policy", "share",
                         *FAST)  # fmt: skip
    sleeper = tmp_path / "sleeper.sh"
    sleeper.write_text("#!/bin/sh\nsleep 300\n")
    sleeper.chmod(0o755)
    ctl.start()
    try:
        bad = pool.hpcorch("submit", "--pool", res, "--min-gpus", "1", "--gpu-types", "h100",
                           str(sleeper), check=False)  # fmt: skip
        assert bad.returncode == 1 and "Traceback" not in bad.stderr
        assert bad.stderr.strip().splitlines()[-1] == (
            f"Error: --gpu-types: pool '{res}' has no GPU type h100 (valid: a100, t4)"
        )
        out = pool.hpcorch("submit", "--pool", res, "--name", "on-a100", "--min-gpus", "1",
                           "--max-gpus", "2", "--gpu-types", "a100", "--mode", "managed",
                           "--parsable", str(sleeper))  # fmt: skip
        job = int(out.stdout)
        shown = pool.run("squeue", "-h", "-j", str(job), "-o", "%k").stdout
        assert "types=a100" in shown  # the comment carries it
        wait_for("the job running", lambda: pool.state(job) == "RUNNING", 90, ctl.log)
        nodes = pool.run("squeue", "-h", "-j", str(job), "-o", "%N").stdout.strip()
        assert nodes in ("n3", "n4", "n[3-4]"), nodes
        detail = pool.run("scontrol", "show", "job", str(job)).stdout
        print(detail)  # what Slurm shows of a typed launch (kept in the test's output)
        assert "gpu:a100:" in detail, detail
        # exactly the CPUs and GPUs of its shape: its GPUs, each with its node's share of
        # the CPUs (the a100 nodes n3 and n4 are alike)
        per_node = int(re.search(r"TresPerNode=gres[:/]gpu:a100:(\d+)", detail)[1])  # type: ignore[index]
        count = int(re.search(r"NumNodes=(\d+)", detail)[1])  # type: ignore[index]
        node = pool.run("scontrol", "-o", "show", "node", "n3").stdout
        cpus = int(re.search(r"CPUTot=(\d+)", node)[1])  # type: ignore[index]
        gres = int(re.search(r"Gres=gpu:a100:(\d+)", node)[1])  # type: ignore[index]
        assert f"NumCPUs={count * per_node * (cpus // gres)} " in detail, (detail, node)
        wait_for("the controller to see it run", lambda: ctl.phase(job) == "running", 30)
        store = ctl.store()
        rec = store.job(job)
        store.close()
        assert rec is not None and (rec.gpu_types, rec.gpu_type, rec.target_type) == (
            "a100",
            "a100",
            "a100",
        )
        status = pool.hpcorch("status", "--state-dir", str(ctl.state)).stdout.splitlines()
        head = next(ln.split() for ln in status if ln.startswith("JOBID"))
        row = next(ln.split() for ln in status if ln.startswith(str(job)))
        assert row[head.index("TYPE")] == "a100", status
        pool.hpcorch("cancel", str(job))
        wait_for("the job cancelled", lambda: ctl.phase(job) == "cancelled", 30, ctl.log)
        report = pool.hpcorch("report", "--state-dir", str(ctl.state)).stdout.splitlines()
        assert report[0].split()[-1] == "GPU_TYPES", report
        line = next(ln.split() for ln in report if ln.startswith(str(job)))
        assert line[-1] == "a100", report
    finally:
        assert ctl.stop() == 0
        pool.run("scancel", f"--reservation={res}", check=False)
        pool.run("scontrol", "delete", "reservation", res, check=False)
