"""From a user's options to a checked ``SubmitRequest``: the one place where the options of
``hpcorch submit`` and of the Python API (hpcorch/api.py) are validated. Pure, apart from
reading the script to detect its mode later (in hpcorch/submit.py).

Every error is a :class:`RequestError` with one line for people; the CLI reports it as a
usage error (exit code 2), the API raises it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpcorch.errors import SubmitError
from hpcorch.protocol import DEFAULT_MAX_RELAUNCHES
from hpcorch.sidecar.config import SidecarError, check_regex, signal_number
from hpcorch.slurm.options import OptionError, SlurmOptions, env_defaults, make_options
from hpcorch.slurm.script import SidecarSpec, SpecError, check_name, check_sbatch_path
from hpcorch.submit import MODES, SubmitRequest
from hpcorch.timefmt import DurationError, parse_duration

MAX_COUNT = 1_000_000
"""Bound on GPU, CPU and batch counts: larger than any cluster, small enough to render."""
MAX_RELAUNCHES = 100_000


class RequestError(SubmitError):
    """The options themselves are wrong (a usage error)."""


def _count(value: object, what: str, required: bool = False) -> int | None:
    if value is None:
        if required:
            raise RequestError(f"{what} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{what} must be a whole number, got {value!r}")
    if not 1 <= value <= MAX_COUNT:
        raise RequestError(f"{what} {value} is out of range (1 to {MAX_COUNT})")
    return value


def max_relaunches_of(value: object) -> int:
    """A cap on relaunches: a count, "UNLIMITED" (-1), or None for the default."""
    if value is None:
        return DEFAULT_MAX_RELAUNCHES
    if isinstance(value, str):
        text = value.strip()
        if text.upper() in ("UNLIMITED", "INFINITE"):
            return -1
        if not (text.isascii() and text.isdigit()):
            raise RequestError(
                f"invalid --max-relaunches {value!r}: use a count (0 to {MAX_RELAUNCHES}) "
                "or UNLIMITED"
            )
        value = int(text)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"--max-relaunches must be a count or UNLIMITED, got {value!r}")
    if value == -1:
        return -1
    if not 0 <= value <= MAX_RELAUNCHES:
        raise RequestError(
            f"--max-relaunches {value} is out of range (0 to {MAX_RELAUNCHES}, or UNLIMITED)"
        )
    return value


def sidecar_spec(
    stop_signal: str | None = None,
    stop_command: str | None = None,
    grace: int | None = None,
    ckpt_dir: str | None = None,
    resume_args: Sequence[str] = (),
    resume_cmd: str | None = None,
    progress_regex: str | None = None,
    progress_file: str | None = None,
    live_batch: bool | None = None,
) -> SidecarSpec | None:
    """The sidecar options as given, checked; None when none was given."""
    given = (stop_signal, stop_command, grace, ckpt_dir, resume_cmd, progress_regex, live_batch)
    if all(v is None for v in given) and not resume_args and progress_file is None:
        return None
    try:
        if stop_signal is not None:
            signal_number(stop_signal)
        if progress_regex is not None:
            check_regex(progress_regex)
        args = tuple(a for text in resume_args for a in shlex.split(text))
        cmd = tuple(shlex.split(resume_cmd)) if resume_cmd is not None else ()
    except (SidecarError, ValueError) as exc:
        raise RequestError(str(exc)) from exc
    if grace is not None and (isinstance(grace, bool) or not 0 <= grace <= 86400):
        raise RequestError(f"--grace {grace} is out of range (0 to 86400 seconds)")
    if stop_signal is not None and stop_command is not None:
        raise RequestError("give --stop-signal or --stop-command, not both")
    if resume_cmd is not None and not cmd:
        raise RequestError("--resume-cmd is empty")
    if args and cmd:
        raise RequestError("give --resume-arg or --resume-cmd, not both")
    if ckpt_dir is None and any("{ckpt}" in a for a in (*args, *cmd)):
        raise RequestError("{ckpt} in the resume arguments needs --ckpt-dir")
    return SidecarSpec(
        stop_signal=(stop_signal or "TERM").strip().upper().removeprefix("SIG"),
        stop_command=stop_command,
        grace_s=60 if grace is None else grace,
        ckpt_dir=str(Path(ckpt_dir).resolve()) if ckpt_dir else None,
        resume_args=args,
        resume_cmd=cmd,
        progress_regex=progress_regex,
        progress_file=str(Path(progress_file).resolve()) if progress_file else None,
        live_batch=bool(live_batch),
    )


def build_request(
    script: str,
    script_args: Sequence[str] = (),
    *,
    min_gpus: int,
    max_gpus: int | None = None,
    batch_size: int | None = None,
    max_batch_size: int | None = None,
    time_limit: str | None = None,
    time_total: str | None = None,
    max_relaunches: int | str | None = None,
    partition: str | None = None,
    name: str | None = None,
    cpus_per_gpu: int | None = None,
    max_per_gpu_batch: int | None = None,
    pool: str | None = None,
    app: str | None = None,
    mode: str = "auto",
    sidecar: SidecarSpec | None = None,
    account: str | None = None,
    qos: str | None = None,
    mem: str | None = None,
    constraint: str | None = None,
    mail_type: str | None = None,
    mail_user: str | None = None,
    dependency: str | None = None,
    exclusive: bool = False,
    sbatch_args: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
) -> SubmitRequest:
    """A checked request. ``environ`` (default: this process's) supplies the ``SBATCH_*``
    defaults of the options not given (hpcorch/slurm/options.py)."""
    if not os.path.isfile(script):
        raise RequestError(f"script {script!r} does not exist or is not a file")
    if isinstance(script_args, str) or not all(isinstance(a, str) for a in script_args):
        raise RequestError("the script's arguments must be a list of strings")
    if any("\0" in a for a in script_args):
        raise RequestError("a script argument holds a NUL character")
    lo = _count(min_gpus, "--min-gpus", required=True)
    assert lo is not None
    hi = _count(max_gpus, "--max-gpus") or lo
    if hi < lo:
        raise RequestError(f"--min-gpus {lo} is above --max-gpus {hi}")
    batch = _count(batch_size, "--batch-size")
    max_batch = _count(max_batch_size, "--max-batch-size")
    if batch and max_batch and max_batch < batch:
        raise RequestError(f"--batch-size {batch} is above --max-batch-size {max_batch}")
    cpus = _count(cpus_per_gpu, "--cpus-per-gpu")
    micro = _count(max_per_gpu_batch, "--max-per-gpu-batch")
    if mode not in MODES:
        raise RequestError(f"unknown mode {mode!r} (valid: {', '.join(MODES)})")
    defaults = env_defaults(os.environ if environ is None else environ)
    partition = partition or defaults.get("partition")
    time_limit = time_limit or defaults.get("time_limit")
    name = name or Path(script).stem.replace(" ", "_") or "job"
    try:
        check_name(name)
        if app:
            check_name(app)
        if partition:
            check_sbatch_path(partition, "partition")
        if pool:
            check_sbatch_path(pool, "pool")
        per_launch = parse_duration(time_limit, "--time") if time_limit else None
        total = parse_duration(time_total, "--time-total") if time_total else None
    except (SpecError, DurationError) as exc:
        raise RequestError(str(exc)) from exc
    if total is not None and (not time_limit or (per_launch is not None and per_launch > total)):
        # no launch may run past the budget: the first one gets at most all of it (an
        # explicit --time UNLIMITED leaves the budget to the controller or the wrapper)
        time_limit = time_total
    elif time_limit and per_launch is None:
        time_limit = "UNLIMITED"
    try:
        options: SlurmOptions = make_options(
            account=account or defaults.get("account"),
            qos=qos or defaults.get("qos"),
            mem=mem or defaults.get("mem"),
            constraint=constraint or defaults.get("constraint"),
            mail_type=mail_type,
            mail_user=mail_user,
            dependency=dependency,
            exclusive=exclusive,
            extra=tuple(sbatch_args),
            pooled=bool(pool),
        )
    except OptionError as exc:
        raise RequestError(str(exc)) from exc
    return SubmitRequest(
        script=script,
        script_args=tuple(script_args),
        min_gpus=lo,
        max_gpus=hi,
        name=name,
        batch_size=batch,
        max_batch_size=max_batch,
        time_limit=time_limit.strip() if time_limit else None,
        partition=partition,
        cpus_per_gpu=cpus,
        max_per_gpu_batch=micro,
        pool=pool or None,
        app=app,
        mode=mode,
        sidecar=sidecar,
        options=options,
        time_budget_s=total or 0,
        max_relaunches=max_relaunches_of(max_relaunches),
    )
