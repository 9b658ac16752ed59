"""slurm/pool itself: a second, small pool beside the test pool; up, down, bad options."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import POOL_SCRIPT, _slurm_installed

pytestmark = pytest.mark.slurm


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
    up = pool(pdir, "up", "--nodes", "2", "--gpus-per-node", "2", "--port-base", "17900")
    assert up.returncode == 0, up.stderr
    assert "up: 2 nodes x 2 GPUs" in up.stderr
    pids = [int(p.read_text()) for p in (pdir / "run").glob("*.pid")]
    assert len(pids) == 3  # slurmctld + 2 slurmd
    assert all(Path(f"/proc/{p}").exists() for p in pids)
    assert (pdir / "dev" / "gpu1").resolve() == Path("/dev/null")

    down = pool(pdir, "down")
    assert down.returncode == 0, down.stderr
    time.sleep(0.5)
    assert not any(Path(f"/proc/{p}").exists() for p in pids)
    assert processes_of(pdir) == []
    again = pool(pdir, "down")
    assert again.returncode == 0


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["up", "--nodes", "abc"], 1, "--nodes must be a positive integer, got 'abc'"),
        (["up", "--frobnicate"], 1, "unknown option for up: '--frobnicate'"),
        (["frob"], 2, "unknown command 'frob' (valid: install up status env down)"),
        (["status"], 1, "no pool in"),
    ],
)
def test_bad_use_is_one_clear_line(tmp_path: Path, args: list[str], code: int, needle: str) -> None:
    res = pool(tmp_path / "none", *args)
    assert res.returncode == code
    assert needle in res.stderr.strip().splitlines()[-1]
