"""The holds and releases of a cycle's actions, sent together: one request for all the
jobs (scontrol takes a list of job ids), each job on its own only when that fails, so that
the ones Slurm refused are known."""

from __future__ import annotations

from collections.abc import Sequence

from hpcorch.errors import SlurmCommandError
from hpcorch.slurm.backend import SlurmBackend, tolerate


def set_held_together(
    backend: SlurmBackend, job_ids: Sequence[int], held: bool, ok: Sequence[str]
) -> dict[int, str]:
    """Hold (``held``) or release ``job_ids``: the jobs whose request failed, with Slurm's
    error (one that says one of ``ok``, lower case, is no failure). ``SlurmUnavailable``
    is raised, as by every request."""
    if not job_ids:
        return {}
    try:
        backend.set_held(job_ids, held)
        return {}
    except SlurmCommandError:
        pass  # some job of the list was refused: which one is asked job by job
    failed: dict[int, str] = {}
    for job_id in job_ids:
        try:
            tolerate(backend.hold if held else backend.release, job_id, ok)
        except SlurmCommandError as exc:
            failed[job_id] = str(exc)
    return failed
