"""The Slurm side of the cluster seam: a reservation's nodes and jobs, actions through a
``SlurmBackend`` (Slurm's commands by default, or pyslurm).

With the command-line backend a cycle's observation costs two Slurm calls
(``squeue --json``, ``sinfo --json``), plus ``scontrol show reservation`` and
``scontrol show hostnames`` every ``reservation_ttl`` seconds. Jobs are filtered
client-side: Slurm 22.05's ``--json`` ignores filters. Plans go to the controller's spool
and metrics are read from the jobs' directories without following links
(hpcorch/slurm/files.py).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from hpcorch.cluster import Observation, ObservedJob, PoolNode, Shape
from hpcorch.errors import HpcorchError, SlurmCommandError
from hpcorch.planner import LaunchPlan
from hpcorch.protocol import CHECKPOINT_SIGNAL, METRICS_FILE
from hpcorch.slurm.backend import SlurmBackend, expand_nodelist
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.files import Spool, read_lines
from hpcorch.slurm.script import parse_comment


class SlurmCluster:
    """The pool held as a Slurm reservation."""

    def __init__(
        self,
        reservation: str,
        backend: SlurmBackend | None = None,
        reservation_ttl: float = 60.0,
        signal: str = CHECKPOINT_SIGNAL,
        spool: Path | None = None,
    ) -> None:
        self.reservation = reservation
        self.backend = backend or make_backend()
        self.signal = signal
        self.reservation_ttl = reservation_ttl
        self.spool = Spool(spool) if spool is not None else None
        self._pool_nodes: tuple[str, ...] = ()
        self._pool_read_at = -1e18
        self._spool_swept_at = -1e18

    @property
    def calls(self) -> int:
        return self.backend.calls

    def now(self) -> float:
        return time.time()

    # --- the reservation ----------------------------------------------------------------
    def reservation_nodes(self, refresh: bool = False) -> tuple[str, ...]:
        if refresh or time.monotonic() - self._pool_read_at > self.reservation_ttl:
            names = self.backend.reservation_nodes(self.reservation)
            if not names:
                raise HpcorchError(f"reservation '{self.reservation}' has no nodes")
            self._pool_nodes = tuple(names)
            self._pool_read_at = time.monotonic()
        return self._pool_nodes

    def ensure_reservation(self, nodes: str, users: str, partition: str | None) -> str:
        """Adopt the reservation if it exists, else create it. Returns what was done."""
        try:
            self.reservation_nodes(refresh=True)
            return "adopted"
        except SlurmCommandError as exc:
            if "not found" not in str(exc).lower() and "invalid" not in str(exc).lower():
                raise
        self.backend.create_reservation(self.reservation, nodes, users, partition)
        self.reservation_nodes(refresh=True)
        return "created"

    # --- observation --------------------------------------------------------------------
    def observe(self) -> Observation:
        pool = self.reservation_nodes()
        jobs = self.backend.jobs()
        by_name = {n.name: n for n in self.backend.nodes()}
        nodes = tuple(
            PoolNode(
                name=name,
                gpus=by_name[name].gpus if name in by_name else 0,
                gpus_used=by_name[name].gpus_used if name in by_name else 0,
                usable=by_name[name].usable if name in by_name else False,
                cpus=by_name[name].cpus if name in by_name else 0,
            )
            for name in pool
        )
        observed = []
        for j in jobs:
            tags = parse_comment(j.comment)
            if tags is None or j.reservation != self.reservation:
                continue
            names = tuple(expand_nodelist(j.nodes)) if j.nodes else ()
            observed.append(
                ObservedJob(
                    slurm_id=j.job_id,
                    name=j.name,
                    user=j.user,
                    state=j.state,
                    held=j.held,
                    reason=j.reason,
                    node_names=names if j.state != "PENDING" else (),
                    gpus_per_node=j.gpus_per_node,
                    restarts=j.restarts,
                    exit_code=j.exit_code,
                    submit_time=float(j.submit_time),
                    start_time=float(j.start_time),
                    tags=tags,
                    end_time=float(j.end_time),
                    uid=j.uid,
                )
            )
        self._sweep_spool(j.job_id for j in jobs)
        return Observation(time=time.time(), nodes=nodes, jobs=tuple(observed))

    def _sweep_spool(self, known: Iterable[int]) -> None:
        """Remove the plans of jobs Slurm no longer lists (every ``reservation_ttl``)."""
        if self.spool is None or time.monotonic() - self._spool_swept_at < self.reservation_ttl:
            return
        self._spool_swept_at = time.monotonic()
        self.spool.discard_except(set(known))

    # --- actions ------------------------------------------------------------------------
    def start(self, slurm_id: int, shape: Shape) -> None:
        self.backend.set_shape(
            slurm_id, shape.nodes, shape.gpus_per_node, shape.node_names, shape.cpus_per_gpu
        )
        self.backend.start_now(slurm_id)
        self._tolerate(self.backend.release, slurm_id, ok=("already", "not held"))

    def hold(self, slurm_id: int) -> None:
        self._tolerate(self.backend.hold, slurm_id, ok=("already",))

    def signal_checkpoint(self, slurm_id: int) -> None:
        self.backend.cancel(slurm_id, signal=self.signal, batch_only=True)

    def requeue_hold(self, slurm_id: int) -> None:
        self._tolerate(self.backend.requeue_hold, slurm_id, ok=("already pending",))

    def cancel(self, slurm_id: int) -> None:
        self.backend.cancel(slurm_id)

    @staticmethod
    def _tolerate(action: Callable[[int], None], slurm_id: int, ok: Sequence[str]) -> None:
        try:
            action(slurm_id)
        except SlurmCommandError as exc:
            if not any(s in str(exc).lower() for s in ok):
                raise

    # --- files: plans in the spool, metrics in the job's directory --------------------
    def write_plan(self, slurm_id: int, plan: LaunchPlan, uid: int) -> None:
        if self.spool is None:
            raise HpcorchError("this controller has no spool to write plans to")
        try:
            self.spool.write_plan(slurm_id, plan, uid)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot write the plan to {self.spool.path(slurm_id)}: {exc.strerror}"
            ) from exc

    def read_metrics(self, job_dir: str, offset: int, uid: int) -> tuple[list[dict[str, Any]], int]:
        return read_lines(f"{job_dir.rstrip('/')}/{METRICS_FILE}", offset, uid)
