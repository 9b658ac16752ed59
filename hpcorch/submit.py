"""Submitting a job: validate against the pool, render the batch script, sbatch it."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpcorch.errors import HpcorchError, SubmitError
from hpcorch.gputypes import unknown_types
from hpcorch.paths import jobs_dir, spool_dir, wrapper_path
from hpcorch.protocol import BATCH_SCRIPT_FILE, DEFAULT_MAX_RELAUNCHES, JOB_SPEC_FILE
from hpcorch.slurm.backend import SlurmBackend
from hpcorch.slurm.limit_check import check_limits
from hpcorch.slurm.options import SlurmOptions
from hpcorch.slurm.parse import SlurmNode
from hpcorch.slurm.script import (
    JobSpec,
    SidecarSpec,
    SpecError,
    choose_shape,
    render_batch_script,
)

RUNTIME_IMPORT = re.compile(
    r"^\s*(import\s+hpcorch\.(runtime|integrations)\b|"
    r"from\s+hpcorch\.(runtime|integrations)\b|"
    r"from\s+hpcorch\s+import\s+[^#\n]*\b(runtime|integrations)\b)",
    re.MULTILINE,
)
"""A script that imports hpcorch's runtime, or a training library's integration (which
speaks the runtime's protocol), runs managed."""
MODES = ("auto", "managed", "sidecar")


@dataclass(frozen=True)
class SubmitRequest:
    """What a user asks for with ``hpcorch submit``."""

    script: str
    script_args: tuple[str, ...]
    min_gpus: int
    max_gpus: int
    name: str
    gpus: int | None = None
    """The GPUs the user asked for (None: did not say): straight to Slurm the job runs on
    them; in a pool they are the comment's ``req`` (asked for 1, a job of a kind not
    measured yet starts on one GPU)."""
    batch_size: int | None = None
    max_batch_size: int | None = None
    time_limit: str | None = None
    partition: str | None = None
    cpus_per_gpu: int | None = None
    max_per_gpu_batch: int | None = None
    pool: str | None = None
    """The controller's pool (a Slurm reservation): the job is held for the controller."""
    app: str | None = None
    mode: str = "auto"
    """auto (by whether the script imports hpcorch.runtime or an integration), managed or
    sidecar."""
    sidecar: SidecarSpec | None = None
    """The user's sidecar options, if any were given."""
    options: SlurmOptions = field(default_factory=SlurmOptions)
    """Further Slurm options (account, QOS, memory, ...), validated."""
    time_budget_s: int = 0
    """Run time across all launches (0: none); ``time_limit`` is per launch."""
    max_relaunches: int = DEFAULT_MAX_RELAUNCHES
    """Relaunches after checkpointing on its own, e.g. at the time limit (-1: no cap)."""
    epochs: int | None = None
    """The job's declared length in epochs (None: not declared)."""
    dataset_size: int | None = None
    """Samples per epoch the job declares (None: not declared)."""
    setup: tuple[str, ...] = ()
    """Shell lines the batch script runs before the job on every launch (checked)."""
    gpu_types: tuple[str, ...] = ()
    """The GPU types the job accepts (checked names; empty: any)."""


@dataclass(frozen=True)
class SubmitResult:
    job_key: str
    script_text: str
    job_dir: Path
    slurm_id: int | None
    """None for a dry run."""


@dataclass(frozen=True)
class PoolShape:
    partition: str
    nodes: int
    gpus_per_node: int
    cpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nodes * self.gpus_per_node


def pool_shape(
    nodes: Sequence[SlurmNode],
    partition: str,
    only: Sequence[str] | None = None,
    gpu_types: Sequence[str] = (),
    pool: str | None = None,
) -> PoolShape:
    """The GPU shape of a partition, or of the nodes ``only`` (a reservation), the
    smallest node setting the per-node figures; of its nodes of ``gpu_types`` only, when
    given (a type none of its nodes has is refused, naming the types it has)."""
    mine = [n for n in nodes if partition in n.partitions and (only is None or n.name in only)]
    gpu_nodes = [n for n in mine if n.gpus > 0]
    if not gpu_nodes:
        raise SubmitError(f"partition '{partition}' has no GPU nodes")
    if gpu_types:
        have = sorted({n.gpu_type for n in gpu_nodes if n.gpu_type})
        unknown = unknown_types(gpu_types, have)
        if unknown:
            where = f"pool '{pool}'" if pool else f"partition '{partition}'"
            raise SubmitError(
                f"--gpu-types: {where} has no GPU type {', '.join(unknown)} "
                f"(valid: {', '.join(have) or 'none: its GPUs are untyped'})"
            )
        gpu_nodes = [n for n in gpu_nodes if n.gpu_type in gpu_types]
    return PoolShape(
        partition=partition,
        nodes=len(gpu_nodes),
        gpus_per_node=min(n.gpus for n in gpu_nodes),
        cpus_per_node=min(n.cpus for n in gpu_nodes),
    )


def resolve_partition(backend: SlurmBackend, wanted: str | None) -> str:
    names, default = backend.partitions()
    if wanted is None:
        if default is None:
            raise SubmitError("Slurm has no default partition: pass --partition")
        return default
    if wanted not in names:
        raise SubmitError(f"unknown partition '{wanted}' (valid: {', '.join(names) or 'none'})")
    return wanted


def detect_mode(script: str | os.PathLike[str]) -> str:
    """managed if the script imports hpcorch's runtime or an integration, else sidecar."""
    try:
        with open(script, encoding="utf-8", errors="replace") as fh:
            text = fh.read(1 << 20)
    except OSError:
        return "sidecar"
    return "managed" if RUNTIME_IMPORT.search(text) else "sidecar"


def resolve_mode(req: SubmitRequest) -> SidecarSpec | None:
    """The sidecar spec of the job, or None when the script runs managed by the runtime."""
    if req.mode not in MODES:
        raise SubmitError(f"unknown mode '{req.mode}' (valid: {', '.join(MODES)})")
    if req.mode == "managed":
        if req.sidecar is not None:
            raise SubmitError(
                "--stop-signal, --stop-command, --grace, --ckpt-dir, --resume-arg, "
                "--resume-cmd and the progress options apply only to --mode sidecar"
            )
        return None
    if req.mode == "sidecar" or req.sidecar is not None:
        return req.sidecar or SidecarSpec()
    return None if detect_mode(req.script) == "managed" else SidecarSpec()


def new_job_key(name: str) -> str:
    return f"{name}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


def build_spec(req: SubmitRequest, shape: PoolShape, job_key: str, job_dir: Path) -> JobSpec:
    if req.min_gpus > shape.gpus:
        where = f"pool '{req.pool}'" if req.pool else f"partition '{shape.partition}'"
        if req.gpu_types:
            where += f" of type {', '.join(req.gpu_types)}"
        raise SubmitError(
            f"--min-gpus {req.min_gpus} exceeds the {shape.gpus} GPUs of {where} "
            f"({shape.nodes} nodes x {shape.gpus_per_node})"
        )
    max_gpus = min(req.max_gpus, shape.gpus)
    try:
        start = req.min_gpus if req.pool else min(req.gpus or req.min_gpus, max_gpus)
        nodes, per_node = choose_shape(start, shape.gpus_per_node, shape.nodes)
    except SpecError as exc:
        raise SubmitError(str(exc)) from exc
    cpus = req.cpus_per_gpu or max(1, shape.cpus_per_node // shape.gpus_per_node)
    return JobSpec(
        job_key=job_key,
        name=req.name,
        script=str(Path(req.script).resolve()),
        script_args=req.script_args,
        nodes=nodes,
        gpus_per_node=per_node,
        min_gpus=req.min_gpus,
        max_gpus=max_gpus,
        requested_gpus=req.gpus,
        job_dir=str(job_dir),
        wrapper=str(wrapper_path()),
        cpus_per_gpu=cpus,
        global_batch=req.batch_size,
        max_global_batch=req.max_batch_size,
        max_per_gpu_batch=req.max_per_gpu_batch,
        partition=shape.partition,
        reservation=req.pool,
        managed=req.pool is not None,
        app=req.app,
        time_limit=req.time_limit,
        python=sys.executable,
        sidecar=resolve_mode(req),
        min_cpus_per_gpu=req.cpus_per_gpu or 0,
        slurm_options=tuple(req.options.sbatch_lines()),
        time_budget_s=req.time_budget_s,
        max_relaunches=req.max_relaunches,
        epochs=req.epochs,
        dataset_size=req.dataset_size,
        spool=str(spool_dir()) if req.pool is not None else None,
        setup=req.setup,
        gpu_types=req.gpu_types,
    )


def submit(
    req: SubmitRequest,
    backend: SlurmBackend,
    dry_run: bool = False,
    files: Mapping[str, bytes] | None = None,
    note: Callable[[str], None] | None = None,
) -> SubmitResult:
    """Submit ``req`` (into its pool, or straight to Slurm at its minimum GPU count).
    ``files``: more files for the job directory (name -> content), written before sbatch.
    A job Slurm's limits never let run is refused (:mod:`hpcorch.slurm.limit_check`);
    ``note``: where what the limits change of it is said (default: stderr)."""
    partition = resolve_partition(backend, req.partition)
    only = None
    if req.pool is not None:
        pools = backend.reservations()
        if req.pool not in pools:
            valid = ", ".join(sorted(pools)) or "none"
            raise SubmitError(f"pool '{req.pool}' does not exist (valid: {valid})")
        only = pools[req.pool]
    shape = pool_shape(backend.nodes(), partition, only, req.gpu_types, req.pool)
    job_key = new_job_key(req.name)
    # without symbolic links: the controller reads the job's metrics only through plain paths
    job_dir = jobs_dir().resolve() / job_key
    spec = build_spec(req, shape, job_key, job_dir)
    check_limits(
        backend, req.min_gpus, shape.gpus_per_node, spec.cpus_per_gpu, shape.partition,
        req.options.account, req.options.qos, req.time_limit, req.pool is not None,
        note or _stderr,
    )  # fmt: skip
    try:
        text = render_batch_script(spec)
    except SpecError as exc:
        raise SubmitError(str(exc)) from exc
    if dry_run:
        return SubmitResult(job_key, text, job_dir, None)
    job_dir.mkdir(parents=True, mode=0o750)
    (job_dir / BATCH_SCRIPT_FILE).write_text(text)
    for name, content in (files or {}).items():
        if "/" in name or name.startswith("."):
            raise SubmitError(f"not a file name for the job directory: {name!r}")
        (job_dir / name).write_bytes(content)
    record: dict[str, object] = {
        "job_key": job_key,
        "request": asdict(req),
        "spec": asdict(spec),
        "slurm_id": None,
    }
    _write_json(job_dir / JOB_SPEC_FILE, record)
    try:
        slurm_id = backend.submit(text)
    except HpcorchError:
        shutil.rmtree(job_dir, ignore_errors=True)  # nothing was submitted: leave no trace
        raise
    record["slurm_id"] = slurm_id
    _write_json(job_dir / JOB_SPEC_FILE, record)
    return SubmitResult(job_key, text, job_dir, slurm_id)


def _stderr(line: str) -> None:
    print(f"hpcorch submit: {line}", file=sys.stderr)


def _write_json(path: Path, doc: object) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    with open(tmp, "w") as fh:
        json.dump(doc, fh, indent=2)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
