"""sbatch options that a user passes through hpcorch, validated. Pure.

hpcorch writes every Slurm option of a job as an ``#SBATCH`` line of the batch script it
renders (hpcorch/slurm/script.py), so the script it stores and shows with ``--dry-run`` is
exactly what Slurm gets. A user adds options in two ways:

- named ones (``submit --account/--qos/--mem/--constraint/--mail-type/--mail-user/
  --dependency/--exclusive``), each checked against Slurm's own format;
- a few other sbatch options with ``--sbatch-arg=--NAME[=VALUE]`` (repeatable): only the
  full names in :data:`PASSED`. The others are refused with one line saying why: hpcorch
  owns the option (GPUs, nodes, tasks, the comment, the output file, ...: :data:`OWNED`),
  or it changes where or how the job runs (the CPUs, the cluster, the user, ...).

Why full names only: sbatch reads its options, ``#SBATCH`` lines included, with glibc's
getopt_long, which takes any unique prefix of a long option (``--reserv=POOL`` is
``--reservation=POOL``), one-letter options (``-p``), and a required value from the next
argument; and all of a script's ``#SBATCH`` lines are one argument list, so a bare
``--licenses`` would take hpcorch's next line (``--hold``, ``--output=...``) as its value.
A refused spelling names the option sbatch would read it as, worked out over the long
options of sbatch 22.05 to 25.11 (``hpcorch.slurm.sbatch_names``).

Values are checked, not quoted: sbatch reads ``#SBATCH`` lines without a shell, so a
value must not hold white space, quotes, ``#`` or control characters.

``SBATCH_*`` environment variables: sbatch lets them override a script's ``#SBATCH``
lines, so an inherited ``SBATCH_GRES`` or ``SBATCH_RESERVATION`` would silently undo
what hpcorch decided. hpcorch therefore runs sbatch without any ``SBATCH_*`` variable,
and takes the ones in :data:`ENV_DEFAULTS` (account, QOS, partition, time, ...) as the
defaults of its own options, rendered into the script like any option; the others are
ignored with a note (:func:`ignored_env`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hpcorch.slurm.sbatch_names import SBATCH_LONG_OPTIONS, SBATCH_RELEASES, SBATCH_SHORT_OPTIONS

SAFE_VALUE_RE = re.compile(r"^[A-Za-z0-9_.,:@%+=/()\[\]|&*!?~^-]{1,1024}$")
OPTION_NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,39}$")
ACCOUNT_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+-]{0,63}$")
MEM_RE = re.compile(r"^[0-9]{1,12}[KMGTkmgt]?$")
CONSTRAINT_RE = re.compile(r"^[A-Za-z0-9_.\-&|,*\[\]():!]{1,512}$")
MAIL_USER_RE = re.compile(r"^[A-Za-z0-9._%+-]{1,64}(@[A-Za-z0-9.-]{1,253})?$")
DEPENDENCY_TYPES = (
    "after",
    "afterany",
    "afterburstbuffer",
    "aftercorr",
    "afternotok",
    "afterok",
)
_DEP_ITEM_RE = re.compile(
    r"^(?:singleton|(?:" + "|".join(DEPENDENCY_TYPES) + r")(?::[0-9]{1,10}(?:_[0-9]{1,10})?"
    r"(?:\+[0-9]{1,10})?)+)$"
)
MAIL_TYPES = (
    "NONE",
    "BEGIN",
    "END",
    "FAIL",
    "REQUEUE",
    "ALL",
    "INVALID_DEPEND",
    "STAGE_OUT",
    "TIME_LIMIT",
    "TIME_LIMIT_90",
    "TIME_LIMIT_80",
    "TIME_LIMIT_50",
    "ARRAY_TASKS",
)

OWNED: dict[str, str] = {
    "job-name": "use hpcorch's --name",
    "partition": "use hpcorch's --partition",
    "time": "use hpcorch's --time (and --time-total)",
    "reservation": "the pool is the reservation: use --pool",
    "nodes": "hpcorch chooses the nodes from --min-gpus/--max-gpus",
    "ntasks": "hpcorch starts one task per GPU",
    "ntasks-per-node": "hpcorch starts one task per GPU",
    "ntasks-per-gpu": "hpcorch starts one task per GPU",
    "ntasks-per-core": "hpcorch starts one task per GPU",
    "ntasks-per-socket": "hpcorch starts one task per GPU",
    "gres": "hpcorch sets the GPUs: use --min-gpus/--max-gpus",
    "gpus": "hpcorch sets the GPUs: use --min-gpus/--max-gpus",
    "gpus-per-node": "hpcorch sets the GPUs: use --min-gpus/--max-gpus",
    "gpus-per-task": "hpcorch sets the GPUs: use --min-gpus/--max-gpus",
    "gpus-per-socket": "hpcorch sets the GPUs: use --min-gpus/--max-gpus",
    "cpus-per-gpu": "use hpcorch's --cpus-per-gpu",
    "cpus-per-task": "use hpcorch's --cpus-per-gpu",
    "comment": "hpcorch marks its jobs with the comment",
    "output": "the job's output goes to its job directory (see `hpcorch logs`)",
    "error": "the job's output goes to its job directory (see `hpcorch logs`)",
    "input": "hpcorch's jobs read no standard input",
    "open-mode": "the output file is appended across relaunches",
    "requeue": "hpcorch relaunches its jobs itself",
    "no-requeue": "hpcorch relaunches its jobs itself",
    "signal": "hpcorch asks for its checkpoint signal itself",
    "hold": "hpcorch holds pool jobs for the controller",
    "nodelist": "hpcorch (or its controller) places the job",
    "array": "hpcorch submits one job at a time",
    "wrap": "hpcorch runs the job wrapper",
    "parsable": "use hpcorch's --parsable",
    "wait": "use hpcorch's --wait",
    "test-only": "use hpcorch's --dry-run",
    "export": "the job needs the submit environment (SLURM_CONF, PATH)",
    "export-file": "the job needs the submit environment (SLURM_CONF, PATH)",
    "account": "use hpcorch's --account",
    "qos": "use hpcorch's --qos",
    "mem": "use hpcorch's --mem",
    "constraint": "use hpcorch's --constraint",
    "mail-type": "use hpcorch's --mail-type",
    "mail-user": "use hpcorch's --mail-user",
    "dependency": "use hpcorch's --dependency",
    "exclusive": "use hpcorch's --exclusive",
    "mincpus": "use hpcorch's --cpus-per-gpu",
    "tasks-per-node": "hpcorch starts one task per GPU",
    "ntasks-per-tres": "hpcorch starts one task per GPU",
    "tres-per-task": "hpcorch sets the GPUs and CPUs: use --min-gpus/--max-gpus and --cpus-per-gpu",
    "nodefile": "hpcorch (or its controller) places the job",
    "time-min": "use hpcorch's --time (and --time-total)",
}
"""Options hpcorch sets itself or has its own option for, and what to do instead."""

NOT_SET = frozenset({"array", "wait", "parsable", "test-only", "export", "export-file"})
"""Options of :data:`OWNED` that hpcorch refuses without setting them itself."""


def owned_refusal(option: str) -> str:
    """Why ``--option`` (one of :data:`OWNED`) is not passed to sbatch, in one phrase."""
    reason = OWNED[option]
    if option in NOT_SET or reason.startswith("use hpcorch's"):
        return f"hpcorch does not pass --{option} on ({reason})"
    return f"hpcorch sets --{option} itself ({reason})"


POOL_REFUSED: dict[str, str] = {
    "exclude": "the controller places pool jobs on the pool's nodes",
    "exclusive": "the controller shares the pool's nodes between jobs by GPU",
    "oversubscribe": "the controller shares the pool's nodes between jobs by GPU",
    "begin": "the controller starts pool jobs",
    "deadline": "the controller starts pool jobs",
}
"""Options that make sense for a job sent straight to Slurm, not for a pool job."""

PASSED: dict[str, str] = {
    "acctg-freq": "required",
    "begin": "required",
    "deadline": "required",
    "exclude": "required",
    "kill-on-invalid-dep": "required",
    "licenses": "required",
    "mem-per-cpu": "required",
    "mem-per-gpu": "required",
    "nice": "optional",
    "oversubscribe": "none",
    "profile": "required",
    "propagate": "optional",
    "tmp": "required",
    "wckey": "required",
}
"""The sbatch options ``--sbatch-arg`` passes on (full names only), and their value:
required (``--NAME=VALUE``), optional, or none. Each is a long option of every sbatch
from 22.05 to 25.11, never a prefix of another; none changes the job's nodes, GPUs, CPUs
or tasks (in a pool, :data:`POOL_REFUSED` still applies)."""

ENV_DEFAULTS: dict[str, str] = {
    "SBATCH_ACCOUNT": "account",
    "SBATCH_QOS": "qos",
    "SBATCH_PARTITION": "partition",
    "SBATCH_TIMELIMIT": "time_limit",
    "SBATCH_MEM_PER_NODE": "mem",
    "SBATCH_CONSTRAINT": "constraint",
}
"""sbatch's input variables that hpcorch takes as the defaults of its own options."""


class OptionError(ValueError):
    """An sbatch option hpcorch cannot pass on; the message is one line for people."""


@dataclass(frozen=True)
class SlurmOptions:
    """The Slurm options a user added to a job (all validated)."""

    account: str | None = None
    qos: str | None = None
    mem: str | None = None
    constraint: str | None = None
    mail_type: str | None = None
    mail_user: str | None = None
    dependency: str | None = None
    exclusive: bool = False
    extra: tuple[str, ...] = ()
    """Further sbatch options in their long form, e.g. ``--mem-per-gpu=10G``."""

    def sbatch_lines(self) -> list[str]:
        """The options as they stand after ``#SBATCH``, in a fixed order."""
        out = []
        for name, value in (
            ("account", self.account),
            ("qos", self.qos),
            ("mem", self.mem),
            ("constraint", self.constraint),
            ("mail-type", self.mail_type),
            ("mail-user", self.mail_user),
            ("dependency", self.dependency),
        ):
            if value:
                out.append(f"--{name}={value}")
        if self.exclusive:
            out.append("--exclusive")
        return out + list(self.extra)


def check_account(value: str, what: str = "--account") -> str:
    if not ACCOUNT_RE.fullmatch(value):
        raise OptionError(
            f"invalid {what} {value!r}: use 1-64 letters, digits and _ . + - "
            "(starting with a letter, digit or _)"
        )
    return value


def check_mem(value: str) -> str:
    if not MEM_RE.fullmatch(value):
        raise OptionError(
            f"invalid --mem {value!r}: use a size in megabytes or with a unit, "
            "e.g. 4000, 500M, 32G, 1T"
        )
    return value.upper()


def check_constraint(value: str) -> str:
    if not CONSTRAINT_RE.fullmatch(value):
        raise OptionError(
            f"invalid --constraint {value!r}: use node features joined by & | , "
            "with [ ] ( ) * and counts, e.g. 'a100&ib' or '[rack1|rack2]'"
        )
    return value


def check_mail_type(value: str) -> str:
    items = [v.strip().upper() for v in value.split(",")]
    bad = [v for v in items if v not in MAIL_TYPES]
    if not items or bad:
        raise OptionError(
            f"invalid --mail-type {bad[0] if bad else value!r}"
            f" (valid: {', '.join(MAIL_TYPES)}; several joined by commas)"
        )
    return ",".join(items)


def check_mail_user(value: str) -> str:
    if not MAIL_USER_RE.fullmatch(value):
        raise OptionError(f"invalid --mail-user {value!r}: use a user name or an e-mail address")
    return value


def check_dependency(value: str) -> str:
    sep = "?" if "?" in value else ","
    items = value.split(sep)
    if not value or len(items) > 64 or not all(_DEP_ITEM_RE.fullmatch(i) for i in items):
        raise OptionError(
            f"invalid --dependency {value!r}: use TYPE:JOBID[:JOBID...] joined by , (all) "
            f"or ? (any), TYPE one of {', '.join(DEPENDENCY_TYPES)}; or singleton"
        )
    return value


def _passed(pooled: bool) -> str:
    """The options ``--sbatch-arg`` passes on, for a message."""
    return ", ".join(f"--{n}" for n in PASSED if not (pooled and n in POOL_REFUSED))


def _refusal(option: str, pooled: bool) -> str | None:
    """Why ``--sbatch-arg`` refuses the sbatch option ``--OPTION``; None: it passes it."""
    if option in OWNED:
        return owned_refusal(option)
    if pooled and option in POOL_REFUSED:
        return f"not for a job in a pool ({POOL_REFUSED[option]})"
    if option not in PASSED:
        return f"hpcorch does not pass --{option} on to Slurm (it passes {_passed(pooled)})"
    return None


def _readings(name: str) -> tuple[dict[str, list[str]], set[str]]:
    """How getopt_long of each sbatch release reads ``--NAME``: the options it reads it as
    (with the releases that do), and the options it finds it ambiguous between."""
    readings: dict[str, list[str]] = {}
    ambiguous: set[str] = set()
    for release in SBATCH_RELEASES:
        names = [n for n, releases in SBATCH_LONG_OPTIONS.items() if release in releases]
        matches = [name] if name in names else [n for n in names if n.startswith(name)]
        if len(matches) == 1:
            readings.setdefault(matches[0], []).append(release)
        else:
            ambiguous.update(matches)
    return readings, ambiguous


def _not_a_full_name(arg: str, name: str, pooled: bool) -> OptionError:
    """The error for ``--NAME``, not the full name of an sbatch option: what sbatch would
    read it as, and why hpcorch refuses that (or how to spell it out)."""
    readings, ambiguous = _readings(name)
    if readings:
        said = " or ".join(
            f"--{option}"
            + ("" if len(releases) == len(SBATCH_RELEASES) else f" (Slurm {', '.join(releases)})")
            for option, releases in readings.items()
        )

        def weight(option: str) -> int:  # the strongest reason to refuse first
            if option in OWNED:
                return 0
            if pooled and option in POOL_REFUSED:
                return 1
            return 2 if option not in PASSED else 3

        option = min(readings, key=weight)
        why = (
            _refusal(option, pooled) or f"spell it out: --{option} (hpcorch takes full names only)"
        )
        return OptionError(f"--sbatch-arg {arg!r}: sbatch reads --{name} as {said}: {why}")
    if ambiguous:
        candidates = sorted(ambiguous)
        passed = [f"--{n}" for n in candidates if _refusal(n, pooled) is None]
        return OptionError(
            f"--sbatch-arg {arg!r}: --{name} is ambiguous to sbatch "
            f"({', '.join(f'--{n}' for n in candidates)}): "
            + (
                f"spell it out: {' or '.join(passed)}"
                if passed
                else f"hpcorch passes only {_passed(pooled)}"
            )
        )
    return OptionError(
        f"--sbatch-arg {arg!r}: --{name} is not an sbatch option (hpcorch passes {_passed(pooled)})"
    )


def split_option(arg: str, pooled: bool = False) -> tuple[str, str | None]:
    """``--name=value`` -> (name, value); ``--flag`` -> (flag, None)."""
    if not arg.startswith("--"):
        letter = arg[1:2] if arg.startswith("-") else ""
        option = SBATCH_SHORT_OPTIONS.get(letter)
        why = ""
        if option is not None:
            refused = option in OWNED or (pooled and option in POOL_REFUSED)
            why = f" (-{letter} is --{option}" + (
                f": {_refusal(option, pooled)})" if refused else ")"
            )
        raise OptionError(
            f"--sbatch-arg {arg!r}: give one sbatch option in its long form, "
            f"e.g. --sbatch-arg=--mem-per-gpu=10G{why}"
        )
    name, eq, value = arg[2:].partition("=")
    if not OPTION_NAME_RE.fullmatch(name):
        raise OptionError(
            f"--sbatch-arg {arg!r}: {name!r} is not an sbatch option name "
            "(those are lower-case letters, digits and -)"
        )
    return name, (value if eq else None)


def check_extra(args: Sequence[str], pooled: bool) -> tuple[str, ...]:
    """The ``--sbatch-arg`` options, checked: each the full name of an sbatch option that
    hpcorch passes on (:data:`PASSED`), with a value that can stand in an ``#SBATCH``
    line."""
    out = []
    seen: set[str] = set()
    for arg in args:
        name, value = split_option(arg, pooled)
        if name in OWNED:
            raise OptionError(f"--sbatch-arg {arg!r}: {owned_refusal(name)}")
        if pooled and name in POOL_REFUSED:
            raise OptionError(
                f"--sbatch-arg {arg!r}: not for a job in a pool ({POOL_REFUSED[name]})"
            )
        if name in SBATCH_LONG_OPTIONS and name not in PASSED:
            raise OptionError(f"--sbatch-arg {arg!r}: {_refusal(name, pooled)}")
        if name not in PASSED:
            raise _not_a_full_name(arg, name, pooled)
        kind = PASSED[name]
        if kind == "none" and value is not None:
            raise OptionError(f"--sbatch-arg {arg!r}: --{name} takes no value")
        if kind == "required" and not value:
            raise OptionError(
                f"--sbatch-arg {arg!r}: --{name} needs a value: --{name}=VALUE (alone, sbatch "
                "would take the next #SBATCH line as its value)"
            )
        if value is not None and not SAFE_VALUE_RE.fullmatch(value):
            raise OptionError(
                f"--sbatch-arg {arg!r}: the value may hold only letters, digits and "
                "_ . , : @ % + = / ( ) [ ] | & * ! ? ~ ^ - (no spaces or quotes)"
            )
        if name in seen:
            raise OptionError(f"--sbatch-arg: --{name} is given twice")
        seen.add(name)
        out.append(f"--{name}" if value is None else f"--{name}={value}")
    return tuple(out)


def make_options(
    account: str | None = None,
    qos: str | None = None,
    mem: str | None = None,
    constraint: str | None = None,
    mail_type: str | None = None,
    mail_user: str | None = None,
    dependency: str | None = None,
    exclusive: bool = False,
    extra: Sequence[str] = (),
    pooled: bool = False,
) -> SlurmOptions:
    """Validated options; an :class:`OptionError` names the first bad one. None: not
    given; an empty string is a bad value (never silently "not given")."""
    if pooled and exclusive:
        raise OptionError(f"--exclusive is not for a job in a pool ({POOL_REFUSED['exclusive']})")
    if pooled and dependency is not None:
        raise OptionError(
            "--dependency is not for a job in a pool: the controller starts pool jobs "
            "itself and would hold GPUs for a job Slurm keeps waiting (submit it when the "
            "jobs it depends on are done)"
        )
    if mail_user and mail_type is None:
        mail_type = "END,FAIL"  # what a user giving an address means; sbatch would send none
    return SlurmOptions(
        account=check_account(account) if account is not None else None,
        qos=check_account(qos, "--qos") if qos is not None else None,
        mem=check_mem(mem) if mem is not None else None,
        constraint=check_constraint(constraint) if constraint is not None else None,
        mail_type=check_mail_type(mail_type) if mail_type is not None else None,
        mail_user=check_mail_user(mail_user) if mail_user is not None else None,
        dependency=check_dependency(dependency) if dependency is not None else None,
        exclusive=exclusive,
        extra=check_extra(extra, pooled),
    )


def env_defaults(environ: Mapping[str, str]) -> dict[str, str]:
    """hpcorch option name -> value, for each ``SBATCH_*`` default that is set."""
    out = {}
    for var, option in ENV_DEFAULTS.items():
        value = environ.get(var, "").strip()
        if value:
            out[option] = value
    return out


def ignored_env(environ: Mapping[str, str]) -> list[str]:
    """The ``SBATCH_*`` variables set here that hpcorch neither uses nor passes on."""
    return sorted(v for v in environ if v.startswith("SBATCH_") and v not in ENV_DEFAULTS)


def without_sbatch_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment to run sbatch in: every ``SBATCH_*`` variable removed (hpcorch's
    script carries every option explicitly, and sbatch would let these override it)."""
    return {k: v for k, v in environ.items() if not k.startswith("SBATCH_")}
