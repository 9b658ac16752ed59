"""Every command and option of the CLI, fed bad and random values (issue 13, item 6).

Commands and options are found by click introspection, so an option added later is
covered at once. For each option the bad values come from its type: the shared types of
``hpcorch.cli.params`` carry ``bad_examples``; click's own number types and choices get
a fixed list. Each call must exit non-zero with at most one ``Error:`` line (click's usage
lines may precede it), no traceback, within a few seconds, and change nothing on disk.
Free-text options get random text from hypothesis: no traceback, no hang, one line at most.
No Slurm is needed: Slurm's commands are off PATH, so a command that needs Slurm fails
at once with one line.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

import click
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcorch.cli import main, params

TIME_LIMIT_S = 60.0
"""A hang, not a slow machine: a call takes well under a second on an idle one, and the
first simulate call loads the trace data (seconds on a loaded 2-core machine); a call took
over 15 s once while a Slurm pool ran DDP jobs on the same 2 cores."""
BAD_NUMBERS = ("nan", "inf", "-inf", "", "٣", "1_0", "0x10", "1e999", "9" * 40, "-1", "two")
HOSTILE = ("", " ", "\x00", "a\x00b", "$(id)", "'", '"', "\\", "-", "--", "ä", "\udcff",
           "x" * 5000, "../../etc/passwd", "/dev/null", "\n", "%s%n", "{ckpt}",
           "~0", "~nosuchuser/x")  # fmt: skip


NEEDED = {"submit": ("--min-gpus=1",)}
"""Options a command checks in its body, not in click: without them every call would fail
on the missing option before the value under test is looked at."""

HOSTILE_SLURM = ("", " ", "\t", "\x00", "a\x00b", "a\nb", "\n", "\r", "\x1b[2J", "a b",
                 "$(id)", "`id`", "a;id", "'", '"', "#x", "x" * 5000, "ä", "\u200b",
                 "٣", "３")  # fmt: skip
"""Values no Slurm option of ``submit`` may take: they would break the ``#SBATCH`` line
(sbatch reads it without a shell), smuggle a second option in, or are no value at all."""
BAD_COUNTS = ("٣", "３", "1٣", "-1", "1e3", "nan", "0x10", "1.5", "9" * 40)
STRICT_TEXT = {
    "account": HOSTILE_SLURM,
    "qos": HOSTILE_SLURM,
    "mem": HOSTILE_SLURM + BAD_COUNTS,
    "constraint": HOSTILE_SLURM,
    "mail_type": HOSTILE_SLURM,
    "mail_user": HOSTILE_SLURM,
    "dependency": HOSTILE_SLURM,
    "max_relaunches": HOSTILE_SLURM + BAD_COUNTS,
    "sbatch_args": HOSTILE_SLURM + tuple("--mem-per-gpu=" + v for v in HOSTILE_SLURM),
}
"""submit's plain-string options that reach Slurm: each value here must be refused."""
FREE_TEXT = ("a\nb", "$(touch pwned)", "`touch pwned`", "a; touch pwned", "'", '"', "\\",
             "#x", "ä", "\u200b", "\x1b[2J", "a\rb", "x" * 4000, " lead", "a  b")  # fmt: skip
"""Free text (commands, regexes, script arguments) taken as it is: it must reach the job
exactly as given, never run by the batch script's shell."""


class Hang(BaseException):
    """Raised by the alarm: a BaseException, so that no handler of the CLI swallows it."""


def _alarm(signum: int, frame: FrameType | None) -> None:
    raise Hang(f"no answer within {TIME_LIMIT_S} s")


@dataclass
class Case:
    command: str
    param: str
    value: str
    argv: list[str]
    must_fail: bool


@dataclass
class Tally:
    calls: int = 0
    tracebacks: list[str] = field(default_factory=list)
    hangs: list[str] = field(default_factory=list)
    silent: list[str] = field(default_factory=list)
    lines: list[str] = field(default_factory=list)
    disk: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        return self.tracebacks + self.hangs + self.silent + self.lines + self.disk


def commands() -> dict[str, click.Command]:
    ctx = click.Context(main)
    group = main
    assert isinstance(group, click.Group)
    found = {}
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        assert cmd is not None
        found[name] = cmd
    return found


def good_value(p: click.Parameter, home: Path) -> str:
    """A value the parameter accepts, so that the one under test is what fails."""
    t = p.type
    if isinstance(t, params.Integer):
        return str(max(t.lo, 1) if t.hi >= 1 else t.lo)
    if isinstance(t, params.Number):
        return f"{max(t.lo, min(1.0, t.hi)):g}"
    if isinstance(t, params.Duration):
        return "10"
    if isinstance(t, params.SignalType):
        return "TERM"
    if isinstance(t, click.Choice):
        return str(t.choices[0])
    if isinstance(t, click.IntRange | click.FloatRange):
        return str(t.min if t.min is not None else 1)
    if isinstance(t, click.Path) and t.exists:
        return str(home / "train.py")
    if isinstance(t, click.Path | params.StateDir):
        return str(home / "given")
    return "x"


def bad_values(p: click.Parameter) -> tuple[tuple[str, ...], bool]:
    """(values to try, whether each must be refused)."""
    t = p.type
    examples = getattr(t, "bad_examples", None)
    if examples is not None:
        return tuple(examples), True
    if isinstance(t, click.Choice):
        return ("", "nope", "٣", "\x00"), True
    if isinstance(t, click.types.IntParamType | click.types.FloatParamType):
        return BAD_NUMBERS, True  # not bounded by a shared type: nan, huge, other digits
    return HOSTILE, False


def options(cmd: click.Command) -> list[click.Parameter]:
    return [
        p
        for p in cmd.params
        if not (isinstance(p, click.Option) and (p.is_flag or p.name == "help"))
    ]


def argv_for(name: str, cmd: click.Command, target: click.Parameter, value: str, home: Path):
    """The command line with ``target`` set to ``value`` and every other required
    parameter set to a good value: options first (``--opt=value``), then the arguments
    after ``--``."""
    opts: list[str] = []
    args: list[str] = []
    for p in cmd.params:
        if isinstance(p, click.Option):
            if p is target:
                opts.append(f"{p.opts[0]}={value}")
            elif p.required:
                opts.append(f"{p.opts[0]}={good_value(p, home)}")
        elif isinstance(p, click.Argument):
            if p is target:
                args.append(value)
            elif p.required:
                args.append(good_value(p, home))
    opts = [*NEEDED.get(name, ()), *opts]
    return [name, *opts, "--", *args] if args else [name, *opts]


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in dirnames + filenames:
            path = Path(dirpath) / n
            st_ = path.lstat()
            out[str(path.relative_to(root))] = (st_.st_size, st_.st_mtime_ns)
    return out


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No Slurm on PATH, HPCORCH_HOME and the working directory in tmp, a script there."""
    (tmp_path / "bin").mkdir()
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("HPCORCH_HOME", str(tmp_path))
    for var in ("HPCORCH_CONTROLLER_DIR", "HPCORCH_POOL", "SLURM_CONF", "HPCORCH_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("import hpcorch.runtime\n")
    old = signal.signal(signal.SIGALRM, _alarm)
    yield tmp_path
    signal.setitimer(signal.ITIMER_REAL, 0)
    signal.signal(signal.SIGALRM, old)


def invoke(argv: list[str]) -> tuple[Result | None, float]:
    """The call's result, None when it did not end within TIME_LIMIT_S."""
    t0 = time.monotonic()
    signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
    try:
        result: Result | None = CliRunner().invoke(main, argv)
    except Hang:
        result = None
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    return result, time.monotonic() - t0


Snapshot = dict[str, tuple[int, int]]


def judge(
    case: Case, result: Result | None, tally: Tally, before: Snapshot | None, root: Path
) -> None:
    tally.calls += 1
    if result is None:
        tally.hangs.append(f"{case.argv!r}: no answer within {TIME_LIMIT_S:.0f} s")
        return
    where = f"{case.argv!r} -> exit {result.exit_code}"
    exc = result.exception
    text = result.stderr + result.output
    if (exc is not None and not isinstance(exc, SystemExit)) or "Traceback" in text:
        tally.tracebacks.append(f"{where}: {type(exc).__name__}: {exc}")
        return
    errors = [ln for ln in result.stderr.splitlines() if ln.startswith("Error")]
    if len(errors) > 1 or any("internal error" in e for e in errors):
        tally.lines.append(f"{where}: {errors}")
    if case.must_fail:
        if result.exit_code == 0:
            tally.silent.append(where)
        elif not errors:
            tally.lines.append(f"{where}: no Error: line in {result.stderr[-300:]!r}")
        if before is not None and snapshot(root) != before:
            tally.disk.append(f"{where}: files changed")


@pytest.mark.parametrize("name", sorted(commands()))
def test_every_option_refuses_bad_values(name: str, sandbox: Path) -> None:
    cmd = commands()[name]
    tally = Tally()
    for p in options(cmd):
        values, must_fail = bad_values(p)
        for value in values:
            argv = argv_for(name, cmd, p, value, sandbox)
            case = Case(name, str(p.name), value, argv, must_fail)
            before = snapshot(sandbox)
            result, _ = invoke(argv)
            judge(case, result, tally, before, sandbox)
    print(
        f"{name}: {tally.calls} calls, {len(tally.tracebacks)} tracebacks, "
        f"{len(tally.hangs)} hangs, {len(tally.silent)} silent accepts"
    )
    assert not tally.problems(), "\n".join(tally.problems()[:20])


def _pairs() -> list[tuple[str, str]]:
    return [(n, str(p.name)) for n, c in sorted(commands().items()) for p in options(c)]


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(pair=st.sampled_from(_pairs()), value=st.text(max_size=40))
def test_random_text_never_crashes_or_hangs(pair: tuple[str, str], value: str,
                                           sandbox: Path) -> None:  # fmt: skip
    name, pname = pair
    cmd = commands()[name]
    p = next(q for q in cmd.params if q.name == pname)
    argv = argv_for(name, cmd, p, value, sandbox)
    tally = Tally()
    result, _ = invoke(argv)
    judge(Case(name, pname, value, argv, False), result, tally, None, sandbox)
    assert not tally.problems(), tally.problems()


def test_every_command_is_covered() -> None:
    """Introspection finds the commands and their options (a guard on the guard)."""
    found = commands()
    assert {"submit", "status", "cancel", "controller", "describe", "metrics"} <= set(found)
    assert sum(len(options(c)) for c in found.values()) >= 40


@pytest.mark.parametrize("pname", sorted(STRICT_TEXT))
def test_slurm_string_options_refuse_hostile_values(pname: str, sandbox: Path) -> None:
    """Each hostile value of a plain-string option that goes to Slurm is refused before
    Slurm is asked (no Slurm is on PATH here: a value let through fails on 'sinfo not
    found' instead), with one Error line naming the option, nothing on disk."""
    cmd = commands()["submit"]
    p = next(q for q in cmd.params if q.name == pname)
    assert isinstance(p, click.Option) and isinstance(p.type, click.types.StringParamType)
    flag = p.opts[0]
    problems = []
    for value in STRICT_TEXT[pname]:
        argv = argv_for("submit", cmd, p, value, sandbox)
        before = snapshot(sandbox)
        result, _ = invoke(argv)
        assert result is not None, f"{argv!r}: no answer"
        errors = [ln for ln in result.stderr.splitlines() if ln.startswith("Error")]
        clean = result.exception is None or isinstance(result.exception, SystemExit)
        ok = result.exit_code != 0 and clean and len(errors) == 1 and flag in errors[0]
        if not ok or snapshot(sandbox) != before:
            problems.append(f"{value[:20]!r}: exit {result.exit_code}, {result.stderr[-200:]!r}")
    assert not problems, f"{flag}:\n" + "\n".join(problems)
    # a good value passes the check and reaches Slurm (here: not installed)
    good = {"mem": "32G", "max_relaunches": "3", "mail_type": "END", "mail_user": "alice",
            "dependency": "afterok:12",
            "sbatch_args": "--mem-per-gpu=20G"}.get(pname, "ml")  # fmt: skip
    result, _ = invoke(argv_for("submit", cmd, p, good, sandbox))
    assert result is not None and "is Slurm installed" in result.stderr, result


def test_free_text_reaches_the_job_as_given(tmp_path: Path) -> None:
    """Commands, regexes and script arguments are free text: the batch script carries each
    one shell-quoted, so bash hands it over byte for byte and runs none of it. NUL, a blank
    command and overlong text are refused with one line."""
    import re
    import shlex
    import subprocess

    from hpcorch.request import RequestError, sidecar_spec
    from hpcorch.slurm.script import JobSpec, render_batch_script

    for value in FREE_TEXT:
        quoted = shlex.quote(value)  # --resume-arg is split like a shell line
        regex = r"(\d+)" + re.escape(value)
        side = sidecar_spec(stop_command=value, resume_args=(quoted,), progress_regex=regex)
        assert side is not None
        spec = JobSpec(
            job_key="t-20260101-000000-abcd", name="t", script="/x/train.py",
            script_args=(value, "--", value), nodes=1, gpus_per_node=1, min_gpus=1,
            max_gpus=1, job_dir="/x/jobs/t", wrapper="/x/run.sbatch", sidecar=side,
        )  # fmt: skip
        text = render_batch_script(spec)
        head, _, command = text.rpartition("\nexec bash ")
        assert command.endswith("\n")
        keys = [k for k, _ in side.env()]
        probe = "\n".join(
            [head, "printf '%s\\0' " + command] + [f"printf '%s\\0' \"${k}\"" for k in keys]
        )
        out = subprocess.run(["bash", "-c", probe], cwd=tmp_path, capture_output=True, check=True)
        got = out.stdout.decode().split("\0")[:-1]
        exported = [v for _, v in side.env()]
        assert got == ["/x/run.sbatch", "/x/train.py", value, "--", value, *exported]
        assert not (tmp_path / "pwned").exists()
    for bad in ("a\0b", " ", "x" * 5000):
        with pytest.raises(RequestError) as err:
            sidecar_spec(stop_command=bad)
        assert "\n" not in str(err.value) and "--stop-command" in str(err.value)
