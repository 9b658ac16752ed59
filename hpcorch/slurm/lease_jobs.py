"""The pool's lease as Slurm holds it: a held placeholder job (hpcorch/controller/lease.py
decides; this is its IO).

The job is in the pool's reservation where the reservation admits the controller's
account. A reservation made for its users only does not (Slurm lets root and SlurmUser
past a reservation's user and account lists, not operators), and the controller does not
add itself to a site's reservation (with Users and Accounts both set, Slurm asks a job to
match both): the job is then placed outside it, held on the pool's partition, its comment
naming the pool (``pool=NAME``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from hpcorch.cluster import ENDED_STATES, LEASE_NAME, LEASE_TAG, LeaseJob, lease_pool
from hpcorch.errors import HpcorchError
from hpcorch.slurm.backend import SlurmBackend, tolerate
from hpcorch.slurm.parse import SlurmJob

logger = logging.getLogger("hpcorch.controller")

LEASE_SCRIPT = "#!/bin/sh\nexit 0\n"
"""The lease job's script: it is held and never runs (``exit 0`` if an operator releases it)."""
REFUSED = "access denied to requested reservation"
"""What Slurm says of a job whose user or account the reservation does not admit."""


class SlurmLeaseJobs:
    """Lists, makes, rewrites and drops the lease jobs of ``reservation``'s pool."""

    def __init__(
        self, backend: SlurmBackend, reservation: str, partition: Callable[[], str]
    ) -> None:
        self.backend = backend
        self.reservation = reservation
        self.partition = partition
        """The partition every pool node is in ("" if none), read when first needed."""
        self.outside = False
        """The reservation refused the lease job: it is placed outside it."""

    def is_lease(self, j: SlurmJob) -> bool:
        """A lease job of this pool: in the reservation, or outside it naming the pool."""
        if not j.comment.startswith(LEASE_TAG):
            return False
        return j.reservation == self.reservation or (
            not j.reservation and j.name == LEASE_NAME and lease_pool(j.comment) == self.reservation
        )

    def lease_jobs(self) -> list[LeaseJob]:
        return [as_lease(j) for j in self.backend.jobs(self.reservation) if self.is_lease(j)]

    def create_lease(self, comment: str) -> int:
        """A held placeholder job, never run, on the partition of the pool's nodes: in the
        reservation, or outside it if the reservation refuses it (remembered)."""
        args = ["--hold", f"--job-name={LEASE_NAME}", "--nodes=1", "--time=1"]
        args += ["--output=/dev/null", "--chdir=/", f"--comment={self._pool_note(comment)}"]
        partition = self.partition()
        if partition:
            args.append(f"--partition={partition}")
        if not self.outside:
            try:
                inside = [*args, f"--reservation={self.reservation}"]
                return self.backend.submit(LEASE_SCRIPT, inside)
            except HpcorchError as exc:
                if REFUSED not in str(exc).lower():
                    raise
                self.outside = True
                logger.info(
                    "reservation %r does not admit the controller's account: its lease job "
                    "is outside it, naming the pool",
                    self.reservation,
                )
        return self.backend.submit(LEASE_SCRIPT, args)

    def _pool_note(self, comment: str) -> str:
        return f"{comment},pool={self.reservation}"

    def write_lease(self, slurm_id: int, comment: str) -> None:
        self.backend.set_comment(slurm_id, self._pool_note(comment))

    def drop_lease(self, slurm_id: int) -> None:
        tolerate(self.backend.cancel, slurm_id, ok=("already completed", "invalid job id"))


def as_lease(j: SlurmJob) -> LeaseJob:
    return LeaseJob(j.job_id, j.uid, j.comment, ended=j.state in ENDED_STATES)
