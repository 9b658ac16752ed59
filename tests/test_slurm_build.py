"""slurm/build and slurm/pool --slurm: bad input and a failed build are one clear line,
and a failed build leaves nothing in the cache. No Slurm daemon and no real build needed."""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from tests.conftest import REPO

BUILD = REPO / "slurm" / "build"
POOL = REPO / "slurm" / "pool"


def run(argv: list[str], tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    full = {
        **os.environ,
        "HPCORCH_SLURM_SOURCES": str(tmp_path / "src"),
        "HPCORCH_SLURM_CACHE": str(tmp_path / "cache"),
        "HPCORCH_POOL_DIR": str(tmp_path / "pool"),
        **env,
    }
    return subprocess.run(argv, env=full, text=True, capture_output=True, check=False)


def one_line(res: subprocess.CompletedProcess[str], progress: int = 0) -> str:
    """The one error line, after ``progress`` lines saying what is under way."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode != 0 and len(lines) == progress + 1, res.stderr
    assert "Traceback" not in res.stderr
    return lines[-1]


@pytest.mark.parametrize("version", ["25", "25.11.2.1", "latest", "-rf", "25.11; ls"])
def test_a_malformed_version_is_refused(tmp_path: Path, version: str) -> None:
    line = one_line(run([str(BUILD), version], tmp_path))
    assert line.startswith("slurm/build: VERSION must look like 25.11 or 25.11.2")


def test_a_missing_tarball_names_where_it_looked(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    line = one_line(run([str(BUILD), "26.05"], tmp_path))
    assert "no tarball slurm-26.05*.tar.gz in" in line and str(tmp_path / "src") in line
    assert not (tmp_path / "cache").exists()


def test_debian_s_release_needs_no_build(tmp_path: Path) -> None:
    res = run([str(BUILD), "22.05"], tmp_path)
    assert (res.returncode, res.stdout) == (0, "/usr\n")


def test_prefix_of_an_unbuilt_release_is_an_error(tmp_path: Path) -> None:
    line = one_line(run([str(BUILD), "--prefix", "24.11"], tmp_path))
    assert line == "slurm/build: Slurm 24.11 is not built: run 'slurm/build 24.11'"


def test_pyslurm_only_for_25_11(tmp_path: Path) -> None:
    line = one_line(run([str(BUILD), "--pyslurm", "22.05"], tmp_path))
    assert "pyslurm is built for Slurm 25.11 only" in line


@pytest.mark.skipif(shutil.which("gcc") is None or os.geteuid() != 0, reason="needs build tools")
def test_a_failed_build_is_one_line_and_leaves_no_prefix(tmp_path: Path) -> None:
    """A tarball whose configure fails: the line names the log, the cache keeps no prefix."""
    deps = subprocess.run([str(BUILD), "--deps"], capture_output=True, text=True, check=False)
    if deps.returncode != 0:
        pytest.skip(f"build dependencies missing: {deps.stderr.strip()}")
    src = tmp_path / "src"
    src.mkdir()
    script = b"#!/bin/sh\necho 'configure: error: this tarball is broken' >&2\nexit 1\n"
    with tarfile.open(src / "slurm-26.05.1.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("slurm-26.05.1/configure")
        info.size, info.mode = len(script), 0o755
        tar.addfile(info, io.BytesIO(script))
    line = one_line(run([str(BUILD), "26.05"], tmp_path), progress=1)
    assert line.startswith("slurm/build: building Slurm 26.05.1 failed (last lines of ")
    assert "this tarball is broken" in line
    cache = tmp_path / "cache"
    assert [p.name for p in cache.iterdir()] == ["slurm-26.05.1-build.log"]


def test_pool_up_with_an_unknown_release_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    res = run([str(POOL), "up", "--slurm", "26.05"], tmp_path)
    assert res.returncode != 0 and "no tarball slurm-26.05*.tar.gz" in res.stderr
    assert "Traceback" not in res.stderr
