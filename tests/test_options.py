"""sbatch options passed through hpcorch: validation, rendering (golden file), the
pyslurm mapping, SBATCH_* variables, and Slurm's durations."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hpcorch.errors import SlurmCommandError
from hpcorch.slurm.backend import SlurmCLI
from hpcorch.slurm.options import (
    OptionError,
    env_defaults,
    ignored_env,
    make_options,
    without_sbatch_env,
)
from hpcorch.slurm.pyslurm_backend import submit_options
from hpcorch.slurm.script import render_batch_script
from hpcorch.timefmt import DurationError, fmt_duration, parse_duration, slurm_minutes
from tests.test_script import spec

GOLDEN_OPTIONS = Path(__file__).parent / "golden" / "batch_script_options.sbatch"


def all_options() -> tuple[str, ...]:
    return tuple(
        make_options(
            account="proj-a1",
            qos="high",
            mem="32g",
            constraint="a100&ib",
            mail_type="end,fail",
            mail_user="ada@example.org",
            dependency="afterok:12:13",
            exclusive=True,
            extra=("--mem-per-cpu=2G", "--licenses=matlab:1", "--nice=10"),
        ).sbatch_lines()
    )


def test_every_option_is_rendered_as_an_sbatch_line() -> None:
    text = render_batch_script(
        spec(slurm_options=all_options(), time_budget_s=86400, max_relaunches=5)
    )
    if os.environ.get("HPCORCH_UPDATE_GOLDEN"):
        GOLDEN_OPTIONS.write_text(text)
    assert text == GOLDEN_OPTIONS.read_text()
    assert "#SBATCH --account=proj-a1\n#SBATCH --qos=high\n#SBATCH --mem=32G\n" in text
    assert ",budget=86400,relaunches=5" in text
    assert "export HPCORCH_TIME_BUDGET=86400\nexport HPCORCH_MAX_RELAUNCHES=5\n" in text


def test_the_pyslurm_backend_maps_every_option() -> None:
    opts = submit_options(GOLDEN_OPTIONS.read_text())
    assert opts["account"] == "proj-a1" and opts["qos"] == "high"
    assert opts["memory_per_node"] == "32G" and opts["memory_per_cpu"] == "2G"
    assert opts["constraints"] == "a100&ib"
    assert opts["mail_types"] == ["END", "FAIL"] and opts["mail_user"] == "ada@example.org"
    assert opts["dependencies"] == "afterok:12:13"
    assert opts["resource_sharing"] == "exclusive"
    assert opts["licenses"] == ["matlab:1"] and opts["nice"] == "10"


def test_the_pyslurm_backend_names_an_option_it_cannot_submit() -> None:
    with pytest.raises(SlurmCommandError) as err:
        submit_options("#!/bin/bash\n#SBATCH --gpu-bind=closest\n")
    msg = str(err.value)
    assert "\n" not in msg
    assert msg.startswith("pyslurm backend cannot submit sbatch option '--gpu-bind'")
    assert "HPCORCH_SLURM_BACKEND=cli" in msg


@pytest.mark.parametrize(
    ("kw", "needle"),
    [
        ({"account": "a b"}, "invalid --account 'a b'"),
        ({"account": "x;rm"}, "invalid --account"),
        ({"qos": "hi\n"}, "invalid --qos"),
        ({"mem": "lots"}, "invalid --mem 'lots'"),
        ({"mem": "1e3G"}, "invalid --mem"),
        ({"mem": "١٢G"}, "invalid --mem"),  # not ASCII digits
        ({"constraint": "a b"}, "invalid --constraint"),
        ({"mail_type": "END,SOMETIMES"}, "invalid --mail-type 'SOMETIMES'"),
        ({"mail_user": "a b@c"}, "invalid --mail-user"),
        ({"dependency": "afterok:x"}, "invalid --dependency"),
        ({"dependency": "afterok:١"}, "invalid --dependency"),
        ({"dependency": "before:1"}, "invalid --dependency"),
        ({"extra": ("--gres=gpu:8",)}, "hpcorch sets --gres itself"),
        ({"extra": ("--nodes=2",)}, "hpcorch sets --nodes itself"),
        ({"extra": ("--ntasks=4",)}, "hpcorch sets --ntasks itself"),
        ({"extra": ("--comment=mine",)}, "hpcorch sets --comment itself"),
        ({"extra": ("--account=x",)}, "use hpcorch's --account"),
        ({"extra": ("--hint=nomultithread",)}, "hpcorch does not pass --hint on"),
        ({"extra": ("--reserv=POOL",)}, "sbatch reads --reserv as --reservation"),
        ({"extra": ("--mem-per-g=10G",)}, "spell it out: --mem-per-gpu"),
        ({"extra": ("--licenses", "--hold")}, "--licenses needs a value"),
        ({"extra": ("-A", "x")}, "long form"),
        ({"extra": ("--mem-per-gpu=1 0G",)}, "no spaces or quotes"),
        ({"extra": ("--mem-per-gpu='10G'",)}, "no spaces or quotes"),
        ({"extra": ("--begin=now", "--begin=now")}, "given twice"),
        ({"extra": ("--Bad_Name=1",)}, "not an sbatch option name"),
        ({"extra": ("--exclude=n1",), "pooled": True}, "not for a job in a pool"),
        ({"exclusive": True, "pooled": True}, "--exclusive is not for a job in a pool"),
        ({"dependency": "afterok:1", "pooled": True}, "--dependency is not for a job in a pool"),
    ],
)
def test_bad_options_get_one_clear_error(kw: dict[str, object], needle: str) -> None:
    with pytest.raises(OptionError) as err:
        make_options(**kw)  # type: ignore[arg-type]
    assert needle in str(err.value) and "\n" not in str(err.value)


def test_good_options_are_normalised() -> None:
    o = make_options(mem="500m", mail_type="all", dependency="afterany:1?afterok:2_3+5")
    assert o.sbatch_lines() == [
        "--mem=500M",
        "--mail-type=ALL",
        "--dependency=afterany:1?afterok:2_3+5",
    ]
    # an address alone means mail at the end and on failure
    assert make_options(mail_user="ada").mail_type == "END,FAIL"
    assert make_options(extra=("--exclude=n1", "--mem-per-gpu=10G")).extra == (
        "--exclude=n1",
        "--mem-per-gpu=10G",
    )


def test_sbatch_variables_are_deliberate() -> None:
    env = {
        "SBATCH_ACCOUNT": "proj",
        "SBATCH_QOS": "high",
        "SBATCH_GRES": "gpu:8",
        "SBATCH_RESERVATION": "other",
        "PATH": "/bin",
    }
    assert env_defaults(env) == {"account": "proj", "qos": "high"}
    assert ignored_env(env) == ["SBATCH_GRES", "SBATCH_RESERVATION"]
    assert without_sbatch_env(env) == {"PATH": "/bin"}


def test_sbatch_runs_without_sbatch_variables(tmp_path: Path) -> None:
    """A stand-in sbatch records its environment: no SBATCH_* reaches it."""
    fake = tmp_path / "sbatch"
    fake.write_text('#!/bin/sh\n/usr/bin/env > "$0.env"\n/bin/cat > /dev/null\necho 42\n')
    fake.chmod(0o755)
    cli = SlurmCLI(env={"PATH": str(tmp_path), "SBATCH_GRES": "gpu:8", "SBATCH_ACCOUNT": "a"})
    assert cli.submit("#!/bin/bash\n") == 42
    seen = (tmp_path / "sbatch.env").read_text()
    assert "SBATCH_" not in seen and f"PATH={tmp_path}" in seen


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30", 1800),
        ("1:30", 90),
        ("2:00:00", 7200),
        ("1-12", 129600),
        ("1-02:03", 93780),
        ("1-02:03:04", 93784),
        ("UNLIMITED", None),
        ("infinite", None),
    ],
)
def test_slurm_durations(text: str, seconds: int | None) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["soon", "0", "1:2:3:4", "-5", "1.5", "٣٠", "1-", "99999999"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(DurationError, match="invalid time limit"):
        parse_duration(text)


def test_durations_print_as_squeue_does() -> None:
    assert fmt_duration(0) == "0:00"
    assert fmt_duration(65) == "1:05"
    assert fmt_duration(3723) == "1:02:03"
    assert fmt_duration(93784) == "1-02:03:04"
    assert fmt_duration(86400 + 184) == "1-00:03:04"
    assert fmt_duration(None) == "UNLIMITED"
    assert slurm_minutes(61) == "0:02:00" and slurm_minutes(86400 * 2 + 60) == "2-00:01:00"


def test_a_trailing_newline_cannot_smuggle_an_sbatch_line() -> None:
    """``$`` matches before a final newline: every check must take the whole value."""
    from hpcorch.slurm.script import SpecError, check_name, check_sbatch_path

    with pytest.raises(SpecError):
        check_name("train\n")
    with pytest.raises(SpecError):
        check_sbatch_path("gpu\n", "partition")
    with pytest.raises(OptionError):
        make_options(account="proj\n")
