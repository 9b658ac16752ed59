"""What a site installs agrees with the admin guide: the slurm.conf fragment's and the
unit's reservation advice, the example configuration, and a hardened unit."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

SLURM = Path(__file__).resolve().parent.parent / "slurm"


@pytest.mark.parametrize(
    "path", ["site/slurm.conf.fragment", "hpcorch-controller.service", "hpcorch-controller.toml"]
)
def test_no_advice_the_admin_guide_refutes(path: str) -> None:
    text = (SLURM / path).read_text()
    assert "Duration=infinite" not in text  # stored as a year
    assert not re.search(r"Flags=\S*FLEX", text)  # its jobs may leave the reservation
    assert not re.search(r"Users=\S*@", text)  # Users= and a group: "Invalid user id"
    assert 'users = ["hpcorch"]' not in text  # the controller's user runs no job


def test_the_unit_is_hardened() -> None:
    """`systemd-analyze security` rates the unit 4.0 or lower (it was 8.6, EXPOSED)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    unit = str(SLURM / "hpcorch-controller.service")
    argv = ["systemd-analyze", "security", "--offline=true", unit]
    out = subprocess.run(argv, capture_output=True, text=True, check=False)
    found = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", out.stdout + out.stderr)
    if found is None:
        pytest.skip(f"systemd-analyze gave no score: {out.stderr.strip()[-200:]}")
    assert float(found.group(1)) <= 4.0, out.stdout[-2000:]
