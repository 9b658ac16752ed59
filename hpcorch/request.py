"""From a user's options to a checked ``SubmitRequest``: the one place where the options of
``hpcorch submit`` and of the Python API (hpcorch/api.py) are validated. Pure, apart from
reading the script to detect its mode later (in hpcorch/submit.py).

Every error is a :class:`RequestError` with one line for people; the CLI reports it as a
usage error (exit code 2), the API raises it.
"""

from __future__ import annotations

import inspect
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpcorch.errors import SubmitError
from hpcorch.gputypes import GpuTypeError, parse_gpu_types
from hpcorch.protocol import DEFAULT_MAX_RELAUNCHES, MAX_DECLARED_EPOCHS, MAX_DECLARED_SAMPLES
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


def _count(value: object, what: str, required: bool = False, hi: int = MAX_COUNT) -> int | None:
    if value is None:
        if required:
            raise RequestError(f"{what} is required")
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise RequestError(f"{what} must be a whole number, got {value!r}")
    if not 1 <= value <= hi:
        raise RequestError(f"{what} {value} is out of range (1 to {hi})")
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


MAX_TEXT = 4096
"""Longest free-text option (a command line, a regex): they go to the job's environment."""


def _check_text(text: str, what: str, empty_ok: bool = False) -> None:
    """Free text that the batch script exports (shlex-quoted): any character a shell
    variable can hold, so no NUL; bounded; not blank unless ``empty_ok``."""
    if "\0" in text:
        raise RequestError(f"{what} may not hold a NUL character")
    if len(text) > MAX_TEXT:
        raise RequestError(f"{what} is too long ({len(text)} characters, at most {MAX_TEXT})")
    if not empty_ok and not text.strip():
        raise RequestError(f"{what} is empty")


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
    for text, what in ((stop_command, "--stop-command"), (resume_cmd, "--resume-cmd")):
        if text is not None:
            _check_text(text, what)
    for text in resume_args:
        _check_text(text, "--resume-arg", empty_ok=True)
    if progress_regex is not None:
        _check_text(progress_regex, "--progress-regex")
    try:
        if stop_signal is not None:
            signal_number(stop_signal)
        if progress_regex is not None:
            check_regex(progress_regex)
    except (SidecarError, ValueError) as exc:
        raise RequestError(str(exc)) from exc
    try:
        args = tuple(a for text in resume_args for a in shlex.split(text))
    except ValueError as exc:
        raise RequestError(f"--resume-arg: {exc} (it is split like a shell line)") from exc
    try:
        cmd = tuple(shlex.split(resume_cmd)) if resume_cmd is not None else ()
    except ValueError as exc:
        raise RequestError(f"--resume-cmd: {exc} (it is split like a shell line)") from exc
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


MAX_SETUP_LINES = 32
MAX_SETUP_CHARS = 1000


def setup_lines(lines: Sequence[str]) -> tuple[str, ...]:
    """``--setup`` lines as the batch script will run them: shell code the user asks for,
    in their own job (e.g. ``module load cuda/12.4``), so not quoted; but each one line
    (no newline, carriage return or NUL), not blank, at most 1000 characters, 32 lines."""
    if isinstance(lines, str):
        lines = [lines]
    if not all(isinstance(line, str) for line in lines):
        raise RequestError("--setup lines must be strings")
    if len(lines) > MAX_SETUP_LINES:
        raise RequestError(f"at most {MAX_SETUP_LINES} --setup lines, got {len(lines)}")
    for line in lines:
        if any(c in line for c in "\n\r\0"):
            raise RequestError(f"--setup {line!r}: one line each (no newline or NUL)")
        if not line.strip() or len(line) > MAX_SETUP_CHARS:
            raise RequestError(f"--setup {line[:40]!r}: 1 to {MAX_SETUP_CHARS} characters")
    return tuple(lines)


SIDECAR_KEYS: tuple[str, ...] = tuple(inspect.signature(sidecar_spec).parameters)
"""The sidecar's options, by the names :func:`sidecar_spec` takes (CLI and API alike)."""


def build_request(
    script: str,
    script_args: Sequence[str] = (),
    *,
    min_gpus: int,
    max_gpus: int | None = None,
    gpus: int | None = None,
    batch_size: int | None = None,
    max_batch_size: int | None = None,
    time_limit: str | None = None,
    time_total: str | None = None,
    max_relaunches: int | str | None = None,
    epochs: int | None = None,
    dataset_size: int | None = None,
    partition: str | None = None,
    name: str | None = None,
    cpus_per_gpu: int | None = None,
    max_per_gpu_batch: int | None = None,
    gpu_types: str | Sequence[str] | None = None,
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
    setup: Sequence[str] = (),
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
    asked = _count(gpus, "--gpus")
    if asked is not None and not lo <= asked <= hi:
        raise RequestError(f"--gpus {asked} is outside --min-gpus {lo} .. --max-gpus {hi}")
    batch = _count(batch_size, "--batch-size")
    max_batch = _count(max_batch_size, "--max-batch-size")
    if batch and max_batch and max_batch < batch:
        raise RequestError(f"--batch-size {batch} is above --max-batch-size {max_batch}")
    cpus = _count(cpus_per_gpu, "--cpus-per-gpu")
    micro = _count(max_per_gpu_batch, "--max-per-gpu-batch")
    declared_epochs = _count(epochs, "--epochs", hi=MAX_DECLARED_EPOCHS)
    declared_samples = _count(dataset_size, "--dataset-size", hi=MAX_DECLARED_SAMPLES)
    if mode not in MODES:
        raise RequestError(f"unknown mode {mode!r} (valid: {', '.join(MODES)})")
    try:
        types = parse_gpu_types(gpu_types)
    except GpuTypeError as exc:
        raise RequestError(str(exc)) from exc
    if len(types) > 1 and not pool:
        # straight to Slurm, the types go into --gres, which names one type
        raise RequestError(
            "--gpu-types: several types need a pool (--pool); outside one, Slurm's --gres "
            "takes one type"
        )
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
            account=account if account is not None else defaults.get("account"),
            qos=qos if qos is not None else defaults.get("qos"),
            mem=mem if mem is not None else defaults.get("mem"),
            constraint=constraint if constraint is not None else defaults.get("constraint"),
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
        gpus=asked,
        name=name,
        batch_size=batch,
        max_batch_size=max_batch,
        time_limit=time_limit.strip() if time_limit else None,
        partition=partition,
        cpus_per_gpu=cpus,
        max_per_gpu_batch=micro,
        gpu_types=types,
        pool=pool or None,
        app=app,
        mode=mode,
        sidecar=sidecar,
        options=options,
        time_budget_s=total or 0,
        max_relaunches=max_relaunches_of(max_relaunches),
        epochs=declared_epochs,
        dataset_size=declared_samples,
        setup=setup_lines(setup),
    )
