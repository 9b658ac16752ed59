"""``hpcorch submit``, ``status`` and ``cancel``."""

from __future__ import annotations

import getpass
import json
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from hpcorch.errors import HpcorchError
from hpcorch.paths import STATE_DB, controller_dir
from hpcorch.protocol import MAX_CPUS_PER_GPU, MAX_GLOBAL_BATCH, MAX_GPUS, MAX_GRACE_S
from hpcorch.sidecar.config import SidecarError, check_regex, signal_number
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.script import SidecarSpec, SpecError, check_name, check_time, parse_comment
from hpcorch.status import Managed, job_rows, pool_rows, render_status, status_document
from hpcorch.submit import SubmitRequest
from hpcorch.submit import submit as submit_job


def _fail(exc: HpcorchError) -> click.ClickException:
    return click.ClickException(str(exc))


def sidecar_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The options of a script that does not use hpcorch's runtime."""
    opts = [
        click.option(
            "--mode",
            type=click.Choice(["auto", "managed", "sidecar"]),
            default="auto",
            show_default=True,
            help="managed: the script uses hpcorch.runtime; sidecar: hpcorch stops and "
            "restarts it; auto: managed if the script imports hpcorch.runtime.",
        ),
        click.option("--stop-signal", help="Sidecar: signal that stops the script [TERM]."),
        click.option("--stop-command", help="Sidecar: shell command that stops the script."),
        click.option(
            "--grace",
            type=click.IntRange(0, MAX_GRACE_S),
            help="Sidecar: seconds the script has to exit before it is killed [60].",
        ),
        click.option(
            "--ckpt-dir",
            type=click.Path(file_okay=False),
            help="Sidecar: where the script writes its checkpoints.",
        ),
        click.option(
            "--resume-arg",
            "resume_args",
            multiple=True,
            help="Sidecar: arguments added on a relaunch, e.g. '--resume {ckpt}' "
            "({ckpt}: the newest file in --ckpt-dir).",
        ),
        click.option("--resume-cmd", help="Sidecar: the command line of a relaunch instead."),
        click.option(
            "--progress-regex",
            help=r"Sidecar: regex over the script's output, e.g. 'step (\d+)/(\d+)'.",
        ),
        click.option(
            "--progress-file",
            type=click.Path(dir_okay=False),
            help='Sidecar: JSON-lines file the script writes, e.g. {"step": 10, "total": 900}.',
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def sidecar_spec(
    stop_signal: str | None,
    stop_command: str | None,
    grace: int | None,
    ckpt_dir: str | None,
    resume_args: tuple[str, ...],
    resume_cmd: str | None,
    progress_regex: str | None,
    progress_file: str | None,
) -> SidecarSpec | None:
    """The sidecar options as given, checked; None when none was given."""
    given = (stop_signal, stop_command, grace, ckpt_dir, resume_cmd, progress_regex)
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
        raise click.UsageError(str(exc)) from exc
    if stop_signal is not None and stop_command is not None:
        raise click.UsageError("give --stop-signal or --stop-command, not both")
    if resume_cmd is not None and not cmd:
        raise click.UsageError("--resume-cmd is empty")
    if args and cmd:
        raise click.UsageError("give --resume-arg or --resume-cmd, not both")
    if ckpt_dir is None and any("{ckpt}" in a for a in (*args, *cmd)):
        raise click.UsageError("{ckpt} in the resume arguments needs --ckpt-dir")
    return SidecarSpec(
        stop_signal=(stop_signal or "TERM").strip().upper().removeprefix("SIG"),
        stop_command=stop_command,
        grace_s=60 if grace is None else grace,
        ckpt_dir=str(Path(ckpt_dir).resolve()) if ckpt_dir else None,
        resume_args=args,
        resume_cmd=cmd,
        progress_regex=progress_regex,
        progress_file=str(Path(progress_file).resolve()) if progress_file else None,
    )


@click.command(context_settings={"ignore_unknown_options": True})
@click.argument("script", type=click.Path(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--min-gpus", type=click.IntRange(1, MAX_GPUS), required=True, help="Fewest GPUs.")
@click.option("--max-gpus", type=click.IntRange(1, MAX_GPUS), help="Most GPUs [default: min].")
@click.option(
    "--batch-size",
    type=click.IntRange(1, MAX_GLOBAL_BATCH),
    help="Global batch size to start with.",
)
@click.option(
    "--max-batch-size",
    type=click.IntRange(1, MAX_GLOBAL_BATCH),
    help="Largest global batch size.",
)
@click.option("--time", "time_limit", help="Slurm time limit, e.g. 2:00:00 or 1-12.")
@click.option("--partition", help="Slurm partition [default: Slurm's default].")
@click.option("--name", help="Job name [default: the script's name].")
@click.option("--cpus-per-gpu", type=click.IntRange(1, MAX_CPUS_PER_GPU), help="CPUs per GPU task.")
@click.option(
    "--max-per-gpu-batch",
    type=click.IntRange(1, MAX_GLOBAL_BATCH),
    help="Largest per-GPU micro-batch that fits in memory.",
)
@click.option(
    "--pool",
    envvar="HPCORCH_POOL",
    help="The controller's pool (reservation) [default: $HPCORCH_POOL; none: straight to Slurm].",
)
@click.option("--app", help="Application name; jobs of one application share a model.")
@click.option("--dry-run", is_flag=True, help="Print the batch script; submit nothing.")
@click.option("--parsable", is_flag=True, help="Print only the Slurm job id.")
@sidecar_options
def submit(
    script: str,
    script_args: tuple[str, ...],
    min_gpus: int,
    max_gpus: int | None,
    batch_size: int | None,
    max_batch_size: int | None,
    time_limit: str | None,
    partition: str | None,
    name: str | None,
    cpus_per_gpu: int | None,
    max_per_gpu_batch: int | None,
    pool: str | None,
    app: str | None,
    dry_run: bool,
    parsable: bool,
    mode: str,
    **sidecar_options: Any,
) -> None:
    """Submit SCRIPT (a PyTorch training script) with SCRIPT_ARGS.

    Put hpcorch's options before SCRIPT; everything after SCRIPT goes to the script
    unchanged (use `--` before script options that hpcorch also has).
    """
    max_gpus = max_gpus or min_gpus
    if max_gpus < min_gpus:
        raise click.UsageError(f"--min-gpus {min_gpus} is above --max-gpus {max_gpus}")
    if batch_size and max_batch_size and max_batch_size < batch_size:
        raise click.UsageError(
            f"--batch-size {batch_size} is above --max-batch-size {max_batch_size}"
        )
    name = name or Path(script).stem.replace(" ", "_") or "job"
    try:
        check_name(name)
        if app:
            check_name(app)
        if time_limit:
            check_time(time_limit)
    except SpecError as exc:
        raise click.UsageError(str(exc)) from exc
    if script_args[:1] == ("--",):
        script_args = script_args[1:]
    sidecar = sidecar_spec(**sidecar_options)
    req = SubmitRequest(
        script=script,
        script_args=script_args,
        min_gpus=min_gpus,
        max_gpus=max_gpus,
        name=name,
        batch_size=batch_size,
        max_batch_size=max_batch_size,
        time_limit=time_limit,
        partition=partition,
        cpus_per_gpu=cpus_per_gpu,
        max_per_gpu_batch=max_per_gpu_batch,
        pool=pool or None,
        app=app,
        mode=mode,
        sidecar=sidecar,
    )
    try:
        result = submit_job(req, make_backend(), dry_run=dry_run)
    except HpcorchError as exc:
        raise _fail(exc) from exc
    if dry_run:
        click.echo(result.script_text, nl=False)
    elif parsable:
        click.echo(str(result.slurm_id))
    else:
        click.echo(f"Submitted job {result.slurm_id} ({result.job_key}); files in {result.job_dir}")


@click.command()
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document.")
@click.option("--me", is_flag=True, help="Only my jobs.")
@click.option("--watch", type=click.FloatRange(min=0.5), help="Refresh every N seconds.")
@click.option(
    "--state-dir",
    envvar="HPCORCH_CONTROLLER_DIR",
    help="The controller's state directory, for its view of the jobs.",
)
def status(as_json: bool, me: bool, watch: float | None, state_dir: str | None) -> None:
    """Show the pool and hpcorch's jobs."""
    while True:
        text = _status_text(as_json, me, state_dir)
        if watch is None:
            click.echo(text)
            return
        click.clear()
        click.echo(f"every {watch:g} s: hpcorch status    {time.strftime('%H:%M:%S')}\n")
        click.echo(text)
        time.sleep(watch)


def _managed(state_dir: str | None) -> tuple[dict[int, Managed], list[str] | None]:
    """The controller's view of its jobs, and its pool's nodes, when its state is readable."""
    path = controller_dir(state_dir) / STATE_DB
    if not path.exists():
        return {}, None
    from hpcorch.controller.store import Store  # only when a controller's state is there

    try:
        store = Store(path, readonly=True)
        found = {
            r.slurm_id: Managed(
                r.phase,
                r.reason,
                r.global_batch or r.target_batch,
                r.micro_batch,
                r.accum_steps,
                r.samples_per_s,
                r.launches,
                r.mode + (" (detected)" if r.mode_detected else ""),
                r.lost_steps,
            )
            for r in store.jobs()
        }
        pool = [n["name"] for n in json.loads(store.get_meta("pool") or "[]")]
        store.close()
    except (HpcorchError, OSError, ValueError):
        return {}, None
    return found, pool or None


def _status_text(as_json: bool, me: bool, state_dir: str | None) -> str:
    try:
        backend = make_backend()
        jobs = backend.jobs()
        nodes = backend.nodes()
        _, default = backend.partitions()
    except HpcorchError as exc:
        raise _fail(exc) from exc
    managed, pool_nodes = _managed(state_dir)
    rows = job_rows(jobs, int(time.time()), getpass.getuser() if me else None, managed)
    if pool_nodes:
        nodes = [n for n in nodes if n.name in pool_nodes]
    pool = pool_rows(nodes, None if pool_nodes else default)
    if as_json:
        return json.dumps(status_document(pool, rows), indent=2)
    return render_status(pool, rows)


@click.command()
@click.argument("job_id", type=click.IntRange(min=1))
def cancel(job_id: int) -> None:
    """Cancel hpcorch job JOB_ID (its Slurm job id)."""
    try:
        backend = make_backend()
        job = next((j for j in backend.jobs() if j.job_id == job_id), None)
        if job is None:
            raise HpcorchError(f"no job {job_id} in Slurm")
        if parse_comment(job.comment) is None:
            raise HpcorchError(f"job {job_id} was not submitted by hpcorch")
        if job.state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL"):
            raise HpcorchError(f"job {job_id} already ended ({job.state})")
        backend.cancel(job_id, signal=None)
    except HpcorchError as exc:
        raise _fail(exc) from exc
    click.echo(f"cancelled job {job_id}")
