"""``hpcorch resize``: pin a job of the pool to a GPU count, or unpin it. The pin is a tag
of the job's Slurm comment (``pin=N``), which Slurm lets only the job's owner or an admin
change; the controller applies it at its next round, within the job's bounds."""

from __future__ import annotations

import click

from hpcorch.cli import params
from hpcorch.controller.validate import TagError, tag_int
from hpcorch.errors import HpcorchError, SlurmCommandError
from hpcorch.protocol import JOB_COMMENT_TAG, MAX_GPUS
from hpcorch.slurm.backend import SlurmBackend
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.script import parse_comment


@click.command()
@click.argument("job_id", type=params.JOB_ID)
@click.option("--gpus", type=params.GPUS, help="Pin the job to this many GPUs.")
@click.option("--auto", is_flag=True, help="Remove a pin: the policy decides again.")
def resize(job_id: int, gpus: int | None, auto: bool) -> None:
    """Pin a job's GPU count (or --auto to unpin). Slurm checks the job is yours."""
    if (gpus is None) == (not auto):
        raise click.UsageError("give either --gpus N or --auto")
    try:
        backend = make_backend()
        job = next((j for j in backend.jobs() if j.job_id == job_id), None)
        if job is None:
            raise HpcorchError(f"no job {job_id} in Slurm")
        fields = parse_comment(job.comment)
        if fields is None:
            raise HpcorchError(f"job {job_id} was not submitted by hpcorch")
        if gpus is not None:
            check_pin(job_id, gpus, fields, _pool_gpus(backend, job.reservation))
        fields.pop("pin", None)
        if gpus is not None:
            fields["pin"] = str(gpus)
        comment = f"{JOB_COMMENT_TAG}:" + ",".join(f"{k}={v}" for k, v in fields.items())
        try:
            backend.set_comment(job_id, comment)
        except SlurmCommandError as exc:
            text = str(exc).lower()
            if "invalid user id" in text or "denied" in text or "not authorized" in text:
                raise HpcorchError(
                    f"job {job_id} is not yours: Slurm refused the change ({exc})"
                ) from exc
            raise
    except HpcorchError as exc:
        raise click.ClickException(str(exc)) from exc
    what = f"pinned to {gpus} GPUs" if gpus else "unpinned"
    click.echo(f"job {job_id} {what}; the controller applies it at its next round")


def check_pin(job_id: int, gpus: int, tags: dict[str, str], pool_gpus: int) -> None:
    """A pin within the job's own bounds (its comment's min and max) and the pool's GPUs,
    else an HpcorchError saying which bound it breaks."""
    try:
        lo = tag_int(tags, "min", 1, MAX_GPUS) or 1
        hi = tag_int(tags, "max", 1, MAX_GPUS) or MAX_GPUS
    except TagError as exc:
        raise HpcorchError(f"job {job_id} has a malformed comment ({exc}): not pinned") from exc
    if not lo <= gpus <= hi:
        raise HpcorchError(
            f"job {job_id} takes {lo}-{hi} GPUs: cannot pin it to {gpus} (use --gpus {lo}..{hi})"
        )
    if pool_gpus and gpus > pool_gpus:
        raise HpcorchError(f"job {job_id}'s pool has {pool_gpus} GPUs: cannot pin it to {gpus}")


def _pool_gpus(backend: SlurmBackend, reservation: str) -> int:
    """The GPUs of the reservation's nodes (0: no reservation, or it cannot be read)."""
    if not reservation:
        return 0
    try:
        names = set(backend.reservation_nodes(reservation))
        return sum(n.gpus for n in backend.nodes() if n.name in names)
    except HpcorchError:
        return 0
