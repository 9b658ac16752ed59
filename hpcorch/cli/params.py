"""Shared click parameter types: every value a user types is checked here, once.

Use them for every new option, so that bad input gets one clear ``Error:`` line and a
non-zero exit instead of a traceback, a hang or silent acceptance:

    @click.option("--gpus", type=params.Integer(1, 4096))
    @click.option("--interval", type=params.Number(0.1, 86400.0), default=10.0)
    @click.option("--time", type=params.DURATION)           # Slurm's formats, UNLIMITED
    @click.option("--stop-signal", type=params.SIGNAL)       # TERM, SIGTERM or 15
    @click.argument("job_id", type=params.JOB_ID)            # ASCII digits, bounded
    @click.option("--state-dir", type=params.StateDir())     # a directory, or none yet

Each type carries ``bad_examples``: values it must refuse. The CLI's fuzz test
(tests/test_cli_fuzz.py) finds every command and option by introspection and feeds them
these, so an option added later is covered as soon as it uses a type from here.

Numbers are ASCII only: Python's ``int()`` and ``float()`` accept other scripts' digits
('٣' is 3), underscores, 'nan' and 'inf', which no user means on a command line.
"""

from __future__ import annotations

import math
import os
import re
import signal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from hpcorch.timefmt import DurationError
from hpcorch.timefmt import parse_duration as _parse_duration

if TYPE_CHECKING:  # click >= 8.2 types ParamType by its value; 8.1 cannot subscript it
    _IntParam = click.ParamType[int]
    _FloatParam = click.ParamType[float]
    _StrParam = click.ParamType[str]
else:
    _IntParam = _FloatParam = _StrParam = click.ParamType

_INT_RE = re.compile(r"[+-]?[0-9]+\Z")
_FLOAT_RE = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?\Z")

MAX_JOB_ID = 4_294_967_293
"""Slurm job ids are 32-bit; the top values mean 'no value' / 'infinite' in Slurm."""
MAX_BATCH = 2**31 - 1
"""The largest global batch (or micro-batch) hpcorch accepts: it is stored and planned
as a 64-bit integer, and no training run means more samples per step."""
MAX_GPUS = 65536
MAX_SECONDS = 365 * 86400.0
"""Bound of any interval or delay option: a year."""

_COMMON_BAD_NUMBERS = ("nan", "inf", "-inf", "", " ", "١", "1_0", "0x10", "1e999", "\x00")


class Integer(_IntParam):
    """An integer in [lo, hi], written with ASCII digits."""

    name = "integer"

    def __init__(self, lo: int, hi: int, *, metavar: str | None = None) -> None:
        if lo > hi:
            raise ValueError(f"empty range [{lo}, {hi}]")
        self.lo, self.hi = lo, hi
        self.metavar = metavar
        self.bad_examples: tuple[str, ...] = (
            *_COMMON_BAD_NUMBERS,
            "1.5",
            "two",
            "٣",
            str(lo - 1),
            str(hi + 1),
            "9" * 40,
        )

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str | None:
        return self.metavar or f"INTEGER {self.lo}..{self.hi}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        if isinstance(value, int) and not isinstance(value, bool):
            number = value
        else:
            text = str(value).strip()
            if not _INT_RE.match(text) or len(text) > 30:
                self.fail(f"{_show(value)} is not an integer", param, ctx)
            number = int(text)
        if not self.lo <= number <= self.hi:
            self.fail(f"{_show(value)} is not in the range {self.lo}..{self.hi}", param, ctx)
        return number

    def __repr__(self) -> str:
        return f"Integer({self.lo}, {self.hi})"


class Number(_FloatParam):
    """A finite decimal number in [lo, hi] (ASCII; no nan, no inf, no hex)."""

    name = "number"

    def __init__(self, lo: float, hi: float) -> None:
        if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi:
            raise ValueError(f"bad range [{lo}, {hi}]")
        self.lo, self.hi = lo, hi
        self.bad_examples: tuple[str, ...] = (
            *_COMMON_BAD_NUMBERS,
            "NaN",
            "Infinity",
            "two",
            "٣",
            "1e400",
            f"{hi * 10 + 1:g}",
            f"{lo - 1:g}",
        )

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str | None:
        return f"SECONDS {self.lo:g}..{self.hi:g}" if self.hi == MAX_SECONDS else "NUMBER"

    def convert(
        self, value: Any, param: click.Parameter | None, ctx: click.Context | None
    ) -> float:
        if isinstance(value, int | float) and not isinstance(value, bool):
            number = float(value)
        else:
            text = str(value).strip()
            if not _FLOAT_RE.match(text) or len(text) > 40:
                self.fail(f"{_show(value)} is not a number", param, ctx)
            number = float(text)
        if not math.isfinite(number) or not self.lo <= number <= self.hi:
            self.fail(f"{_show(value)} is not in the range {self.lo:g}..{self.hi:g}", param, ctx)
        return number

    def __repr__(self) -> str:
        return f"Number({self.lo}, {self.hi})"


class JobIdType(Integer):
    """A Slurm job id: ASCII digits, 1 .. 4294967293 (no array or het-job suffixes)."""

    name = "job_id"

    def __init__(self) -> None:
        super().__init__(1, MAX_JOB_ID, metavar="JOB_ID")
        self.bad_examples = (*self.bad_examples, "12_3", "12+1", "-5", "٣")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        text = str(value).strip()
        if isinstance(value, str) and re.fullmatch(r"[0-9]+[_+][0-9]+", text):
            self.fail(
                f"{_show(value)}: array and heterogeneous job ids are not hpcorch jobs", param, ctx
            )
        if isinstance(value, str) and not (text.isascii() and text.isdigit()):
            self.fail(f"{_show(value)} is not a job id (ASCII digits 0-9 only)", param, ctx)
        return super().convert(value, param, ctx)


def parse_duration(text: str) -> int | None:
    """Slurm's time formats -> seconds, None for UNLIMITED (hpcorch.timefmt); ValueError."""
    return _parse_duration(text)


class Duration(_StrParam):
    """A Slurm time limit (see :func:`parse_duration`); the value is the text, stripped
    (UNLIMITED as 'UNLIMITED'), for Slurm to read."""

    name = "duration"
    bad_examples = (
        "25:99:99",
        "1-25",
        "1:60",
        "soon",
        "-5",
        "nan",
        "٣",
        "1:2:3:4",
        "",
        "9" * 12,
        "1--2",
        "99999-0",
    )

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str | None:
        return "TIME"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        what = param.opts[0] if isinstance(param, click.Option) and param.opts else "time limit"
        try:
            seconds = _parse_duration(text, what)
        except DurationError as exc:
            self.fail(str(exc), param, ctx)
        if seconds == 0:
            self.fail(f"{_show(value)}: a time limit of 0 is no time at all", param, ctx)
        return "UNLIMITED" if seconds is None else text


class SignalType(_StrParam):
    """A signal by name (TERM, SIGTERM, term) or number (15); the value is its name
    without SIG. KILL and STOP cannot be caught and are refused unless ``catchable=False``."""

    name = "signal"
    bad_examples = ("999", "0", "-1", "SIGNOPE", "", "٣", "KILL", "9", "USR2,", "nan", "65")

    def __init__(self, catchable: bool = True) -> None:
        self.catchable = catchable

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str | None:
        return "SIGNAL"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            sig = signal_of(str(value))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
        if self.catchable and sig in (signal.SIGKILL, signal.SIGSTOP):
            self.fail(f"{sig.name} cannot be caught: the script could not checkpoint", param, ctx)
        return sig.name.removeprefix("SIG")


def signal_of(text: str) -> signal.Signals:
    """TERM, SIGTERM, term or 15 -> the signal; ValueError naming the valid forms."""
    name = text.strip().upper()
    if name.isascii() and name.isdigit() and len(name) < 4:
        try:
            return signal.Signals(int(name))
        except ValueError:
            pass
    elif name.isascii() and re.fullmatch(r"[A-Z0-9+]{1,12}", name):
        try:
            return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
        except KeyError:
            pass
    raise ValueError(
        f"unknown signal {_show(text)}: give a name such as TERM, USR2 or SIGINT, or its "
        f"number (1-{int(signal.SIGRTMAX)})"
    )


class StateDir(_StrParam):
    """A directory path: it may not exist yet (``must_exist=False``), but when it exists it
    must be a directory this user can enter (and, with ``writable``, write). Entering is
    enough to read a file by name: the controller's state directory is 0711, users may not
    list it."""

    name = "directory"

    def __init__(self, writable: bool = False) -> None:
        self.writable = writable
        self.bad_examples = ("/dev/null", "/etc/hostname", "", "a\x00b")

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str | None:
        return "DIR"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        if not text.strip():
            self.fail("an empty path is no directory", param, ctx)
        if "\x00" in text:
            self.fail(f"{_show(text)} contains a NUL byte", param, ctx)
        try:
            path = Path(text).expanduser()
        except RuntimeError:  # ~user of no user
            self.fail(f"{_show(text)}: no such user's home directory", param, ctx)
        try:
            exists = path.exists()
            is_dir = path.is_dir()
        except OSError as exc:
            self.fail(f"{_show(text)}: {exc.strerror}", param, ctx)
        if exists and not is_dir:
            self.fail(f"{_show(text)} is not a directory", param, ctx)
        if is_dir and not os.access(path, os.X_OK):
            self.fail(f"cannot read {_show(text)}: permission denied", param, ctx)
        if is_dir and self.writable and not os.access(path, os.W_OK):
            self.fail(f"cannot write in {_show(text)}: permission denied", param, ctx)
        return str(path)


class Name(_StrParam):
    """A name from a safe alphabet: 1..64 letters, digits and ``_ . + -``, starting with a
    letter or a digit (Slurm's job, partition and reservation names; user names)."""

    name = "name"
    bad_examples = ("", "my job", "a,b", "a=b", "x" * 65, "-rf", "ä", "a\nb", "a;b", "..")

    def __init__(self, what: str = "name", max_len: int = 64) -> None:
        self.what = what
        self.max_len = max_len

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value)
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.+-]*", text) or len(text) > self.max_len:
            self.fail(
                f"invalid {self.what} {_show(text)}: use 1-{self.max_len} letters, digits and "
                "_ . + - (starting with a letter or digit)",
                param,
                ctx,
            )
        return text


class PathType(click.Path):
    """click.Path that first refuses what the OS cannot take: an empty path, a NUL byte,
    a path longer than PATH_MAX (click.Path itself raises ValueError on a NUL)."""

    bad_examples = ("", "\x00", "a\x00b", "x" * 5000)

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        text = os.fsdecode(value) if isinstance(value, bytes | os.PathLike) else str(value)
        if not text:
            self.fail("an empty path names no file", param, ctx)
        if "\x00" in text:
            self.fail(f"{_show(text)} contains a NUL byte", param, ctx)
        if len(os.fsencode(text)) >= 4096 or any(len(c) > 255 for c in Path(text).parts):
            self.fail(f"{_show(text)} is too long for a path", param, ctx)
        return super().convert(value, param, ctx)


class ScriptPath(PathType):
    """A command's SCRIPT argument: an existing file. A word that starts with ``-`` is an
    option the command does not have (with ``ignore_unknown_options`` click would take it
    for the script): named as such, with the closest options it does have."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value.startswith("-") and value != "-":
            known = sorted(
                o for p in (ctx.command.params if ctx else []) for o in p.opts if o.startswith("-")
            )
            raise click.NoSuchOption(value.split("=", 1)[0], possibilities=known, ctx=ctx)
        return super().convert(value, param, ctx)


class NameList(_StrParam):
    """Comma-separated names (users, nodes); with ``hostlist``, Slurm's ranges such as
    ``n[1-4],gpu-a[001-004]`` are allowed too."""

    name = "names"
    bad_examples = ("", ",", "a,,b", "a b", "a;b", "$(id)", "ä", "a\x00")

    def __init__(self, hostlist: bool = False, max_len: int = 4096) -> None:
        self.hostlist = hostlist
        self.max_len = max_len
        self.item = re.compile(
            r"[A-Za-z0-9_][A-Za-z0-9_.-]*(\[[0-9]+(-[0-9]+)?(,[0-9]+(-[0-9]+)?)*\][A-Za-z0-9_.-]*)?"
            if hostlist
            else r"@?[A-Za-z0-9_][A-Za-z0-9_.-]*"  # @name: a group
        )

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        text = str(value).strip()
        items = _split_outside_brackets(text) if self.hostlist else text.split(",")
        if len(text) > self.max_len or not all(self.item.fullmatch(i) for i in items):
            what = "node names or ranges (n[1-4])" if self.hostlist else "names"
            self.fail(
                f"invalid list {_show(value)}: comma-separated {what} of letters, digits and _ . -",
                param,
                ctx,
            )
        return text


def _split_outside_brackets(text: str) -> list[str]:
    items, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "," and depth == 0:
            items.append(cur)
            cur = ""
        else:
            cur += ch
    return [*items, cur]


class Address(_StrParam):
    """A local address to listen on: an IP address, or a host name."""

    name = "address"
    bad_examples = ("", "::::", "a b", "256.1.1.1x", "$(id)", "ä")

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        import ipaddress

        text = str(value).strip()
        try:
            return str(ipaddress.ip_address(text))
        except ValueError:
            pass
        if not re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9.-]{0,252}[A-Za-z0-9])?", text) or (
            re.fullmatch(r"[0-9.]+", text)
        ):
            self.fail(f"{_show(value)} is neither an IP address nor a host name", param, ctx)
        return text


def _show(value: Any) -> str:
    """A value quoted for an error message: printable, bounded."""
    text = repr(str(value))
    return text if len(text) <= 60 else text[:57] + "...'"


JOB_ID = JobIdType()
DURATION = Duration()
SIGNAL = SignalType()
GPUS = Integer(1, MAX_GPUS)
BATCH = Integer(1, MAX_BATCH)
SECONDS = Number(0.0, MAX_SECONDS)
SEED = Integer(0, 2**32 - 1)
