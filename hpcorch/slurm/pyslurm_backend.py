"""Slurm through pyslurm 25.11 (Slurm's C API, no subprocesses), for sites on Slurm 25.11.

pyslurm is built against one Slurm release's headers and library, and its version follows
Slurm's: pyslurm 25.11 needs Slurm 25.11. ``hpcorch.slurm.factory.make_backend`` uses this
backend when such a pyslurm imports.

Two actions still go through Slurm's commands (``SlurmCLI``), because pyslurm 25.11 does
not express them: a job's node count cannot be changed through ``Job.modify`` (pyslurm
applies ``nodes`` at submission only), so ``set_shape`` runs one ``scontrol update`` (also
for a per-job GPU count and a per-node CPU minimum: ``hpcorch.slurm.backend.shape_args``); and
reservations are created with ``scontrol create reservation`` (once, at controller start).

Submission maps each ``#SBATCH`` line of hpcorch's batch script (the user's options
included, hpcorch/slurm/options.py) to a ``JobSubmitDescription`` attribute; an option
with no mapping is one error naming it, never dropped. Unlike sbatch, pyslurm reads no
``SBATCH_*`` variable: hpcorch takes the ones it uses as defaults before rendering.

The pure mappings from pyslurm's objects to hpcorch's types, and from hpcorch's batch
script to a ``JobSubmitDescription``, are in ``hpcorch.slurm.pyslurm_map``.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any, TypeVar

from hpcorch.cluster import LEASE_NAME
from hpcorch.errors import SlurmCommandError, SlurmUnavailable
from hpcorch.slurm.assoc_mgr import AssocMgr, Partition
from hpcorch.slurm.backend import SlurmCLI, expand_nodelist
from hpcorch.slurm.cli_errors import unreachable
from hpcorch.slurm.clock import CallClock
from hpcorch.slurm.parse import SlurmJob, SlurmNode, SlurmReservation
from hpcorch.slurm.pyslurm_map import (
    _names,
    _str,
    gpus_in_use,
    job_from_pyslurm,
    node_from_pyslurm,
    signal_name,
    submit_options,
)
from hpcorch.slurm.version import SlurmBehaviour, SlurmVersion

T = TypeVar("T")

JOBS_REUSE_S = 2.0
"""How long :meth:`PySlurmBackend.nodes` counts GPUs in use from the last ``Jobs.load``."""


class PySlurmBackend:
    """Slurm through pyslurm 25.11 (see the module docstring for what still uses scontrol)."""

    def __init__(self, module: ModuleType | None = None, cli: SlurmCLI | None = None) -> None:
        self.pyslurm: Any = module if module is not None else importlib.import_module("pyslurm")
        self.cli = cli or SlurmCLI()
        self._rpcs = 0
        self.clock = CallClock()
        """How long its RPCs took (its commands: ``cli.clock``)."""
        self._loaded_jobs: list[Any] = []
        self._jobs_loaded_at = -1e18

    def _load_jobs(self) -> list[Any]:
        """Every job slurmctld holds, ended ones included (``Jobs.load`` asks with
        SHOW_ALL, as ``squeue --states=all``), kept for :meth:`nodes`."""
        coll = self._rpc("Jobs.load", lambda: self.pyslurm.Jobs.load())
        self._loaded_jobs = self._values(coll)
        self._jobs_loaded_at = time.monotonic()
        return self._loaded_jobs

    @property
    def calls(self) -> int:
        """RPCs made through pyslurm plus Slurm commands run."""
        return self._rpcs + self.cli.calls

    @property
    def seconds(self) -> float:
        """Seconds spent waiting for pyslurm's RPCs and Slurm's commands."""
        return self.clock.seconds + self.cli.seconds

    def longest_call(self) -> float:
        return max(self.clock.longest_call(), self.cli.longest_call())

    def ping(self) -> None:
        self.cli.ping()  # scontrol ping: one REQUEST_PING, as with the commands

    def _rpc(self, what: str, fn: Callable[[], T]) -> T:
        self._rpcs += 1
        rpc_error = getattr(self.pyslurm, "RPCError", None)
        errors: tuple[type[BaseException], ...] = (ValueError,)
        if isinstance(rpc_error, type) and issubclass(rpc_error, BaseException):
            errors = (rpc_error, ValueError)
        t0 = time.monotonic()
        try:
            return fn()
        except errors as exc:
            lines = str(exc).strip().splitlines()
            msg = lines[0] if lines else type(exc).__name__
            if unreachable(msg):
                raise SlurmUnavailable(f"Slurm is not reachable (pyslurm {what}: {msg})") from exc
            raise SlurmCommandError(f"pyslurm {what} failed: {msg}") from exc
        finally:
            self.clock.took(time.monotonic() - t0)

    @staticmethod
    def _values(collection: Any) -> list[Any]:
        return list(collection.values() if hasattr(collection, "values") else collection)

    # --- queries ------------------------------------------------------------------------
    def version(self) -> SlurmVersion:
        """slurmctld's release, as ``scontrol show config`` gives it (once, at start)."""
        return self.cli.version()

    def use(self, behaviour: SlurmBehaviour) -> None:
        self.cli.use(behaviour)

    def jobs(self, reservation: str | None = None) -> list[SlurmJob]:
        return [
            job_from_pyslurm(j)
            for j in self._load_jobs()
            if reservation is None
            or _str(j.reservation) == reservation
            or _str(j.name) == LEASE_NAME
        ]

    def nodes(self) -> list[SlurmNode]:
        """Nodes, with the GPUs in use counted from the jobs (:func:`gpus_in_use`): those
        :meth:`jobs` loaded if within ``JOBS_REUSE_S`` (a controller cycle reads jobs then
        nodes: two RPCs, as with Slurm's commands), else a fresh ``Jobs.load``."""
        coll = self._rpc("Nodes.load", lambda: self.pyslurm.Nodes.load())
        jobs = self._loaded_jobs
        if time.monotonic() - self._jobs_loaded_at > JOBS_REUSE_S:
            jobs = self._load_jobs()
        used = gpus_in_use(jobs)
        return [node_from_pyslurm(n, used.get(_str(n.name), 0)) for n in self._values(coll)]

    def partitions(self) -> tuple[list[str], str | None]:
        coll = self._rpc("Partitions.load", lambda: self.pyslurm.Partitions.load())
        parts = list(self._values(coll))
        default = next((_str(p.name) for p in parts if getattr(p, "is_default", False)), None)
        return sorted(_str(p.name) for p in parts), default

    def reservations(self) -> dict[str, list[str]]:
        coll = self._rpc("Reservations.load", lambda: self.pyslurm.Reservations.load())
        return {
            _str(r.name): expand_nodelist(_str(r.nodes)) if r.nodes else []
            for r in self._values(coll)
        }

    def reservation_nodes(self, name: str) -> list[str]:
        found = self.reservations()
        if name not in found:
            raise SlurmCommandError(f"pyslurm: reservation '{name}' not found")
        return found[name]

    def reservation(self, name: str) -> SlurmReservation:
        for r in self.reservation_list():
            if r.name == name:
                return r
        raise SlurmCommandError(f"pyslurm: reservation '{name}' not found")

    def reservation_list(self) -> list[SlurmReservation]:
        coll = self._rpc("Reservations.load", lambda: self.pyslurm.Reservations.load())
        return [
            SlurmReservation(
                name=_str(r.name),
                nodes=_str(r.nodes) if r.nodes else "",
                end_time=float(getattr(r, "end_time", 0) or 0),
                flags=tuple(f.upper() for f in _names(getattr(r, "flags", None))),
                users=",".join(_names(getattr(r, "users", None))),
                start_time=float(getattr(r, "start_time", 0) or 0),
            )
            for r in self._values(coll)
        ]

    # --- actions ------------------------------------------------------------------------
    def submit(self, script: str, args: Sequence[str] = ()) -> int:
        options = submit_options(script, args)
        # sbatch's default (--export=ALL) spelled out: pyslurm's own "ALL" merges the C
        # environ, which came out empty under Debian's /usr/bin/python3 (slurmctld: "batch
        # job cannot run without an environment"; the site-scale run's lease job)
        options.setdefault("environment", dict(os.environ))
        desc = self.pyslurm.JobSubmitDescription(**options)
        return int(self._rpc("submit", desc.submit))

    def _job(self, job_id: int) -> Any:
        return self.pyslurm.Job(job_id)

    def cancel(self, job_id: int, signal: str | None = None, batch_only: bool = False) -> None:
        job = self._job(job_id)
        if signal:
            steps = "batch" if batch_only else "children"
            self._rpc("send_signal", lambda: job.send_signal(signal_name(signal), steps=steps))
        else:
            self._rpc("cancel", job.cancel)

    def _modify(self, job_id: int, **changes: Any) -> None:
        desc = self.pyslurm.JobSubmitDescription(**changes)
        job = self._job(job_id)
        self._rpc("modify", lambda: job.modify(desc))

    def set_shape(
        self,
        job_id: int,
        nodes: int,
        gpus_per_node: int,
        node_names: Sequence[str] = (),
        cpus_per_gpu: int = 0,
        per_node: Sequence[int] = (),
        gpu_type: str = "",
        time_limit_min: int = 0,
        start_now: bool = False,
    ) -> None:
        self.cli.set_shape(
            job_id,
            nodes,
            gpus_per_node,
            node_names,
            cpus_per_gpu,
            per_node,
            gpu_type,
            time_limit_min,
            start_now,
        )

    def start_now(self, job_id: int) -> None:
        self._modify(job_id, begin_time=int(time.time()))

    def set_comment(self, job_id: int, comment: str) -> None:
        self._modify(job_id, comment=comment)

    def allow_requeue(self, job_id: int) -> None:
        self._modify(job_id, is_requeueable=True)

    def hold(self, job_id: int) -> None:
        job = self._job(job_id)
        self._rpc("hold", lambda: job.hold())

    def release(self, job_id: int) -> None:
        self._rpc("release", self._job(job_id).release)

    def set_held(self, job_ids: Sequence[int], held: bool) -> None:
        first: SlurmCommandError | None = None
        for job_id in job_ids:  # one RPC each, as scontrol sends them
            try:
                (self.hold if held else self.release)(job_id)
            except SlurmCommandError as exc:
                first = first or exc
        if first is not None:
            raise first

    def requeue_hold(self, job_id: int) -> None:
        job = self._job(job_id)
        self._rpc("requeue", lambda: job.requeue(hold=True))

    def create_reservation(
        self, name: str, nodes: str, users: str, partition: str | None = None
    ) -> None:
        self.cli.create_reservation(name, nodes, users, partition)

    def accounting_jobs(self, job_ids: Sequence[int]) -> list[SlurmJob]:
        return self.cli.accounting_jobs(job_ids)  # sacct's records, as with the CLI

    def fair_shares(self) -> dict[str, float]:
        return self.cli.fair_shares()  # pyslurm 25.11 has no sshare

    def limits(self, users: Sequence[str] = ()) -> tuple[AssocMgr, dict[str, Partition]]:
        """Through ``scontrol show assoc_mgr``: pyslurm 25.11 reads associations and QOS
        from slurmdbd (``pyslurm.db``): its QOS carry no limits, and its associations not
        what slurmctld counts against them now, which the plan needs."""
        return self.cli.limits(users)

    def extend_reservation(self, name: str, end_time: float) -> None:
        self.cli.extend_reservation(name, end_time)
