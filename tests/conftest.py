"""Shared fixtures. ``slurm_pool`` brings up a real Slurm pool with the project's own
slurm/pool script (in .run/test-pool; port base $HPCORCH_TEST_POOL_PORT, by default one
derived from the checkout's path)."""

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

    def squeue(self) -> dict[int, dict[str, Any]]:
        doc = json.loads(self.run("squeue", "--json").stdout)
        return {j["job_id"]: j for j in doc["jobs"]}

    def state(self, job_id: int) -> str:
        job = self.squeue().get(job_id)
        if job is None:
            return "GONE"
        state = job["job_state"]
        return str(state[0] if isinstance(state, list) else state)

    def wait_state(self, job_id: int, states: set[str], timeout: float = 120) -> str:
        deadline = time.time() + timeout
        state = self.state(job_id)
        while state not in states:
            if time.time() > deadline:
                raise AssertionError(f"job {job_id} still {state} after {timeout} s")
            time.sleep(0.5)
            state = self.state(job_id)
        return state


def _slurm_installed() -> bool:
    return all(shutil.which(x) for x in ("slurmctld", "slurmd", "sbatch", "munged"))


@pytest.fixture(scope="session")
def slurm_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pool]:
    if not _slurm_installed():
        if os.environ.get("CI"):
            pytest.fail("Slurm is not installed: run 'slurm/pool install'")
        pytest.skip("Slurm is not installed (slurm/pool install)")
    pool_dir = Path(os.environ.get("HPCORCH_TEST_POOL_DIR", REPO / ".run" / "test-pool"))
    # a port base of this checkout's own, so that two checkouts on one machine never share
    # a slurmctld (and one's `pool down` never stops the other's)
    default_port = 17800 + 100 * (zlib.crc32(str(REPO).encode()) % 40)
    port = os.environ.get("HPCORCH_TEST_POOL_PORT", str(default_port))
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir)}
    subprocess.run(
        [str(POOL_SCRIPT), "up", "--nodes", "4", "--gpus-per-node", "4", "--port-base", port],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    env["SLURM_CONF"] = str(pool_dir / "etc" / "slurm.conf")
    home = tmp_path_factory.mktemp("hpcorch-home")
    env["HPCORCH_HOME"] = str(home)
    # one spool for every test's controller (each has its own state directory): submit
    # tells the jobs, and the controllers write their plans there
    env["HPCORCH_SPOOL"] = str(home / "spool")
    env["PYTHONUNBUFFERED"] = "1"
    pool = Pool(dir=pool_dir, env=env, nodes=4, gpus_per_node=4, home=home)
    yield pool
    subprocess.run([str(POOL_SCRIPT), "down"], env=env, check=False, capture_output=True)
