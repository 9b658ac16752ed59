"""Logging through stdlib ``logging`` (hpcorch/logsetup.py) and the controller's TOML
configuration file (hpcorch/cli/config.py)."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from hpcorch import logsetup
from hpcorch.cli.config import config_keys
from hpcorch.cli.controller import controller
from hpcorch.controller.loop import _log, _warn

TEXT_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3} ")


@pytest.fixture(autouse=True)
def _restore_logging() -> object:
    logger = logging.getLogger("hpcorch")
    saved = (list(logger.handlers), logger.level, logger.propagate)
    yield None
    logger.handlers[:], logger.level, logger.propagate = saved[0], saved[1], saved[2]


def test_text_lines_have_a_time_and_the_level_unless_info(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logsetup.configure("hpcorch-controller", "info", "text")
    _log("job 12 started")
    _warn("job 12: start failed: sbatch said no")
    logging.getLogger("hpcorch.controller").debug("not shown at level info")
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(TEXT_RE.match(line) for line in lines)
    assert lines[0].endswith(" hpcorch-controller: job 12 started")
    assert lines[1].endswith(" hpcorch-controller: warning: job 12: start failed: sbatch said no")


def test_json_lines_carry_level_and_the_slurm_job(capsys: pytest.CaptureFixture[str]) -> None:
    logsetup.configure("hpcorch-controller", "debug", "json")
    _warn("job 7 ignored its stop signal")
    logging.getLogger("hpcorch.controller").debug('a "quoted"\nline')
    first, second = (json.loads(x) for x in capsys.readouterr().err.splitlines())
    assert first["level"] == "warning" and first["slurm_job_id"] == 7
    assert first["prog"] == "hpcorch-controller" and first["logger"] == "hpcorch.controller"
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", first["time"])
    assert second["message"] == 'a "quoted"\nline' and "slurm_job_id" not in second


def test_environment_and_bad_values() -> None:
    logger = logsetup.configure("x", env={"HPCORCH_LOG_LEVEL": "WARNING"})
    assert logger.level == logging.WARNING
    with pytest.raises(logsetup.LogSetupError, match=r"valid: debug, info, warning, error"):
        logsetup.configure("x", "loud")
    with pytest.raises(logsetup.LogSetupError, match=r"valid: text, json"):
        logsetup.configure("x", fmt="xml")


def test_ensure_keeps_the_applications_handler(capsys: pytest.CaptureFixture[str]) -> None:
    logger = logging.getLogger("hpcorch")
    logger.handlers[:] = []
    mine = logging.StreamHandler()
    logger.addHandler(mine)
    assert logsetup.ensure("hpcorch") is logger and logger.handlers == [mine]


def _params(*argv: str) -> dict[str, object]:
    ctx = controller.make_context("controller", list(argv))
    return dict(ctx.params)


def test_config_file_sets_options_and_flags_override(tmp_path: Path) -> None:
    conf = tmp_path / "controller.toml"
    conf.write_text(
        'reservation = "dl-pool"\ninterval = 5\nrestart_cost = 45.5\n'
        'users = ["hpcorch", "@dl-users"]\nlog-format = "json"\n'
    )
    p = _params("--config", str(conf), "--interval", "2")
    assert p["reservation"] == "dl-pool" and p["interval"] == 2.0
    assert p["restart_cost"] == 45.5 and p["users"] == "hpcorch,@dl-users"
    assert p["log_format"] == "json" and p["round_s"] == 60.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "bogus = 1\n",
            "unknown key 'bogus' in .*controller.toml \\(valid: fast-interval, grace, interval",
        ),
        ('interval = "abc"\n', "interval = 'abc': 'abc' is not a number"),
        ("interval = 0.01\n", "'0.01' is not in the range 0.1..3600"),
        ('policy = "best"\n', "'best' is not one of"),
        ("once = true\n", "unknown key 'once'"),
        ("[section]\nx = 1\n", "unknown key 'section'"),
        ("interval = [\n", "is not valid TOML"),
    ],
)
def test_bad_config_is_one_clear_error(tmp_path: Path, text: str, message: str) -> None:
    conf = tmp_path / "controller.toml"
    conf.write_text(text)
    res = CliRunner().invoke(controller, ["--config", str(conf)])
    assert res.exit_code == 2 and "Traceback" not in res.output
    error = [line for line in res.output.splitlines() if line.startswith("Error:")]
    assert len(error) == 1 and re.search(message, error[0]), res.output


def test_every_option_but_once_is_a_key() -> None:
    keys = config_keys(controller)
    longs = {
        o[2:]
        for p in controller.params
        if isinstance(p, click.Option)
        for o in p.opts
        if o.startswith("--")
    }
    assert set(keys) == longs - {"once", "config", "help"}


def test_the_shipped_example_configuration_parses() -> None:
    example = Path(__file__).resolve().parent.parent / "slurm" / "hpcorch-controller.toml"
    p = _params("--config", str(example))
    assert p["reservation"] == "hpcorch" and p["state_dir"] == "/var/lib/hpcorch/controller"
