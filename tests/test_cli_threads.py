"""`hpcorch simulate` and `hpcorch controller` run numpy with one BLAS thread unless the
environment says otherwise (issue 25: BLAS threads spinning on a loaded machine doubled a
simulation's CPU for the same results)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = """
import os, sys
from hpcorch.cli import main
sys.argv = ["hpcorch", sys.argv[1], "--help"]
try:
    main()
except SystemExit:
    pass
print("threads", *(os.environ.get(v) for v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")))
print("numpy", "numpy" in sys.modules)
"""


def probe(command: str, **env: str) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.endswith("_NUM_THREADS")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, command], env={**clean, **env}, capture_output=True,
        text=True, check=True,
    )  # fmt: skip
    return [line for line in out.stdout.splitlines() if line.startswith(("threads", "numpy"))]


@pytest.mark.parametrize("command", ["simulate", "controller"])
def test_one_blas_thread_set_before_numpy_is_imported(command: str) -> None:
    assert probe(command) == ["threads 1 1", "numpy True"]


def test_the_environment_decides_when_it_says() -> None:
    assert probe("simulate", OMP_NUM_THREADS="4")[0] == "threads 4 1"
    assert probe("status")[0] == "threads None None"  # other commands leave them alone
