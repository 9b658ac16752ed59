"""A controller-only install: numpy and click, no torch, scipy, matplotlib,
prometheus-client or mpi4py. Each check runs in a subprocess whose import system refuses
those packages, as if they were not installed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "scipy", "matplotlib", "prometheus_client", "mpi4py", "pyslurm")
GUARD = f"""
import sys
class _NotInstalled:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {HEAVY!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
sys.meta_path.insert(0, _NotInstalled())
"""


def _run(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", GUARD + code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_the_guard_works() -> None:
    res = _run("import torch")
    assert res.returncode == 1 and "No module named 'torch'" in res.stderr


@pytest.mark.parametrize(
    "command",
    ["controller", "status", "submit", "cancel", "describe", "resize", "metrics", "simulate"],
)
def test_every_command_starts_without_the_heavy_packages(command: str) -> None:
    code = (
        "from hpcorch.cli import main\n"
        "main(sys.argv[1:], prog_name='hpcorch')\n"  # exits 0 after --help
    )
    res = _run(code, command, "--help")
    assert res.returncode == 0, res.stderr
    assert "Usage: hpcorch" in res.stdout and "Traceback" not in res.stderr


def test_controller_modules_import_and_metrics_say_what_to_install(tmp_path: Path) -> None:
    code = (
        "import hpcorch.cli, hpcorch.cli.controller, hpcorch.controller.loop\n"
        "import hpcorch.slurm.cluster, hpcorch.controller.prom, hpcorch.policy.ones\n"
        "from hpcorch.controller.store import Store\n"
        "Store(__import__('pathlib').Path(sys.argv[1]) / 'state.db').close()\n"
        "from hpcorch.cli import main\n"
        "main(['metrics', '--state-dir', sys.argv[1]], prog_name='hpcorch')\n"
    )
    res = _run(code, str(tmp_path))
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr
    assert res.stderr.strip() == (
        "Error: metrics need the prometheus-client package (No module named "
        "'prometheus_client'): pip install 'hpcorch[prometheus]'"
    )


def test_controller_cycles_run_without_the_heavy_packages() -> None:
    """The controller's own tests (a fake cluster, the real store and policies)."""
    code = (
        "import pytest\n"
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', "
        "'tests/test_controller_logic.py']))\n"
    )
    res = _run(code)
    assert res.returncode == 0, res.stdout[-3000:]
    assert " passed" in res.stdout


def test_every_module_directory_is_a_package_that_installs() -> None:
    """``packages = find:`` ships only directories with an ``__init__.py``: a module in
    any other directory works in the editable checkout and is missing once installed."""
    with_modules = {p.parent for p in (REPO / "hpcorch").rglob("*.py")}
    missing = sorted(
        str(d.relative_to(REPO)) for d in with_modules if not (d / "__init__.py").exists()
    )
    assert missing == []
