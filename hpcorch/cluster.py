"""The cluster seam: what the controller observes and the actions it takes.

Two sides implement :class:`Cluster`: the Slurm side (hpcorch/slurm/cluster.py), which
runs the actions through Slurm's commands, and the simulated side, which runs them on a
simulated clock. The controller is written against this protocol only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from hpcorch.limits import LimitBook
from hpcorch.planner import LaunchPlan

ENDED_STATES = frozenset(
    {
        "COMPLETED",
        "FAILED",
        "CANCELLED",
        "TIMEOUT",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "BOOT_FAIL",
        "DEADLINE",
        "PREEMPTED",
    }
)


@dataclass(frozen=True)
class PoolNode:
    name: str
    gpus: int
    gpus_used: int
    usable: bool
    cpus: int = 0
    """CPUs of the node (0: unknown; CPUs are then not planned)."""
    cpus_used: int = 0
    """CPUs allocated to jobs on the node."""
    gpus_foreign: int = 0
    """GPUs held by jobs the controller did not place (never planned as free)."""
    gpus_residue: int = 0
    """Of ``gpus_foreign``, those in use that no job Slurm lists accounts for: as a rule a
    passing difference between Slurm's two reads (a job of the pool started or ended
    between them, a node completing a job), else a job outside the reservation."""
    cpus_foreign: int = 0
    """CPUs held by jobs the controller did not place."""
    gpu_type: str = ""
    """The node's GPU type as Slurm names it (``Gres=gpu:a100:4``), "" when untyped."""
    leaving: str = ""
    """Why the node is to be emptied though it still runs its jobs (an admin drains it, a
    reboot is pending): its jobs move off it at their next safe point and nothing new is
    planned on it ('': it is not). Such a node is not ``usable``."""


@dataclass(frozen=True)
class ObservedJob:
    """One of the pool's jobs as the cluster reports it."""

    slurm_id: int
    name: str
    user: str
    state: str
    held: bool
    reason: str
    node_names: tuple[str, ...]
    gpus_per_node: int
    restarts: int
    exit_code: int
    submit_time: float
    start_time: float
    tags: Mapping[str, str] = field(default_factory=dict)
    """The fields of the job's hpcorch comment (id, min, max, batch, dir, pin, ...)."""
    end_time: float = 0.0
    uid: int = -1
    """The owner's Unix user id (-1: unknown): files the controller reads for the job must
    be the owner's."""
    per_node: tuple[int, ...] = ()
    """GPUs on each of ``node_names`` (same order) when the cluster reports them, e.g. an
    uneven placement; empty: ``gpus_per_node`` on every node."""
    special_exit: bool = False
    """Requeued held by the job itself after a checkpoint on request (Slurm's SPECIAL_EXIT
    state; the job wrapper's ``requeuehold State=SpecialExit``): a relaunch to make."""
    batch: bool = True
    """A batch job; False for an interactive allocation (salloc, srun), which Slurm can
    neither signal through a batch script nor requeue: it cannot keep the pool's contract."""
    requeue: bool = True
    """Slurm may requeue it (False: ``--no-requeue``, or ``Requeue=0`` set by an update)."""
    time_limit_min: int = 0
    """Its time limit in minutes (0: none, or not known)."""

    @property
    def gpus(self) -> int:
        if self.per_node:
            return sum(self.per_node)
        return len(self.node_names) * self.gpus_per_node

    @property
    def ended(self) -> bool:
        return self.state in ENDED_STATES


@dataclass(frozen=True)
class ForeignJob:
    """A job on the pool's nodes that the controller did not place: one in the reservation
    without hpcorch's tag (plain sbatch), or GPUs in use that no listed job accounts for
    (``slurm_id`` 0: a job outside the reservation, e.g. one that ran before it)."""

    slurm_id: int
    user: str
    name: str
    state: str
    node_names: tuple[str, ...]
    gpus: tuple[int, ...]
    """GPUs on each of ``node_names``."""

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.slurm_id,
            "user": self.user,
            "name": self.name,
            "state": self.state,
            "nodes": list(self.node_names),
            "gpus": list(self.gpus),
        }


@dataclass(frozen=True)
class Window:
    """Another reservation on some of the pool's nodes (a maintenance window, an admin's
    reservation): from ``start`` to ``end`` (Unix times) they are not the pool's."""

    name: str
    nodes: tuple[str, ...]
    start: float
    end: float
    flags: tuple[str, ...] = ()

    @property
    def maintenance(self) -> bool:
        return "MAINT" in self.flags


LEASE_TAG = "hpcorch-lease:"
"""The comment prefix of the placeholder job that holds the pool's lease (one controller
acts on a pool: hpcorch/controller/lease.py)."""
LEASE_NAME = "hpcorch-lease"
"""The lease job's name: it is in the pool's reservation, or (where the reservation does
not admit the controller's account) outside it, its comment naming the pool (``pool=``)."""


def lease_pool(comment: str) -> str:
    """The pool a lease comment names (``pool=NAME``), "" if none."""
    if not comment.startswith(LEASE_TAG):
        return ""
    for item in comment[len(LEASE_TAG) :].split(","):
        key, _, value = item.partition("=")
        if key == "pool":
            return value
    return ""


@dataclass(frozen=True)
class LeaseJob:
    """A lease placeholder job as the scheduler lists it."""

    slurm_id: int
    uid: int
    comment: str
    ended: bool = False


@dataclass(frozen=True)
class Observation:
    time: float
    nodes: tuple[PoolNode, ...]
    jobs: tuple[ObservedJob, ...]
    pool_ends_at: float = 0.0
    """When the pool (the Slurm reservation) ends, Unix time; 0: never, or unknown."""
    fair_shares: Mapping[str, float] = field(default_factory=dict)
    """User -> the scheduler's fair-share factor (0..1; Slurm's FairShare with
    accounting). Empty: every user counts the same."""
    foreign: tuple[ForeignJob, ...] = ()
    """Jobs on the pool's nodes the controller did not place (their GPUs are in
    ``PoolNode.gpus_foreign``)."""
    leases: tuple[LeaseJob, ...] = ()
    """The pool's lease jobs (which controller may act on it)."""
    windows: tuple[Window, ...] = ()
    """Other reservations on the pool's nodes that have not ended (maintenance windows)."""
    limits: LimitBook = field(default_factory=LimitBook)
    """The scheduler's limits on the pool's jobs (:mod:`hpcorch.limits`); empty: none."""


@dataclass(frozen=True)
class Shape:
    """Where a launch runs: ``nodes`` x ``gpus_per_node``, on ``node_names`` if given.

    ``per_node``, when set, is an exact (possibly uneven) placement: the GPUs on each of
    ``node_names``, in the same order, which is also the rank order (ranks fill the first
    node, then the next). ``gpus_per_node`` is then the largest of them.
    """

    nodes: int
    gpus_per_node: int
    node_names: tuple[str, ...] = ()
    cpus_per_gpu: int = 0
    """CPUs with each GPU (0: as submitted)."""
    per_node: tuple[int, ...] = ()
    gpu_type: str = ""
    """The GPU type the launch requests (``--gres=gpu:<type>:N``; "": any)."""
    time_limit_min: int = 0
    """The launch's time limit in minutes (-1: none; 0: as the job has it): cut to end
    before a window on its nodes starts (hpcorch/controller/availability.py), and within
    the scheduler's limits (``MaxWall``, a partition's ``MaxTime``) where the job's own is
    longer."""

    @property
    def gpus(self) -> int:
        if self.per_node:
            return sum(self.per_node)
        return self.nodes * self.gpus_per_node

    @property
    def even(self) -> bool:
        return not self.per_node or len(set(self.per_node)) == 1


def fill_gpus(total: int, free: Sequence[int]) -> tuple[int, ...] | None:
    """How a scheduler that gets a job's GPU count (not a count per node) on a fixed set
    of nodes spreads it, as Slurm 22.05+'s cons_tres does (``--gpus`` / ``TresPerJob``
    with ``ReqNodeList`` and ``NumNodes``, checked on the local pool): one GPU on every
    node, then the rest node by node in the cluster's node order, each node up to its free
    GPUs. ``free``: free GPUs of the job's nodes, in the cluster's node order. None when
    they do not fit (a node without a free GPU, or too few free in all)."""
    if total < len(free) or any(f < 1 for f in free) or total > sum(free):
        return None
    out = [1] * len(free)
    left = total - len(free)
    for i, f in enumerate(free):
        take = min(f - 1, left)
        out[i] += take
        left -= take
    return tuple(out)


class Cluster(Protocol):
    """The controller's only way to see and change the world."""

    @property
    def calls(self) -> int:
        """Commands sent to the scheduler so far (Slurm calls on the Slurm side)."""

    @property
    def call_seconds(self) -> float:
        """Seconds spent waiting for the scheduler's answers so far."""

    def longest_call(self) -> float:
        """Seconds of the longest single call since this was last asked (0: none)."""

    def ping(self) -> None:
        """Ask the scheduler whether it answers (one cheap request); raises
        ``SlurmUnavailable`` when it does not."""

    def now(self) -> float: ...
    def observe(self) -> Observation: ...
    def start(self, slurm_id: int, shape: Shape) -> None:
        """Give a held (or pending) job its shape and let it run (its release may wait for
        ``flush``)."""

    def hold(self, slurm_id: int) -> None:
        """Hold a pending job (the hold may wait for ``flush``)."""

    def flush(self, send: bool = True) -> dict[int, str]:
        """Send what ``start`` and ``hold`` left to send together, once the cycle's actions
        are done (``send`` False: drop it, the scheduler does not answer): the jobs the
        scheduler refused, with its error."""

    def signal_checkpoint(self, slurm_id: int) -> None: ...
    def requeue_hold(self, slurm_id: int) -> None:
        """Put a job that ended (or is running: it is killed) back in the queue, held."""

    def cancel(self, slurm_id: int) -> None: ...
    def allow_requeue(self, slurm_id: int) -> None:
        """Let Slurm requeue a pool job again (its owner or an admin set ``Requeue=0``)."""

    def locate(self, slurm_ids: Sequence[int]) -> dict[int, str]:
        """Jobs among ``slurm_ids`` that the scheduler still lists outside the pool: id ->
        the reservation they are in now ('' none). Those it no longer lists are absent."""

    def write_plan(self, slurm_id: int, plan: LaunchPlan, uid: int) -> None:
        """Hand a job the plan of its next launch, readable by its owner (``uid``). The
        Slurm side writes it to the controller's spool, never to a path a user chose."""

    def read_metrics(
        self, job_dir: str, offset: int, uid: int
    ) -> tuple[Sequence[dict[str, Any]], int]:
        """New metric lines of a job since ``offset``, and the offset to continue from.
        The Slurm side reads only a regular file owned by ``uid``, following no links."""
