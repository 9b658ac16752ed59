"""slurm/pool itself: a second, small pool beside the test pool; up, down, bad options."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import POOL_SCRIPT, Pool, _slurm_installed, pool_env, pool_port_base

pytestmark = [pytest.mark.slurm, pytest.mark.releases]


def pool(tmp: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HPCORCH_POOL_DIR": str(tmp)}
    return subprocess.run([str(POOL_SCRIPT), *args], env=env, text=True, capture_output=True)


def processes_of(tmp: Path) -> list[str]:
    out = subprocess.run(["ps", "-eo", "args"], text=True, capture_output=True).stdout
    pids = [p.read_text().strip() for p in (tmp / "run").glob("*.pid")]
    return [ln for ln in out.splitlines() if str(tmp) in ln] + pids


@pytest.mark.skipif(not _slurm_installed(), reason="Slurm is not installed")
def test_up_then_down_leaves_nothing_running(tmp_path: Path) -> None:
    pdir = tmp_path / "pool"
    port = str(pool_port_base() + 200)
    up = pool(pdir, "up", "--nodes", "2", "--gpus-per-node", "2", "--port-base", port)
    assert up.returncode == 0, up.stderr
    assert "2 nodes x 2 GPUs" in up.stderr
    pids = [int(p.read_text()) for p in (pdir / "run").glob("*.pid")]
    assert len(pids) == 3  # slurmctld + 2 slurmd
    assert all(Path(f"/proc/{p}").exists() for p in pids)
    assert (pdir / "dev" / "gpu1").resolve() == Path("/dev/null")

    down = pool(pdir, "down")
    assert down.returncode == 0, down.stderr
    # the daemons were told to stop and waited for; on a loaded machine their last exit
    # steps can take seconds to show
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{p}").exists() for p in pids) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(Path(f"/proc/{p}").exists() for p in pids)
    assert processes_of(pdir) == []
    again = pool(pdir, "down")
    assert again.returncode == 0


@pytest.mark.skipif(not _slurm_installed(), reason="Slurm is not installed")
def test_a_pool_of_gpu_types(tmp_path: Path) -> None:
    """`up --gpu-types`: typed GRES and a feature per type, as a site declares them; Slurm
    places a typed request on its type, and `hpcorch status` shows each node's type."""
    pdir = tmp_path / "pool"
    port = str(pool_port_base() + 200)
    up = pool(pdir, "up", "--nodes", "3", "--gpus-per-node", "2", "--gpu-types", "a100:2,v100:1",
              "--port-base", port)  # fmt: skip
    assert up.returncode == 0, up.stderr
    assert "GPU types a100:2 v100:1" in up.stderr
    env = pool_env({**os.environ, "HPCORCH_POOL_DIR": str(pdir), "HPCORCH_HOME": str(tmp_path)})
    try:

        def run(*cmd: str) -> str:
            return subprocess.run(cmd, env=env, text=True, capture_output=True, check=True).stdout

        shown = run("sinfo", "-h", "-N", "-o", "%N %G %f").split()
        assert shown == ["n1", "gpu:a100:2", "a100", "n2", "gpu:a100:2", "a100",
                         "n3", "gpu:v100:2", "v100"]  # fmt: skip
        job = run("sbatch", "--parsable", "-o", "/dev/null", "--gres=gpu:v100:1", "--wrap",
                  "sleep 60").split(";")[0].strip()  # fmt: skip
        state = ("squeue", "-h", "-j", job, "-o", "%T")
        wait_for("the v100 job running", lambda: run(*state) == "RUNNING\n")
        assert run("squeue", "-h", "-j", job, "-o", "%N").strip() == "n3"
        status = run(sys.executable, "-m", "hpcorch", "status").splitlines()
        assert status[1].split() == ["NODE", "STATE", "TYPE", "GPUS", "BUSY"]
        assert [ln.split()[2] for ln in status[2:5]] == ["a100", "a100", "v100"]
    finally:
        down = pool(pdir, "down")
    assert down.returncode == 0, down.stderr


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["up", "--nodes", "abc"], 1, "--nodes must be a positive integer, got 'abc'"),
        (["up", "--frobnicate"], 1, "unknown option for up: '--frobnicate'"),
        (["frob"], 2, "unknown command 'frob' (valid: install up status env down)"),
        (["status"], 1, "no pool in"),
        (["up", "--nodes", "2", "--gpu-types", "a100:1"], 1, "gives 1 nodes, the pool has 2"),
        (["up", "--gpu-types", "A100:4"], 1, "--gpu-types needs TYPE:NODES[,TYPE:NODES...]"),
        (["up", "--gpu-types", "t4:2,t4:2"], 1, "--gpu-types names type 't4' twice"),
    ],
)
def test_bad_use_is_one_clear_line(tmp_path: Path, args: list[str], code: int, needle: str) -> None:
    res = pool(tmp_path / "none", *args)
    assert res.returncode == code
    assert needle in res.stderr.strip().splitlines()[-1]


def steps_of(conf: Path) -> list[int]:
    """The slurmstepd processes started by the pool whose slurm.conf is ``conf``: those
    holding that pool's slurmd log open (every release), or started with its SLURM_CONF
    (22.05 only: 23.11+ give slurmstepd a clean environment)."""
    logs = conf.parent.parent / "log"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes()
            env = (proc / "environ").read_bytes().split(b"\0")
            fds = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:
            continue
        if not cmd.startswith(b"slurmstepd: ["):
            continue
        if f"SLURM_CONF={conf}".encode() in env or any(
            f.startswith(f"{logs}/slurmd-") for f in fds
        ):
            found.append(int(proc.name))
    return found


def wait_for(what: str, check: object, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not check():  # type: ignore[operator]
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.3)


@pytest.mark.slow
def test_down_ends_only_its_own_pools_job_steps(slurm_pool: Pool, tmp_path: Path) -> None:
    """`pool down` of a second pool whose job steps outlive its daemons ends those steps
    and leaves the job of the pool beside it running (issue 13: the old pkill ended the
    steps of every pool on the machine)."""
    conf_a = slurm_pool.dir / "etc" / "slurm.conf"
    job_a = int(
        slurm_pool.run(
            "sbatch",
            "--parsable",
            "-N1",
            "--gres=gpu:1",
            "-o",
            "/dev/null",
            "--wrap",
            "srun sleep 300",
        ).stdout.split(";")[0]
    )
    pdir = tmp_path / "pool-b"
    up = pool(
        pdir,
        "up",
        "--nodes",
        "1",
        "--gpus-per-node",
        "1",
        "--port-base",
        str(pool_port_base() + 200),
    )
    assert up.returncode == 0, up.stderr
    conf_b = pdir / "etc" / "slurm.conf"
    env_b = pool_env({**os.environ, "HPCORCH_POOL_DIR": str(pdir)})
    assert env_b["SLURM_CONF"] == str(conf_b)
    try:
        sub = subprocess.run(
            [
                "sbatch",
                "--parsable",
                "-N1",
                "--gres=gpu:1",
                "-o",
                "/dev/null",
                "--wrap",
                "srun sleep 300",
            ],
            env=env_b,
            text=True,
            capture_output=True,
            check=True,
        )
        assert sub.stdout.strip()
        slurm_pool.wait_state(job_a, {"RUNNING"})
        wait_for(
            "both pools' steps", lambda: len(steps_of(conf_a)) >= 2 and len(steps_of(conf_b)) >= 2
        )
        a_steps, b_steps = steps_of(conf_a), steps_of(conf_b)
        b_tasks = [
            int(p)
            for s in b_steps
            for p in subprocess.run(
                ["pgrep", "-P", str(s)], text=True, capture_output=True
            ).stdout.split()
        ]
        # pool B's slurmctld dies: `down` cannot cancel its job, so its steps outlive the
        # daemons and only the clean-up after stop_daemons can end them
        ctld = int((pdir / "run" / "slurmctld.pid").read_text())
        os.kill(ctld, 9)
        down = pool(pdir, "down")
        assert down.returncode == 0, down.stderr
        wait_for("pool B's steps to end", lambda: not steps_of(conf_b), 10)
        assert not [p for p in b_tasks if Path(f"/proc/{p}").exists()]
        assert all(Path(f"/proc/{p}").exists() for p in a_steps)
        assert slurm_pool.state(job_a) == "RUNNING"
    finally:
        slurm_pool.run("scancel", str(job_a), check=False)
        pool(pdir, "down")
