"""Bad input to ``hpcorch submit``: one clear line on stderr, the right exit code,
no traceback, nothing submitted or written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from hpcorch.cli import main

SCRIPT = str(Path(__file__).resolve().parent.parent / "examples" / "train_ddp.py")


@pytest.fixture
def no_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A machine where Slurm's commands are not on PATH; HPCORCH_HOME in tmp."""
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("HPCORCH_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def error_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr
    assert lines, "nothing on stderr"
    return lines[-1]


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--min-gpus", "2", "/no/such/train.py"], "does not exist"),
        (["--min-gpus", "0", SCRIPT], "--min-gpus"),
        (["--min-gpus", "two", SCRIPT], "--min-gpus"),
        ([SCRIPT], "--min-gpus"),
        (["--min-gpus", "4", "--max-gpus", "2", SCRIPT], "--min-gpus 4 is above --max-gpus 2"),
        (["--min-gpus", "1", "--batch-size", "64", "--max-batch-size", "32", SCRIPT], "above"),
        (["--min-gpus", "1", "--time", "soon", SCRIPT], "invalid --time 'soon'"),
        (["--min-gpus", "1", "--name", "my job", SCRIPT], "invalid job name"),
        (["--min-gpus", "1", "--stop-signal", "SIGNOPE", SCRIPT], "unknown signal 'SIGNOPE'"),
        (["--min-gpus", "1", "--progress-regex", "step (", SCRIPT], "does not compile"),
        (["--min-gpus", "1", "--progress-regex", "step", SCRIPT], "captures nothing"),
        (["--min-gpus", "1", "--resume-arg", "--resume {ckpt}", SCRIPT], "needs --ckpt-dir"),
        (["--min-gpus", "1", "--resume-arg", "'unclosed", SCRIPT], "quotation"),
        (
            ["--min-gpus", "1", "--stop-signal", "USR1", "--stop-command", "touch x", SCRIPT],
            "not both",
        ),
        (["--min-gpus", "1", "--mode", "hybrid", SCRIPT], "'hybrid' is not one of"),
    ],
)
def test_usage_errors_exit_2(no_slurm: Path, args: list[str], needle: str) -> None:
    result = CliRunner().invoke(main, ["submit", *args])
    assert result.exit_code == 2, result.output
    assert needle in error_line(result.stderr)
    assert not no_slurm.exists()


def test_no_slurm_reachable_exits_1(no_slurm: Path) -> None:
    result = CliRunner().invoke(main, ["submit", "--min-gpus", "2", SCRIPT])
    assert result.exit_code == 1
    assert error_line(result.stderr) == ("Error: sinfo not found: is Slurm installed and on PATH?")
    assert not no_slurm.exists()


@pytest.mark.parametrize("command", [["status"], ["status", "--json"], ["cancel", "7"]])
def test_status_and_cancel_without_slurm_exit_1(no_slurm: Path, command: list[str]) -> None:
    result = CliRunner().invoke(main, command)
    assert result.exit_code == 1
    assert "not found: is Slurm installed" in error_line(result.stderr)


def test_cancel_needs_a_job_id(no_slurm: Path) -> None:
    result = CliRunner().invoke(main, ["cancel", "abc"])
    assert result.exit_code == 2
    assert "JOB_ID" in error_line(result.stderr)
