"""Render the batch script of an hpcorch job. Pure: a JobSpec in, script text out.

The script holds Slurm options as ``#SBATCH`` lines and hands the work to the job wrapper
(jobscripts/hpcorch-run.sbatch). Every user-supplied string that reaches a shell line is
quoted with shlex.quote; strings in ``#SBATCH`` lines are validated instead, since sbatch
does not parse those lines with a shell.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field

from hpcorch import __version__
from hpcorch.gputypes import TYPE_RE, tag_value
from hpcorch.protocol import (
    CHECKPOINT_SIGNAL,
    ENV_CKPT_SIGNAL,
    ENV_GLOBAL_BATCH,
    ENV_JOB_DIR,
    ENV_JOB_ID,
    ENV_MAX_GLOBAL_BATCH,
    ENV_MAX_PER_GPU_BATCH,
    ENV_MAX_RELAUNCHES,
    ENV_MIN_GLOBAL_BATCH,
    ENV_MODE,
    ENV_PROGRESS_FILE,
    ENV_PROGRESS_REGEX,
    ENV_RESUME_ARGS,
    ENV_RESUME_CMD,
    ENV_SCRIPT_CKPT_DIR,
    ENV_SPOOL,
    ENV_STOP_COMMAND,
    ENV_STOP_GRACE,
    ENV_STOP_SIGNAL,
    ENV_TIME_BUDGET,
    JOB_COMMENT_TAG,
    SIGNAL_LEAD_S,
)
from hpcorch.timefmt import DurationError, parse_duration

NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]{0,63}$")
SAFE_PATH_RE = re.compile(r"^[A-Za-z0-9_./+@%=-]+$")


class SpecError(ValueError):
    """A JobSpec field cannot be rendered."""


@dataclass(frozen=True)
class SidecarSpec:
    """How the sidecar stops, resumes and watches a script that does not use the runtime."""

    stop_signal: str = "TERM"
    stop_command: str | None = None
    grace_s: int = 60
    ckpt_dir: str | None = None
    """Where the script writes its own checkpoints (absolute)."""
    resume_args: tuple[str, ...] = ()
    resume_cmd: tuple[str, ...] = ()
    progress_regex: str | None = None
    progress_file: str | None = None
    live_batch: bool = False
    """The script applies a new global batch from $HPCORCH_BATCH_FILE while it runs."""

    @property
    def resumable(self) -> bool:
        return bool(self.ckpt_dir or self.resume_args or self.resume_cmd)

    @property
    def predictable(self) -> bool:
        return bool(self.progress_regex or self.progress_file)

    def env(self) -> list[tuple[str, str]]:
        out = [(ENV_MODE, "sidecar"), (ENV_STOP_SIGNAL, self.stop_signal)]
        out.append((ENV_STOP_GRACE, str(self.grace_s)))
        if self.stop_command:
            out.append((ENV_STOP_COMMAND, self.stop_command))
        if self.ckpt_dir:
            out.append((ENV_SCRIPT_CKPT_DIR, self.ckpt_dir))
        if self.resume_args:
            out.append((ENV_RESUME_ARGS, json.dumps(list(self.resume_args))))
        if self.resume_cmd:
            out.append((ENV_RESUME_CMD, json.dumps(list(self.resume_cmd))))
        if self.progress_regex:
            out.append((ENV_PROGRESS_REGEX, self.progress_regex))
        if self.progress_file:
            out.append((ENV_PROGRESS_FILE, self.progress_file))
        return out


@dataclass(frozen=True)
class JobSpec:
    """Everything the batch script of one launch needs."""

    job_key: str
    """hpcorch's own id of the job (stable across relaunches)."""
    name: str
    script: str
    script_args: tuple[str, ...]
    nodes: int
    gpus_per_node: int
    min_gpus: int
    max_gpus: int
    job_dir: str
    wrapper: str
    requested_gpus: int | None = None
    """The GPUs the user asked for (``--gpus``; None: did not say): the comment's ``req``."""
    cpus_per_gpu: int = 1
    global_batch: int | None = None
    max_global_batch: int | None = None
    max_per_gpu_batch: int | None = None
    partition: str | None = None
    reservation: str | None = None
    time_limit: str | None = None
    python: str | None = None
    signal_lead_s: int = SIGNAL_LEAD_S
    app: str | None = None
    """Application name: jobs of one application share a throughput model."""
    managed: bool = False
    """Submitted into a controller's pool: held until the controller starts it."""
    extra_env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    sidecar: SidecarSpec | None = None
    min_cpus_per_gpu: int = 0
    """The fewest CPUs per GPU the controller may give the job (0: one)."""
    slurm_options: tuple[str, ...] = ()
    """The user's further sbatch options (``--account=a``, ...), validated by
    hpcorch/slurm/options.py."""
    time_budget_s: int = 0
    """Run time the job may use across all its launches (0: no budget)."""
    max_relaunches: int = -1
    """Relaunches after the job checkpointed on its own, e.g. at its time limit (-1: no
    cap)."""
    epochs: int | None = None
    """The length the user declared, in epochs: the scheduler ranks the job by it while it
    is queued, until the job reports its own (None: not declared)."""
    dataset_size: int | None = None
    """Samples per epoch the user declared (None: not declared)."""
    setup: tuple[str, ...] = ()
    """The user's shell lines run before the job on every launch (``--setup``), checked by
    :func:`hpcorch.request.setup_lines`."""
    spool: str | None = None
    """The controller's spool (a job in its pool): the wrapper reads the plan from
    <spool>/<Slurm job id>/plan.json, which only the controller writes."""
    gpu_types: tuple[str, ...] = ()
    """The GPU types the job accepts (checked by :mod:`hpcorch.gputypes`; empty: any). In
    a pool the controller requests one of them at each launch; straight to Slurm (one
    type) it is the batch script's ``--gres=gpu:TYPE:N``."""

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    def comment(self) -> str:
        """The Slurm comment that marks the job as hpcorch's and carries its bounds."""
        parts = [f"id={self.job_key}", f"min={self.min_gpus}", f"max={self.max_gpus}"]
        if self.requested_gpus:
            parts.append(f"req={self.requested_gpus}")
        if self.global_batch:
            parts.append(f"batch={self.global_batch}")
        if self.max_global_batch:
            parts.append(f"maxbatch={self.max_global_batch}")
        if self.max_per_gpu_batch:
            parts.append(f"micro={self.max_per_gpu_batch}")
        if self.min_cpus_per_gpu:
            parts.append(f"mincpus={self.min_cpus_per_gpu}")
        if self.managed:
            parts.append(f"cpus={self.cpus_per_gpu}")
        if self.time_budget_s:
            parts.append(f"budget={self.time_budget_s}")
        if self.max_relaunches >= 0:
            parts.append(f"relaunches={self.max_relaunches}")
        # for every job, like the bounds above: inert outside a pool, and the comment stays
        # the one record of what was asked for
        if self.epochs:
            parts.append(f"epochs={self.epochs}")
        if self.dataset_size:
            parts.append(f"dataset={self.dataset_size}")
        if self.gpu_types:
            parts.append(f"types={tag_value(self.gpu_types)}")
        if self.sidecar is not None:
            parts += ["mode=sidecar", f"grace={self.sidecar.grace_s}"]
            if not self.sidecar.resumable:
                parts.append("resume=no")
            if not self.sidecar.predictable:
                parts.append("progress=no")
            if self.sidecar.live_batch:
                parts.append("livebatch=1")
        if self.managed:
            # no app: the job is pooled by the model its runtime reports, never by its name
            parts += [f"app={self.app}"] if self.app else []
            parts.append(f"dir={self.job_dir}")
        return f"{JOB_COMMENT_TAG}:" + ",".join(parts)


def parse_comment(comment: str) -> dict[str, str] | None:
    """The fields of an hpcorch comment, or None for a job hpcorch did not submit."""
    if not comment.startswith(JOB_COMMENT_TAG + ":"):
        return None
    fields: dict[str, str] = {}
    for part in comment[len(JOB_COMMENT_TAG) + 1 :].split(","):
        key, sep, value = part.partition("=")
        if sep:
            fields[key] = value
    return fields


def check_name(name: str) -> str:
    if not NAME_RE.fullmatch(name):
        raise SpecError(
            f"invalid job name {name!r}: use 1-64 letters, digits and _ . + - "
            "(starting with a letter or digit)"
        )
    return name


def check_time(limit: str) -> str:
    """A Slurm time limit (``UNLIMITED`` included), as sbatch reads it."""
    try:
        seconds = parse_duration(limit)
    except DurationError as exc:
        raise SpecError(str(exc)) from exc
    return limit.strip() if seconds is not None else "UNLIMITED"


def check_sbatch_path(path: str, what: str) -> str:
    if not SAFE_PATH_RE.fullmatch(path):
        raise SpecError(
            f"{what} {path!r} contains characters that cannot appear in an #SBATCH line "
            "(use letters, digits and _ . / + @ % = -)"
        )
    return path


def _gres_type(spec: JobSpec) -> str:
    """``TYPE:`` for the batch script's ``--gres`` of a job straight to Slurm that accepts
    one GPU type; '' otherwise (in a pool, the controller requests the type at launch)."""
    if spec.managed or len(spec.gpu_types) != 1:
        return ""
    if not TYPE_RE.fullmatch(spec.gpu_types[0]):
        raise SpecError(f"invalid GPU type {spec.gpu_types[0]!r}")
    return f"{spec.gpu_types[0]}:"


def render_batch_script(spec: JobSpec) -> str:
    """The batch script for ``spec``: deterministic, so it can be golden-file tested."""
    check_name(spec.name)
    if spec.app:
        check_name(spec.app)
    check_sbatch_path(spec.job_dir, "job directory")
    if spec.nodes < 1 or spec.gpus_per_node < 1:
        raise SpecError(
            f"need at least one node and one GPU, got {spec.nodes}x{spec.gpus_per_node}"
        )
    sb: list[str] = [
        f"--job-name={spec.name}",
        f"--nodes={spec.nodes}",
        f"--gres=gpu:{_gres_type(spec)}{spec.gpus_per_node}",
        # A job the controller reshapes asks for its CPUs per node, and its comment keeps
        # the CPUs per GPU (``cpus=``): Slurm 24.11 keeps a job's first CPUs-per-GPU total
        # through every later update, so a job asked --cpus-per-gpu could never shrink.
        f"--mincpus={spec.gpus_per_node * spec.cpus_per_gpu}"
        if spec.managed
        else f"--cpus-per-gpu={spec.cpus_per_gpu}",
    ]
    if spec.partition:
        sb.append(f"--partition={check_sbatch_path(spec.partition, 'partition')}")
    if spec.reservation:
        sb.append(f"--reservation={check_sbatch_path(spec.reservation, 'reservation')}")
    if spec.time_limit:
        sb.append(f"--time={check_time(spec.time_limit)}")
    for opt in spec.slurm_options:
        if not opt.startswith("--") or "\n" in opt or " " in opt:
            raise SpecError(f"sbatch option {opt!r} cannot stand in an #SBATCH line")
        sb.append(opt)
    if spec.managed:
        sb.append("--hold")
    sb += [
        f"--output={spec.job_dir}/slurm-%j.out",
        "--open-mode=append",
        "--requeue",
        f"--signal=B:{CHECKPOINT_SIGNAL}@{spec.signal_lead_s}",
        f"--comment={spec.comment()}",
    ]
    env: list[tuple[str, str]] = [
        (ENV_JOB_ID, spec.job_key),
        (ENV_JOB_DIR, spec.job_dir),
        (ENV_CKPT_SIGNAL, CHECKPOINT_SIGNAL),
    ]
    if spec.global_batch:
        env.append((ENV_GLOBAL_BATCH, str(spec.global_batch)))
        env.append((ENV_MIN_GLOBAL_BATCH, str(spec.global_batch)))
    if spec.max_global_batch:
        env.append((ENV_MAX_GLOBAL_BATCH, str(spec.max_global_batch)))
    if spec.max_per_gpu_batch:
        env.append((ENV_MAX_PER_GPU_BATCH, str(spec.max_per_gpu_batch)))
    if spec.python:
        env.append(("HPCORCH_PYTHON", spec.python))
    if spec.time_budget_s:
        env.append((ENV_TIME_BUDGET, str(spec.time_budget_s)))
    if spec.max_relaunches >= 0:
        env.append((ENV_MAX_RELAUNCHES, str(spec.max_relaunches)))
    if spec.managed:
        env.append(("HPCORCH_CONTROLLED", "1"))
        if spec.spool:
            env.append((ENV_SPOOL, spec.spool))
    if spec.sidecar is not None:
        env += spec.sidecar.env()
    env += list(spec.extra_env)
    lines = [
        "#!/bin/bash",
        *(f"#SBATCH {opt}" for opt in sb),
        f"# hpcorch job {spec.job_key}: generated by hpcorch {__version__}.",
        f"# {spec.min_gpus}-{spec.max_gpus} GPUs; this launch: {spec.nodes} node(s) x "
        f"{spec.gpus_per_node} GPU(s).",
        *(f"export {key}={shlex.quote(value)}" for key, value in env),
        *(
            ["# set-up (hpcorch submit --setup), on every launch:", *spec.setup]
            if spec.setup
            else []
        ),
        "exec bash " + " ".join(shlex.quote(a) for a in _command(spec)),
        "",
    ]
    return "\n".join(lines)


def _command(spec: JobSpec) -> Sequence[str]:
    return [spec.wrapper, spec.script, *spec.script_args]


def choose_shape(gpus: int, gpus_per_node: int, max_nodes: int) -> tuple[int, int]:
    """(nodes, GPUs per node) for ``gpus`` GPUs: as few nodes as possible, equal per node."""
    if gpus < 1:
        raise SpecError(f"need at least one GPU, got {gpus}")
    first = -(-gpus // gpus_per_node)
    for nodes in range(first, min(gpus, max_nodes) + 1):
        if gpus % nodes == 0:
            return nodes, gpus // nodes
    raise SpecError(
        f"{gpus} GPUs cannot be spread evenly over at most {max_nodes} nodes of "
        f"{gpus_per_node} GPUs"
    )
