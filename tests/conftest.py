"""Shared fixtures. ``slurm_pool`` brings up a real Slurm pool with the project's own
slurm/pool script (in .run/test-pool; port base $HPCORCH_TEST_POOL_PORT, by default one
derived from the checkout's path). Every pool runs the Slurm release $HPCORCH_SLURM names
(22.05, Debian's, by default; 23.11, 24.11 or 25.11 are built once by slurm/build)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from hpcorch.slurm.parse import SlurmJob, parse_squeue

REPO = Path(__file__).resolve().parent.parent
POOL_SCRIPT = REPO / "slurm" / "pool"
EXAMPLE = REPO / "examples" / "train_ddp.py"


@dataclass
class Pool:
    """A running local Slurm pool and the environment that reaches it."""

    dir: Path
    env: dict[str, str]
    nodes: int
    gpus_per_node: int
    home: Path = field(default_factory=Path)

    def run(self, *argv: str, check: bool = True, **kw: Any) -> subprocess.CompletedProcess[str]:
        res = subprocess.run(list(argv), env=self.env, text=True, capture_output=True, **kw)
        if check and res.returncode != 0:
            raise AssertionError(
                f"{' '.join(argv[:4])} ... exited {res.returncode}: {res.stderr.strip()[-2000:]}"
            )
        return res

    def hpcorch(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.run(sys.executable, "-m", "hpcorch", *args, check=check)

    def squeue(self) -> dict[int, SlurmJob]:
        """Every job slurmctld holds, parsed as hpcorch parses them (any Slurm release)."""
        doc = json.loads(self.run("squeue", "--json", "--states=all").stdout)
        return {j.job_id: j for j in parse_squeue(doc)}

    def state(self, job_id: int) -> str:
        job = self.squeue().get(job_id)
        return "GONE" if job is None else job.state

    def wait_state(self, job_id: int, states: set[str], timeout: float = 120) -> str:
        deadline = time.time() + timeout
        state = self.state(job_id)
        while state not in states:
            if time.time() > deadline:
                raise AssertionError(f"job {job_id} still {state} after {timeout} s")
            time.sleep(0.5)
            state = self.state(job_id)
        return state


def pool_port_base() -> int:
    """The test pool's port base: $HPCORCH_TEST_POOL_PORT, else one of this checkout's own,
    so that two checkouts on one machine never share a slurmctld. The accounting pool takes
    this + 100 (the next block of ports), the pool script's own tests this + 200."""
    default_port = 17800 + 100 * (zlib.crc32(str(REPO).encode()) % 40)
    return int(os.environ.get("HPCORCH_TEST_POOL_PORT", str(default_port)))


def _slurm_installed() -> bool:
    return all(shutil.which(x) for x in ("slurmctld", "slurmd", "sbatch", "munged"))


def pool_env(env: dict[str, str]) -> dict[str, str]:
    """``env`` with what ``slurm/pool env`` exports for the pool of ``HPCORCH_POOL_DIR``
    (SLURM_CONF; PATH and LD_LIBRARY_PATH when it runs a built Slurm)."""
    res = subprocess.run(
        ["bash", "-c", f'eval "$({POOL_SCRIPT} env)" && env -0'],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    out = dict(item.split("=", 1) for item in res.stdout.split("\0") if "=" in item)
    keys = ("SLURM_CONF", "HPCORCH_POOL_DIR", "PATH", "LD_LIBRARY_PATH")
    return {**env, **{k: out[k] for k in keys if k in out}}


def slurm_release() -> str:
    """The Slurm release the test pools run: $HPCORCH_SLURM, else Debian's 22.05."""
    return os.environ.get("HPCORCH_SLURM") or "22.05"


@pytest.fixture(scope="session")
def slurm_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    if not _slurm_installed():
        if os.environ.get("CI"):
            pytest.fail("Slurm is not installed: run 'slurm/pool install'")
        pytest.skip("Slurm is not installed (slurm/pool install)")
    pool_dir = Path(os.environ.get("HPCORCH_TEST_POOL_DIR", REPO / ".run" / "test-pool"))
    port = str(pool_port_base())
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir)}
    argv = [str(POOL_SCRIPT), "up", "--nodes", "4", "--gpus-per-node", "4", "--port-base", port]
    res = subprocess.run(
        [*argv, "--slurm", slurm_release()], env=env, capture_output=True, text=True
    )
    if res.returncode != 0:
        raise AssertionError(f"slurm/pool up failed: {res.stderr[-2000:]}")
    env = pool_env(env)
    home = tmp_path_factory.mktemp("hpcorch-home")
    env["HPCORCH_HOME"] = str(home)
    # one spool for every test's controller (each has its own state directory): submit
    # tells the jobs, and the controllers write their plans there
    env["HPCORCH_SPOOL"] = str(home / "spool")
    env["PYTHONUNBUFFERED"] = "1"
    pool = Pool(dir=pool_dir, env=env, nodes=4, gpus_per_node=4, home=home)
    yield pool
    subprocess.run([str(POOL_SCRIPT), "down"], env=env, check=False, capture_output=True)


ACCOUNTING_PACKAGES = ("mariadb-server", "slurmdbd")


def _debs_installed(*names: str) -> bool:
    res = subprocess.run(["dpkg", "-s", *names], capture_output=True, check=False)
    return res.returncode == 0


@pytest.fixture(scope="session")
def accounting_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    """A second pool run as sites run theirs: slurmdbd on MariaDB with
    ``AccountingStorageEnforce=associations,limits,qos`` (accounts ``ml`` and ``physics``,
    QOS ``normal`` and ``high``, root in both accounts; its default account is ``root``)
    and nodes named ``gpu-a001`` .. ``gpu-a004``; squeue forgets a job 5 s after it ends
    (MinJobAge), so sacct must answer for it. In .run/test-pool-acct, port base
    $HPCORCH_TEST_POOL_PORT + 100."""
    if not _slurm_installed() or not _debs_installed(*ACCOUNTING_PACKAGES):
        if os.environ.get("CI"):
            pytest.fail("Slurm or MariaDB is not installed: run 'slurm/pool install --accounting'")
        pytest.skip("the accounting pool needs 'slurm/pool install --accounting'")
    pool_dir = Path(os.environ.get("HPCORCH_TEST_ACCT_POOL_DIR", REPO / ".run" / "test-pool-acct"))
    default_port = 17800 + 100 * (zlib.crc32(str(REPO).encode()) % 40)
    port = int(os.environ.get("HPCORCH_TEST_POOL_PORT", str(default_port))) + 100
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir)}
    argv = [str(POOL_SCRIPT), "up", "--nodes", "4", "--gpus-per-node", "4"]
    argv += ["--port-base", str(port), "--accounting", "--node-prefix", "gpu-a"]
    argv += ["--node-digits", "3", "--min-job-age", "5", "--slurm", slurm_release()]
    res = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise AssertionError(f"slurm/pool up --accounting failed: {res.stderr[-2000:]}")
    env = pool_env(env)
    home = tmp_path_factory.mktemp("hpcorch-home-acct")
    env["HPCORCH_HOME"] = str(home)
    # the controllers' plans where the jobs look for them (a job finds none: exit 77)
    env["HPCORCH_SPOOL"] = str(home / "spool")
    env["PYTHONUNBUFFERED"] = "1"
    yield Pool(dir=pool_dir, env=env, nodes=4, gpus_per_node=4, home=home)
    subprocess.run([str(POOL_SCRIPT), "down"], env=env, check=False, capture_output=True)
