"""``hpcorch submit``."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import click

from hpcorch.cli import params
from hpcorch.errors import HpcorchError
from hpcorch.protocol import MAX_DECLARED_EPOCHS, MAX_DECLARED_SAMPLES, MAX_GRACE_S
from hpcorch.request import SIDECAR_KEYS, RequestError, build_request, sidecar_spec
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.options import ENV_DEFAULTS, ignored_env
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
            help="managed: the script uses hpcorch.runtime (or an hpcorch.integrations "
            "module); sidecar: hpcorch stops and restarts it; auto: managed if the script "
            "imports either.",
        ),
        click.option(
            "--stop-signal",
            type=params.SIGNAL,
            help="Sidecar: signal that stops the script [TERM].",
        ),
        click.option("--stop-command", help="Sidecar: shell command that stops the script."),
        click.option(
            "--grace",
            type=params.Integer(0, MAX_GRACE_S),
            help="Sidecar: seconds the script has to exit before it is killed [60].",
        ),
        click.option(
            "--ckpt-dir",
            type=params.PathType(file_okay=False),
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
            type=params.PathType(dir_okay=False),
            help='Sidecar: JSON-lines file the script writes, e.g. {"step": 10, "total": 900}.',
        ),
        click.option(
            "--live-batch",
            is_flag=True,
            default=None,
            help="Sidecar: the script takes a new global batch while it runs, from the file "
            "$HPCORCH_BATCH_FILE names (else a batch change waits for a relaunch).",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def slurm_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """Slurm options passed on to the job (hpcorch/slurm/options.py validates them)."""
    opts = [
        click.option("--account", "-A", help="Slurm account to charge [$SBATCH_ACCOUNT]."),
        click.option("--qos", "-q", help="Slurm QOS [$SBATCH_QOS]."),
        click.option("--mem", help="Memory per node, e.g. 32G [$SBATCH_MEM_PER_NODE]."),
        click.option(
            "--constraint", "-C", help="Node features, e.g. 'a100&ib' [$SBATCH_CONSTRAINT]."
        ),
        click.option("--mail-type", help="Mail on BEGIN, END, FAIL, REQUEUE, ALL, ... "),
        click.option("--mail-user", help="Mail address [default: Slurm's, your user]."),
        click.option("--dependency", "-d", help="Start after other jobs, e.g. afterok:123[:124]."),
        click.option("--exclusive", is_flag=True, help="Whole nodes (not in a pool)."),
        click.option(
            "--sbatch-arg",
            "sbatch_args",
            multiple=True,
            metavar="--OPTION[=VALUE]",
            help="A further sbatch option by its full name, with =VALUE where it takes "
            "one (repeatable), e.g. --sbatch-arg=--mem-per-gpu=20G. Passed: acctg-freq, "
            "begin, deadline, exclude, kill-on-invalid-dep, licenses, mem-per-cpu, "
            "mem-per-gpu, nice, oversubscribe, profile, propagate, tmp, wckey; "
            "abbreviations, short options and options hpcorch sets itself are refused.",
        ),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


@click.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.argument("script", type=params.ScriptPath(exists=True, dir_okay=False))
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED)
@click.option("--min-gpus", type=params.Integer(1, 1_000_000), help="Fewest GPUs (required).")
@click.option("--max-gpus", type=params.Integer(1, 1_000_000), help="Most GPUs [default: min].")
@click.option(
    "--gpus",
    type=params.Integer(1, 1_000_000),
    help="GPUs you ask for, within --min-gpus..--max-gpus: straight to Slurm the job runs on "
    "them; in a pool, asked for 1, a job of a kind not measured yet starts on one GPU, not "
    "on a node [default: not said; straight to Slurm, --min-gpus].",
)
@click.option(
    "--batch-size",
    type=params.Integer(1, 1_000_000),
    help="Global batch size to start with.",
)
@click.option("--max-batch-size", type=params.Integer(1, 1_000_000), help="Largest global batch.")
@click.option(
    "--time",
    "-t",
    "time_limit",
    type=params.DURATION,
    help="Time limit of each launch, e.g. 2:00:00, 1-12 or UNLIMITED [$SBATCH_TIMELIMIT].",
)
@click.option(
    "--time-total",
    type=params.DURATION,
    help="Run time across all launches (relaunches included), e.g. 3-00:00:00 [default: no total].",
)
@click.option(
    "--max-relaunches",
    help="Relaunches after the job checkpointed at its time limit, or UNLIMITED [3].",
)
@click.option(
    "--epochs",
    type=params.Integer(1, MAX_DECLARED_EPOCHS),
    help="Epochs the job will train: while it is queued the scheduler ranks it by this "
    "declared length; the job's own report at start overrides it [default: unknown].",
)
@click.option(
    "--dataset-size",
    type=params.Integer(1, MAX_DECLARED_SAMPLES),
    help="Samples per epoch, with --epochs the job's declared length (queue ranking only; "
    "the job's own report at start overrides it) [default: unknown].",
)
@click.option(
    "--partition",
    "-p",
    type=params.Name("partition"),
    help="Slurm partition [$SBATCH_PARTITION, else Slurm's].",
)
@click.option(
    "--name", "-J", type=params.Name("job name"), help="Job name [default: the script's name]."
)
@click.option("--cpus-per-gpu", type=params.Integer(1, 1_000_000), help="CPUs per GPU task.")
@click.option(
    "--max-per-gpu-batch",
    type=params.Integer(1, 1_000_000),
    help="Largest per-GPU micro-batch that fits in memory.",
)
@click.option(
    "--gpu-types",
    metavar="TYPE[,TYPE...]",
    help="GPU types the job may run on, e.g. a100,h100, as Slurm names them (Gres=gpu:TYPE:N); "
    "each launch runs on one of them [default: any].",
)
@click.option(
    "--pool",
    envvar="HPCORCH_POOL",
    type=params.Name("pool name"),
    help="The controller's pool (reservation) [default: $HPCORCH_POOL; none: straight to Slurm].",
)
@click.option(
    "--app",
    type=params.Name("application name"),
    help="Application name; jobs of one application share a model.",
)
@slurm_options
@click.option("--dry-run", is_flag=True, help="Print the batch script; submit nothing.")
@click.option(
    "--setup",
    multiple=True,
    metavar="LINE",
    help="A shell line the batch script runs before the job on every launch, e.g. "
    "--setup 'module load cuda/12.4' (repeatable; submitit's setup).",
)
@click.option("--parsable", is_flag=True, help="Print only the Slurm job id.")
@click.option(
    "--wait",
    is_flag=True,
    help="Wait until the job has ended for good (a pool job's relaunches included) and exit "
    "with its exit code, as sbatch --wait.",
)
@sidecar_options
def submit(
    script: str,
    script_args: tuple[str, ...],
    min_gpus: int | None,
    mode: str,
    dry_run: bool,
    parsable: bool,
    wait: bool,
    **options: Any,
) -> None:
    """Submit SCRIPT (a PyTorch training script) with SCRIPT_ARGS.

    hpcorch's options go before SCRIPT; everything after SCRIPT goes to the script
    unchanged (a `--` right after SCRIPT is dropped), e.g.
    `hpcorch submit --min-gpus 2 train.py --batch-size 64`.
    """
    if script_args[:1] == ("--",):
        script_args = script_args[1:]
    misplaced = _hpcorch_options_in(script_args)
    if min_gpus is None:
        if "--min-gpus" in misplaced:
            raise click.UsageError(
                f"--min-gpus after {script} goes to the script: put hpcorch's options "
                f"before SCRIPT (hpcorch submit --min-gpus N ... {script} [SCRIPT_ARGS])"
            )
        raise click.UsageError("Missing option '--min-gpus'.")
    if misplaced and "--" in script_args:
        click.echo(
            f"hpcorch: note: {', '.join(misplaced)} after {script} go to the script, not to "
            "hpcorch (hpcorch's options go before SCRIPT)",
            err=True,
        )
    try:
        sidecar = sidecar_spec(**{k: options.pop(k) for k in SIDECAR_KEYS})
        req = build_request(
            script, script_args, min_gpus=min_gpus, mode=mode, sidecar=sidecar, **options
        )
    except RequestError as exc:
        raise click.UsageError(str(exc)) from exc
    if not parsable:
        ignored = ignored_env(os.environ)
        if ignored:
            click.echo(
                f"hpcorch: note: ignoring {', '.join(ignored)}: hpcorch writes every option "
                f"into the job's script (it uses only {', '.join(ENV_DEFAULTS)})",
                err=True,
            )
    try:
        backend = make_backend()
        result = submit_job(req, backend, dry_run=dry_run)
    except HpcorchError as exc:
        raise _fail(exc) from exc
    if dry_run:
        click.echo(result.script_text, nl=False)
    elif parsable:
        click.echo(str(result.slurm_id))
    else:
        click.echo(f"Submitted job {result.slurm_id} ({result.job_key}); files in {result.job_dir}")
    if wait and not dry_run and result.slurm_id is not None:
        raise SystemExit(_wait_for(result.slurm_id, result.job_dir, backend))


def _wait_for(job_id: int, job_dir: Any, backend: Any) -> int:
    """Wait for a submitted job to end for good; its exit code (0: COMPLETED), said on
    stderr as sbatch --wait does not, so a script's log shows why it went on."""
    from hpcorch.api import Job

    job = Job(job_id, job_dir, backend=backend)
    try:
        state = job.wait()
        info = job.info()
    except HpcorchError as exc:
        raise _fail(exc) from exc
    code = 0 if state == "COMPLETED" else (info.exit_code if info and info.exit_code else 1)
    click.echo(f"hpcorch: job {job_id} ended: {state} (exit code {code})", err=True)
    return code


def _hpcorch_options_in(args: tuple[str, ...]) -> list[str]:
    """hpcorch's own submit options among the script's arguments before a ``--``."""
    names = {
        opt
        for param in submit.params
        if isinstance(param, click.Option)
        for opt in param.opts
        if opt.startswith("--")
    }
    before = args[: args.index("--")] if "--" in args else args
    found = []
    for a in before:
        name = a.split("=", 1)[0]
        if name in names and name not in found:
            found.append(name)
    return found
