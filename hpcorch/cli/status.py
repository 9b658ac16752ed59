"""``hpcorch status`` (with squeue's habits) and ``hpcorch cancel``."""

from __future__ import annotations

import getpass
import json
import time
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

import click

from hpcorch.cli import params
from hpcorch.cli.argtypes import JOB_ID_LIST, NAME_LIST, flatten
from hpcorch.errors import HpcorchError
from hpcorch.paths import controller_dir
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.parse import SlurmJob
from hpcorch.slurm.script import parse_comment
from hpcorch.status import (
    FormatError,
    JobRow,
    Managed,
    PoolRow,
    job_rows,
    parse_format,
    pool_rows,
    render_foreign,
    render_status,
    status_document,
)
from hpcorch.status_format import COMPACT_STATES, JOB_STATES

if TYPE_CHECKING:
    from hpcorch.cli.poolview import View
    from hpcorch.controller.store import JobRecord

PHASES = (
    "queued",
    "starting",
    "running",
    "stopping",
    "done",
    "failed",
    "cancelled",
    "lost",
    "timeout",
    "refused",
    "left",
)
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")


def _fail(exc: HpcorchError) -> click.ClickException:
    return click.ClickException(str(exc))


@dataclass(frozen=True)
class Filters:
    users: tuple[str, ...] = ()
    job_ids: tuple[int, ...] = ()
    states: tuple[str, ...] = ()
    phases: tuple[str, ...] = ()
    names: tuple[str, ...] = ()


def _check_states(states: tuple[str, ...]) -> tuple[str, ...]:
    if any(s.upper() == "ALL" for s in states):
        return ()
    for s in states:
        if s.upper() not in JOB_STATES and s.upper() not in COMPACT_STATES:
            raise click.BadParameter(
                f"unknown job state {s!r} (valid: {', '.join(sorted(JOB_STATES))}, "
                f"squeue's codes {', '.join(COMPACT_STATES)}, or all)",
                param_hint="'-t' / '--states'",
            )
    return states


def _check_phases(phases: tuple[str, ...]) -> tuple[str, ...]:
    for p in phases:
        if p.lower() not in PHASES:
            raise click.BadParameter(
                f"unknown phase {p!r} (valid: {', '.join(PHASES)})", param_hint="'--phase'"
            )
    return tuple(p.lower() for p in phases)


@click.command(context_settings={"help_option_names": ["--help"]})
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document (versioned).")
@click.option("--me", is_flag=True, help="Only my jobs.")
@click.option("-u", "--user", "users", type=NAME_LIST, multiple=True, help="Only these users'.")
@click.option("-j", "--jobs", "job_ids", type=JOB_ID_LIST, multiple=True, help="Only these jobs.")
@click.option(
    "-t",
    "--states",
    type=NAME_LIST,
    multiple=True,
    help="Only jobs in these Slurm states (names or squeue's codes: PD,R,CD,F,...).",
)
@click.option("--phase", "phases", type=NAME_LIST, multiple=True, help="Only these phases.")
@click.option("-n", "--name", "names", type=NAME_LIST, multiple=True, help="Only these names.")
@click.option("-h", "--noheader", is_flag=True, help="No header line (and no pool).")
@click.option(
    "-o",
    "--format",
    "fmt",
    help="Columns: squeue's %-format ('%.8i %j %T %M') or field names "
    "('jobid,name,phase,gpus'); implies no pool section.",
)
@click.option("--watch", type=params.Number(0.5, 86400.0), help="Refresh every N seconds.")
@click.option(
    "--state-dir",
    envvar="HPCORCH_CONTROLLER_DIR",
    type=params.StateDir(),
    help="The controller's state directory, for its view of the jobs.",
)
def status(
    as_json: bool,
    me: bool,
    users: tuple[tuple[str, ...], ...],
    job_ids: tuple[tuple[int, ...], ...],
    states: tuple[tuple[str, ...], ...],
    phases: tuple[tuple[str, ...], ...],
    names: tuple[tuple[str, ...], ...],
    noheader: bool,
    fmt: str | None,
    watch: float | None,
    state_dir: str | None,
) -> None:
    """Show the pool and hpcorch's jobs: Slurm's STATE and the controller's PHASE."""
    who = flatten(users) + ((getpass.getuser(),) if me else ())
    filters = Filters(
        users=who,
        job_ids=flatten(job_ids),
        states=_check_states(flatten(states)),
        phases=_check_phases(flatten(phases)),
        names=flatten(names),
    )
    _check_users(who)
    if fmt is not None:
        from hpcorch.status import JOB_FIELDS

        try:
            parse_format(fmt, JOB_FIELDS)
        except FormatError as exc:
            raise click.BadParameter(str(exc), param_hint="'-o' / '--format'") from exc
    while True:
        text, unknown = _status_text(as_json, filters, state_dir, fmt, noheader)
        if watch is None:
            click.echo(text)
            if unknown:  # as squeue: the others shown, the missing ones an error
                ids = ", ".join(map(str, unknown))
                raise click.ClickException(f"invalid job id(s): {ids} (not known to Slurm)")
            return
        click.clear()
        click.echo(f"every {watch:g} s: hpcorch status    {time.strftime('%H:%M:%S')}\n")
        click.echo(text)
        time.sleep(watch)


def managed_of(records: list[JobRecord]) -> dict[int, Managed]:
    """What the controller adds to each job's row."""
    return {
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
            r.gpu_type,
        )
        for r in records
    }


def controller_view(state_dir: str | None) -> View | None:
    """The controller's jobs and pool as this user may see them (its database, else its
    query socket); None when there is none here or its database is unreadable (status
    then shows Slurm's view alone). A controller that cannot be asked is one error line."""
    from hpcorch.cli.poolview import PoolViewError, load_view

    try:
        return load_view(controller_dir(state_dir))
    except PoolViewError as exc:
        raise _fail(exc) from None
    except (HpcorchError, OSError, ValueError):
        return None


def gather(
    filters: Filters, state_dir: str | None
) -> tuple[list[PoolRow], list[JobRow], View | None, list[int]]:
    """The pool and the jobs as status shows them (three Slurm calls), the controller's
    view they came with, and the job ids asked for that Slurm does not know."""
    view = controller_view(state_dir)
    try:
        backend = make_backend()
        jobs = backend.jobs()
        nodes = backend.nodes()
        _, default = backend.partitions()
    except HpcorchError as exc:
        raise _fail(exc) from exc
    from hpcorch.slurm.history import recent_ids, with_history

    # the controller's jobs squeue has forgotten, from sacct
    jobs = with_history(jobs, recent_ids(view.records if view else []), backend)
    managed = managed_of(view.records) if view else {}
    pool_nodes = [str(n["name"]) for n in view.pool] if view else []
    rows = job_rows(
        jobs,
        int(time.time()),
        filters.users,
        managed,
        job_ids=filters.job_ids,
        states=filters.states,
        phases=filters.phases,
        names=filters.names,
        node_types={n.name: n.gpu_type for n in nodes if n.gpu_type},
    )
    if pool_nodes:
        nodes = [n for n in nodes if n.name in pool_nodes]
    known = {j.job_id for j in jobs}
    unknown = [i for i in dict.fromkeys(filters.job_ids) if i not in known]
    return pool_rows(nodes, None if pool_nodes else default), rows, view, unknown


def _check_users(users: tuple[str, ...]) -> None:
    """An unknown user is an error, as squeue's ``Invalid user``."""
    import pwd

    for name in users:
        try:
            pwd.getpwnam(name)
        except KeyError:
            hint = "'-u' / '--user'"
            raise click.BadParameter(f"invalid user: {name}", param_hint=hint) from None


def _status_text(
    as_json: bool, filters: Filters, state_dir: str | None, fmt: str | None, noheader: bool
) -> tuple[str, list[int]]:
    pool, rows, view, unknown = gather(filters, state_dir)
    from hpcorch.controller.usage import render_usage, user_usage

    usage = user_usage(view.records) if view else None  # GPU time by user
    if as_json:
        doc = status_document(pool, rows)
        doc["foreign"] = view.foreign if view else []
        if usage is not None:
            doc["usage"] = [asdict(u) for u in usage]
        return json.dumps(doc, indent=2), unknown
    text = render_status(pool, rows, fmt, header=not noheader, show_pool=not (fmt or noheader))
    foreign = render_foreign(view.foreign) if view and not (fmt or noheader) else ""
    if foreign:  # jobs on the pool's nodes the controller did not place
        text += "\n\n" + foreign
    if usage is None or fmt or noheader:
        return text, unknown
    return text + "\n\n" + render_usage(usage), unknown


# --- cancel ----------------------------------------------------------------------------
def select_for_cancel(
    jobs: list[SlurmJob],
    job_ids: tuple[int, ...],
    users: tuple[str, ...],
    names: tuple[str, ...],
) -> tuple[list[SlurmJob], list[str]]:
    """The jobs to cancel and the errors (one line each): every given id must be one of
    hpcorch's live jobs; the filters pick among hpcorch's live jobs (all must match)."""
    by_id = {j.job_id: j for j in jobs}
    chosen: list[SlurmJob] = []
    errors: list[str] = []

    def matches(j: SlurmJob) -> bool:
        return (not users or j.user in users) and (not names or j.name in names)

    for job_id in dict.fromkeys(job_ids):
        job = by_id.get(job_id)
        if job is None:
            errors.append(f"no job {job_id} in Slurm")
        elif parse_comment(job.comment) is None:
            errors.append(f"job {job_id} was not submitted by hpcorch")
        elif job.state in ENDED:
            errors.append(f"job {job_id} already ended ({job.state})")
        elif matches(job):
            chosen.append(job)
    if not job_ids:
        chosen = [
            j
            for j in sorted(jobs, key=lambda j: j.job_id)
            if parse_comment(j.comment) is not None and j.state not in ENDED and matches(j)
        ]
    return chosen, errors


@click.command()
@click.argument("job_ids", nargs=-1, type=params.JOB_ID)
@click.option("--user", "-u", "users", type=NAME_LIST, multiple=True, help="Jobs of these users.")
@click.option("--me", is_flag=True, help="My jobs.")
@click.option("--name", "-n", "names", type=NAME_LIST, multiple=True, help="Jobs with these names.")
def cancel(
    job_ids: tuple[int, ...],
    users: tuple[tuple[str, ...], ...],
    me: bool,
    names: tuple[tuple[str, ...], ...],
) -> None:
    """Cancel hpcorch jobs: the JOB_IDS given, or those of --user/--me/--name (with ids,
    the filters must match too). Slurm itself checks that the jobs are yours."""
    who = flatten(users) + ((getpass.getuser(),) if me else ())
    wanted_names = flatten(names)
    if not job_ids and not who and not wanted_names:
        raise click.UsageError("give JOB_IDS, or select jobs with --user, --me or --name")
    try:
        backend = make_backend()
        jobs = backend.jobs()
    except HpcorchError as exc:
        raise _fail(exc) from exc
    chosen, errors = select_for_cancel(jobs, job_ids, who, wanted_names)
    for job in chosen:
        try:
            backend.cancel(job.job_id, signal=None)
            click.echo(f"cancelled job {job.job_id}")
        except HpcorchError as exc:
            errors.append(f"job {job.job_id}: {exc}")
    for line in errors:
        click.echo(f"Error: {line}", err=True)
    if not chosen and not errors:
        click.echo("no running or pending hpcorch job matches", err=True)
    if errors:
        raise SystemExit(1)


def describe_from_slurm(job_id: int) -> None:
    """``describe`` for a job no controller here knows: Slurm's view and its directory."""
    from hpcorch.joblogs import find_job_dir, log_name
    from hpcorch.timefmt import fmt_duration

    try:
        job = next((j for j in make_backend().jobs() if j.job_id == job_id), None)
    except HpcorchError as exc:
        raise _fail(exc) from exc
    directory = find_job_dir(job_id, job)
    if job is None and directory is None:
        raise click.ClickException(f"job {job_id} is known neither to Slurm nor to a controller")
    if job is not None:
        tags = parse_comment(job.comment)
        if tags is None:
            raise click.ClickException(f"job {job_id} was not submitted by hpcorch")
        limit = fmt_duration(job.time_limit_min * 60 if job.time_limit_min else None)
        click.echo(f"job {job_id} ({job.name}) of {job.user}: {job.state} (no controller)")
        click.echo(
            f"  GPUs {job.gpus} (range {tags.get('min', '?')}-{tags.get('max', '?')}), "
            f"restarts {job.restarts}, time limit {limit} per launch, account "
            f"{job.account or '-'}, QOS {job.qos or '-'}"
        )
    else:
        click.echo(f"job {job_id}: Slurm no longer lists it")
    if directory is not None:
        click.echo(f"  directory {directory}")
        click.echo(f"  output {directory / log_name(job_id)} (hpcorch logs {job_id})")
