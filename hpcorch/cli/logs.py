"""``hpcorch logs``: a job's output across its launches, followed through relaunches."""

from __future__ import annotations

import getpass
import sys
import time
from pathlib import Path

import click

from hpcorch.cli import params
from hpcorch.errors import HpcorchError
from hpcorch.joblogs import (
    find_job_dir,
    is_over,
    launch_slice,
    launch_start,
    log_name,
    pooled_job,
    relaunch_overdue,
    tail,
)
from hpcorch.slurm.backend import SlurmBackend
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.parse import SlurmJob


def _job(backend: SlurmBackend, job_id: int) -> SlurmJob | None:
    return next((j for j in backend.jobs() if j.job_id == job_id), None)


def _write(data: bytes) -> None:
    sys.stdout.buffer.write(data)
    sys.stdout.buffer.flush()


@click.command()
@click.argument("job_id", type=params.JOB_ID)
@click.option("-f", "--follow", is_flag=True, help="Keep printing until the job ends for good.")
@click.option(
    "--launch",
    type=params.Integer(1, 1_000_000),
    help="Only this launch (1: the first, as status and describe count; with -f: from it on).",
)
@click.option(
    "-n",
    "--lines",
    type=params.Integer(0, 10_000_000),
    help="Only the last N lines (before following).",
)
@click.option(
    "--interval",
    type=params.Number(0.1, 60.0),
    default=1.0,
    show_default=True,
    help="Seconds between checks when following.",
)
def logs(job_id: int, follow: bool, launch: int | None, lines: int | None, interval: float) -> None:
    """Print the output of hpcorch job JOB_ID, every launch of it (relaunches after a
    resize, a preemption or a time limit append to the same file)."""
    try:
        backend = make_backend()
        job = _job(backend, job_id)
    except HpcorchError as exc:
        raise click.ClickException(str(exc)) from exc
    try:
        directory = find_job_dir(job_id, job)
    except PermissionError:
        raise _not_yours(job_id, job) from None
    if directory is None:
        if job is not None and job.user != getpass.getuser():
            raise _not_yours(job_id, job)
        where = "Slurm lists it, but " if job is not None else ""
        raise click.ClickException(
            f"no job directory for job {job_id}: {where}it was not submitted by hpcorch "
            "from this account (or $HPCORCH_HOME differs)"
        )
    path = directory / log_name(job_id)
    try:
        data = _read(path, 0)
    except PermissionError:
        raise _not_yours(job_id, job) from None
    offset = len(data)
    if launch is not None:
        try:
            data = data[launch_start(data, launch) :] if follow else launch_slice(data, launch)
        except ValueError as exc:
            if not follow:
                raise click.ClickException(f"job {job_id}: {exc}") from exc
            data, offset = b"", 0  # wait for it
    if lines is not None:
        data = tail(data, lines)
    _write(data)
    if not follow:
        return
    _follow(
        backend, job_id, path, offset, launch if launch is not None and not data else None, interval
    )


def _not_yours(job_id: int, job: SlurmJob | None) -> click.ClickException:
    """The output of a job this user may not read (as the file system says): one line,
    without the other user's paths."""
    owner = job.user if job is not None and job.user else "another user"
    return click.ClickException(
        f"cannot read the output of job {job_id}: it is {owner}'s (permission denied)"
    )


def _read(path: Path, offset: int) -> bytes:
    """What ``path`` holds from ``offset`` (b"" if it is not there yet); PermissionError
    passes (the caller says whose the job is)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read()
    except FileNotFoundError:
        return b""
    except PermissionError:
        raise
    except OSError as exc:
        raise click.ClickException(f"cannot read {path}: {exc.strerror}") from exc


def _follow(
    backend: SlurmBackend,
    job_id: int,
    path: Path,
    offset: int,
    waiting_for: int | None,
    interval: float,
) -> None:
    """Print what is appended until the job is over; a relaunch appends to the same file."""
    checked = 0.0
    while True:
        new = _read(path, offset)
        if new:
            if waiting_for is not None:
                whole = _read(path, 0)
                try:
                    start = launch_start(whole, waiting_for)
                except ValueError:
                    start = -1
                if start >= 0:
                    _write(whole[start:])
                    waiting_for = None
                offset = len(whole)
            else:
                _write(new)
                offset += len(new)
            continue
        now = time.monotonic()
        if now - checked >= max(interval, 2.0):
            checked = now
            try:
                job = _job(backend, job_id)
            except HpcorchError as exc:
                click.echo(f"hpcorch logs: {exc}", err=True)
                job = None
            pooled = pooled_job(job)
            if is_over(job, pooled) or (job and pooled and relaunch_overdue(job, time.time())):
                rest = _read(path, offset)
                if rest and waiting_for is None:
                    _write(rest)
                state = job.state if job else "gone from Slurm"
                click.echo(f"hpcorch logs: job {job_id} ended ({state})", err=True)
                return
        time.sleep(interval)
