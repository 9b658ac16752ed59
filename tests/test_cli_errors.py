"""Bad input to ``hpcorch submit``: one clear line on stderr, the right exit code,
no traceback, nothing submitted or written."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
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


# --- issue 13, item 6: each failure found by hand, as a test --------------------------------


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["status", "--watch", "nan"], "'nan' is not a number"),
        (["describe", "99999999999999999999999"], "not in the range"),
        (["cancel", "٣"], "ASCII digits"),
        (["cancel", "12_3"], "array and heterogeneous job ids are not hpcorch jobs"),
        (["controller", "--interval", "nan"], "'nan' is not a number"),
        (["controller", "--interval", "inf"], "'inf' is not a number"),
        (["simulate", "x.csv", "--round", "nan"], "'nan' is not a number"),
        (["submit", "--min-gpus", "1", "--stop-signal", "999", SCRIPT], "unknown signal '999'"),
        (["submit", "--min-gpus", "1", "--stop-signal", "KILL", SCRIPT], "cannot be caught"),
        (["submit", "--min-gpus", "1", "--time", "25:99:99", SCRIPT], "below 60"),
        (["submit", "--min-gpus", "1", "--time", "1-24", SCRIPT], "below 24"),
        (["submit", "--min-gpus", "1", "--batch-size", "9" * 23, SCRIPT], "not in the range"),
        (["submit", "--min-gpus", "٢", SCRIPT], "is not an integer"),
        (["submit", "--min-gpus", "1", "--epochs", "0", SCRIPT], "not in the range 1..1000000"),
        (["submit", "--min-gpus", "1", "--epochs", "90.5", SCRIPT], "is not an integer"),
        (["submit", "--min-gpus", "1", "--dataset-size", "1e6", SCRIPT], "is not an integer"),
        (
            ["submit", "--min-gpus", "1", "--dataset-size", str(10**12 + 1), SCRIPT],
            "not in the range 1..1000000000000",
        ),
        (["controller", "--state-dir", SCRIPT], "is not a directory"),
        (["controller", "--nodes", "n1;reboot"], "invalid list"),
    ],
)
def test_bad_values_found_by_hand_exit_2(no_slurm: Path, args: list[str], needle: str) -> None:
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2, result.output
    assert needle in error_line(result.stderr)
    assert len([ln for ln in result.stderr.splitlines() if ln.startswith("Error")]) == 1


@pytest.mark.parametrize("value", ["UNLIMITED", "infinite", "90", "1:30", "2:00:00", "1-12"])
def test_slurm_time_formats_are_accepted(no_slurm: Path, value: str) -> None:
    result = CliRunner().invoke(main, ["submit", "--min-gpus", "1", "--time", value, SCRIPT])
    assert result.exit_code == 1  # refused only for want of Slurm
    assert "not found: is Slurm installed" in error_line(result.stderr)


def test_metrics_on_an_address_that_is_not_local(tmp_path: Path) -> None:
    from hpcorch.controller.store import Store

    Store(tmp_path / "state.db").close()
    argv = ["metrics", "--listen", "39999", "--address", "192.0.2.1", "--state-dir", str(tmp_path)]
    result = CliRunner().invoke(main, argv)
    assert result.exit_code == 1
    assert "cannot serve on 192.0.2.1:39999" in error_line(result.stderr)


@pytest.mark.skipif(not shutil.which("sinfo"), reason="Slurm's commands are not installed")
@pytest.mark.parametrize("kind", ["binary", "missing", "empty"])
def test_a_bad_slurm_conf_is_one_line_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    conf = tmp_path / "slurm.conf"
    if kind == "binary":
        conf.write_bytes(bytes(range(256)) * 4)
    monkeypatch.setenv("SLURM_CONF", "" if kind == "empty" else str(conf))
    monkeypatch.setenv("HPCORCH_HOME", str(tmp_path / "home"))
    t0 = time.monotonic()
    result = CliRunner().invoke(main, ["submit", "--min-gpus", "1", SCRIPT])
    assert time.monotonic() - t0 < 10
    assert result.exit_code == 1
    line = error_line(result.stderr)
    assert "SLURM_CONF" in line or "sinfo failed" in line, line
    assert not (tmp_path / "home").exists()


SECOND_USER = """
import os, sys
import click, sqlite3, hpcorch.cli, hpcorch.cli.jobs, hpcorch.cli.controller
import hpcorch.controller.store, hpcorch.controller.prom, hpcorch.status
from click.testing import CliRunner
for cmd in ("status", "describe", "metrics"):  # import what error paths import, while we can
    CliRunner().invoke(hpcorch.cli.main, [cmd, "--state-dir", "/dev/null"])
    CliRunner().invoke(hpcorch.cli.main, [cmd, "--state-dir", "/nonexistent", "1"])
os.setgid(65534)
os.setuid(65534)  # nobody, from here on
r = CliRunner().invoke(hpcorch.cli.main, sys.argv[1:])
print(r.exit_code)
print(r.stderr, end="")
print("EXCEPTION" if r.exception and not isinstance(r.exception, SystemExit) else "")
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as a second user")
@pytest.mark.parametrize(
    "args", [["status"], ["describe", "1"], ["metrics"], ["metrics", "--listen", "39998"]]
)
@pytest.mark.parametrize("private", ["directory", "database"])
def test_second_user_on_the_controllers_state_is_one_line(
    tmp_path: Path, args: list[str], private: str
) -> None:
    from hpcorch.controller.store import Store

    state = tmp_path / "ctl"
    Store(state / "state.db").close()
    (state if private == "directory" else state / "state.db").chmod(0o700)
    if private == "database":  # and no controller answers on its socket
        state.chmod(0o755)
    tmp_path.chmod(0o755)
    env = {**os.environ, "PATH": "/nonexistent", "HPCORCH_HOME": str(tmp_path / "h")}
    res = subprocess.run(
        [sys.executable, "-c", SECOND_USER, *args, "--state-dir", str(state)],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    code, *rest = res.stdout.splitlines()
    assert code in ("1", "2"), res.stdout + res.stderr
    assert "EXCEPTION" not in rest and "Traceback" not in res.stdout + res.stderr
    errors = [ln for ln in rest if ln.startswith("Error")]
    assert len(errors) == 1 and "permission denied" in errors[0].lower(), rest
