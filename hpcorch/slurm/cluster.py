"""The Slurm side of the cluster seam: a reservation's nodes and jobs, actions through a
``SlurmBackend`` (Slurm's commands by default, or pyslurm).

With the command-line backend a cycle's observation costs two Slurm calls
(``squeue --json``, ``sinfo --json``), plus one ``scontrol show reservation``
every ``reservation_ttl`` seconds (extended when it nears its end). Jobs are filtered
client-side: Slurm 22.05's ``--json`` ignores filters. Plans go to the controller's spool
and metrics are read from the jobs' directories without following links
(hpcorch/slurm/files.py).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from hpcorch.cluster import (
    ENDED_STATES,
    ForeignJob,
    LeaseJob,
    Observation,
    ObservedJob,
    PoolNode,
    Shape,
    Window,
)
from hpcorch.errors import HpcorchError, SlurmCommandError
from hpcorch.limits import LimitBook, refusal
from hpcorch.planner import LaunchPlan
from hpcorch.protocol import CHECKPOINT_SIGNAL, MAX_CPUS_PER_GPU, METRICS_FILE
from hpcorch.slurm.assoc_mgr import AssocMgr, Partition
from hpcorch.slurm.backend import RESERVATION_DURATION, SlurmBackend, expand_nodelist, tolerate
from hpcorch.slurm.factory import make_backend
from hpcorch.slurm.files import Spool, read_lines
from hpcorch.slurm.lease_jobs import SlurmLeaseJobs, as_lease
from hpcorch.slurm.limits import limit_book, rekey
from hpcorch.slurm.parse import SlurmJob, SlurmNode, SlurmReservation
from hpcorch.slurm.script import parse_comment
from hpcorch.slurm.together import set_held_together

logger = logging.getLogger("hpcorch.controller")

RESERVATION_REASONS = frozenset({"Reservation", "ReqNodeNotAvail", "ResvDeleted"})
"""Why Slurm keeps a launch pending when another reservation holds its nodes."""
RESV_REREAD_S = 10.0
DAY = 86400.0
RESERVATION_S = float(RESERVATION_DURATION.split("-")[0]) * DAY
RENEW_BEFORE_S = 30 * DAY
"""A reservation that ends sooner than this is extended to ``RESERVATION_S`` from now."""
WARN_EVERY_S = 3600.0


class SlurmCluster:
    """The pool held as a Slurm reservation. The reservation is read every
    ``reservation_ttl`` seconds; one that ends within ``RENEW_BEFORE_S`` is extended, and
    one that cannot be extended (the controller may not update it) is a warning in the log
    every hour, with the time left."""

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
        self._cpus_per_gpu: dict[int, int] = {}
        """CPUs per GPU each job of the pool asked for, as last observed."""
        self._residue: dict[str, tuple[int, int]] = {}
        """Per node, GPUs and CPUs in use that no job of the reservation accounted for at
        the last observation."""
        self.pool_ends_at = 0.0
        """When the reservation ends (Unix time; 0: never or unknown)."""
        self._warned_at = -1e18
        self.fair_shares: dict[str, float] = {}
        """User -> Slurm's FairShare factor, read with the reservation (empty: none)."""
        self._resv_pending = False
        """The last observation saw a launch pending for a reservation (RESERVATION_REASONS)."""
        self.windows: tuple[Window, ...] = ()
        """Other reservations on the pool's nodes, read with the pool's own."""
        self._partition = ""
        """A partition every pool node is in (where the lease job is submitted)."""
        self.leases = SlurmLeaseJobs(self.backend, self.reservation, self._lease_partition)
        self._limits_read_at = -1e18
        self._assoc: tuple[AssocMgr, dict[str, Partition]] = (AssocMgr(), {})
        self._book = LimitBook()
        self._refused: dict[int, str] = {}
        """Pool jobs Slurm kept pending for a limit at the last observation, and why."""
        self._limits_warned = ""
        self._holds: list[int] = []
        self._releases: list[int] = []
        """Jobs to hold and to release, sent together by flush()."""

    @property
    def calls(self) -> int:
        return self.backend.calls

    @property
    def call_seconds(self) -> float:
        return self.backend.seconds

    def longest_call(self) -> float:
        return self.backend.longest_call()

    def ping(self) -> None:
        self.backend.ping()

    def now(self) -> float:
        return time.time()

    # --- the reservation ----------------------------------------------------------------
    def reservation_nodes(self, refresh: bool = False) -> tuple[str, ...]:
        if refresh or time.monotonic() - self._pool_read_at > self.reservation_ttl:
            listed = self.backend.reservation_list()
            res = next((r for r in listed if r.name == self.reservation), None)
            if res is None:
                raise SlurmCommandError(f"reservation '{self.reservation}' not found")
            try:
                names = expand_nodelist(res.nodes) if res.nodes else []
            except ValueError as exc:
                raise HpcorchError(f"reservation '{self.reservation}': {exc}") from exc
            if not names:
                raise HpcorchError(f"reservation '{self.reservation}' has no nodes")
            self._pool_nodes = tuple(names)
            self.windows = _windows(listed, self.reservation, set(names))
            self._pool_read_at = time.monotonic()
            self.pool_ends_at = res.end_time
            self._keep_open(time.time())
            try:
                self.fair_shares = self.backend.fair_shares()
            except HpcorchError as exc:  # sshare missing or refused: every user counts the same
                if self.fair_shares:
                    logger.warning("cannot read Slurm's fair shares (%s): equal shares", exc)
                self.fair_shares = {}
        return self._pool_nodes

    def _keep_open(self, now: float) -> None:
        """Extend the reservation when it ends within RENEW_BEFORE_S; warn if it cannot."""
        end = self.pool_ends_at
        if not end or end - now > RENEW_BEFORE_S:
            return
        try:
            self.backend.extend_reservation(self.reservation, now + RESERVATION_S)
            renewed = self.backend.reservation(self.reservation).end_time
        except HpcorchError as exc:
            renewed, why = 0.0, str(exc)
        else:
            why = f"Slurm still reports it ending {_date(renewed)}"
        if renewed - now > RENEW_BEFORE_S:
            self.pool_ends_at = renewed
            logger.info(
                "reservation '%s' would have ended %s: extended to %s",
                self.reservation,
                _date(end),
                _date(renewed),
            )
            return
        if now - self._warned_at >= WARN_EVERY_S:
            self._warned_at = now
            logger.warning(
                "reservation '%s' ends %s (in %.1f days) and could not be extended (%s): "
                "no job can start in the pool after that; extend it with scontrol update "
                "ReservationName=%s EndTime=...",
                self.reservation,
                _date(end),
                max(0.0, end - now) / DAY,
                why,
                self.reservation,
            )

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
        # a launch Slurm keeps pending for a reservation: read the reservations again now
        # (one made since the last read may hold its nodes), at most every RESV_REREAD_S
        reread = self._resv_pending and time.monotonic() - self._pool_read_at > RESV_REREAD_S
        pool = self.reservation_nodes(refresh=reread)
        jobs = self.backend.jobs(self.reservation)
        self._resv_pending = any(
            j.state == "PENDING" and not j.held and j.reason in RESERVATION_REASONS
            for j in jobs
            if j.reservation == self.reservation
        )
        listed = self.backend.nodes()
        by_name = {n.name: n for n in listed}
        self._partition = _common_partition([by_name[p] for p in pool if p in by_name])
        # Slurm's own node order (the order it fills a job's GPUs in: cluster.fill_gpus)
        rank = {n.name: i for i, n in enumerate(listed)}
        pool = tuple(sorted(pool, key=lambda name: rank.get(name, len(rank))))
        observed = []
        foreign: list[ForeignJob] = []
        leases: list[LeaseJob] = []
        held = _Held()
        cpus_per_gpu: dict[int, int] = {}
        tagged: list[SlurmJob] = []
        for j in jobs:
            if self.leases.is_lease(j):
                leases.append(as_lease(j))
                continue
            if j.reservation != self.reservation:
                continue
            try:
                names = tuple(expand_nodelist(j.nodes)) if j.nodes else ()
            except ValueError:  # a node list Slurm should never print: not this job's fault
                names = ()
            names = names if j.state != "PENDING" else ()
            per_node = j.gpus_by_node if names and len(j.gpus_by_node) == len(names) else ()
            per_gpu = j.gpus_per_node
            if per_node:
                per_gpu = max(per_node)
            elif not per_gpu and j.gpus_per_job and names:
                per_gpu = j.gpus_per_job // len(names)
            tags = parse_comment(j.comment)
            holds = names and j.state not in ENDED_STATES
            gpus = per_node or (per_gpu,) * len(names)
            if tags is None:  # in the pool, not placed by the controller
                if j.state not in ENDED_STATES:
                    foreign.append(ForeignJob(j.job_id, j.user, j.name, j.state, names, gpus))
                    if holds:
                        held.add("foreign", names, gpus, j.cpus)
                continue
            if holds:
                held.add("own", names, gpus, j.cpus)
            tagged.append(j)
            cpus = j.cpus_per_gpu or _cpus_tag(tags)
            if cpus:
                cpus_per_gpu[j.job_id] = cpus
            observed.append(
                ObservedJob(
                    slurm_id=j.job_id,
                    name=j.name,
                    user=j.user,
                    state=j.state,
                    held=j.held,
                    reason=j.reason,
                    node_names=names,
                    gpus_per_node=per_gpu,
                    restarts=j.restarts,
                    exit_code=j.exit_code,
                    submit_time=float(j.submit_time),
                    start_time=float(j.start_time),
                    tags=tags,
                    end_time=float(j.end_time),
                    uid=j.uid,
                    per_node=per_node,
                    special_exit=j.special_exit,
                    batch=j.batch,
                    requeue=j.requeue,
                    time_limit_min=j.time_limit_min,
                )
            )
        nodes = []
        residue: dict[str, tuple[int, int]] = {}
        for name in pool:
            n = by_name.get(name)
            if n is None:
                nodes.append(PoolNode(name=name, gpus=0, gpus_used=0, usable=False))
                continue
            own_g, own_c = held.on("own", name)
            for_g, for_c = held.on("foreign", name)
            # GPUs/CPUs in use that no job of the reservation accounts for (a job outside
            # it on these nodes): counted once two observations in a row show them, so a
            # job ending between Slurm's two answers is not taken for one
            now_g = max(0, n.gpus_used - own_g - for_g)
            now_c = max(0, n.cpus_used - own_c - for_c)
            residue[name] = (now_g, now_c)
            was_g, was_c = self._residue.get(name, (0, 0))
            extra_g, extra_c = min(now_g, was_g), min(now_c, was_c)
            if extra_g:
                foreign.append(
                    ForeignJob(0, "?", "(not in the reservation)", "RUNNING", (name,), (extra_g,))
                )
            taken = max(0, min(for_g + extra_g, n.gpus - own_g))
            nodes.append(
                PoolNode(
                    name=name,
                    gpus=n.gpus,
                    gpus_used=n.gpus_used,
                    usable=n.usable,
                    cpus=n.cpus,
                    cpus_used=n.cpus_used,
                    gpus_foreign=taken,
                    gpus_residue=max(0, min(extra_g, taken)),
                    cpus_foreign=max(0, min(for_c + extra_c, n.cpus - own_c)),
                    gpu_type=n.gpu_type,
                    leaving=n.leaving,
                )
            )
        self._residue = residue
        self._cpus_per_gpu = cpus_per_gpu
        self._sweep_spool(j.job_id for j in jobs)
        now = time.time()
        return Observation(
            time=now,
            nodes=tuple(nodes),
            jobs=tuple(observed),
            pool_ends_at=self.pool_ends_at,
            fair_shares=dict(self.fair_shares),
            foreign=tuple(foreign),
            leases=tuple(leases),
            windows=tuple(w for w in self.windows if w.end > now or not w.end),
            limits=self._limits(tagged),
        )

    def _limits(self, pool: Sequence[SlurmJob]) -> LimitBook:
        """The limits of the pool's jobs: read with their usage every ``reservation_ttl``
        seconds, and at once when a job joins the pool (slurmctld keeps a QOS's limit on a
        user only once the user has a job in it) or Slurm keeps one of them pending for a
        limit it did not at the last observation (2 Slurm calls); between two reads, the
        last read's caps for the jobs there are now."""
        refused = {
            j.job_id: j.reason
            for j in pool
            if j.state == "PENDING" and not j.held and refusal(j.reason) is not None
        }
        fresh = any(self._refused.get(k) != v for k, v in refused.items())
        fresh |= any(j.job_id not in self._book.jobs and j.state not in ENDED_STATES for j in pool)
        self._refused = refused
        if not fresh and time.monotonic() - self._limits_read_at <= self.reservation_ttl:
            self._book = rekey(self._book, *self._assoc, pool)
            return self._book
        self._limits_read_at = time.monotonic()
        try:
            self._assoc = self.backend.limits(sorted({j.user for j in pool if j.user}))
        except HpcorchError as exc:
            if self._limits_warned != str(exc):
                self._limits_warned = str(exc)
                logger.warning("cannot read Slurm's limits (%s): planning with the last read", exc)
            self._book = rekey(self._book, *self._assoc, pool)
            return self._book
        self._limits_warned = ""
        self._book = limit_book(*self._assoc, pool, time.time())
        return self._book

    def _sweep_spool(self, known: Iterable[int]) -> None:
        """Remove the plans of jobs Slurm no longer lists (every ``reservation_ttl``)."""
        if self.spool is None or time.monotonic() - self._spool_swept_at < self.reservation_ttl:
            return
        self._spool_swept_at = time.monotonic()
        self.spool.discard_except(set(known))

    # --- the pool's lease (hpcorch/controller/lease.py) ---------------------------------
    def lease_jobs(self) -> list[LeaseJob]:
        return self.leases.lease_jobs()

    def create_lease(self, comment: str) -> int:
        return self.leases.create_lease(comment)

    def write_lease(self, slurm_id: int, comment: str) -> None:
        self.leases.write_lease(slurm_id, comment)

    def drop_lease(self, slurm_id: int) -> None:
        self.leases.drop_lease(slurm_id)

    def _lease_partition(self) -> str:
        if not self._partition:
            pool = set(self.reservation_nodes())
            self._partition = _common_partition([n for n in self.backend.nodes() if n.name in pool])
        return self._partition

    # --- actions ------------------------------------------------------------------------
    def start(self, slurm_id: int, shape: Shape) -> None:
        cpus = shape.cpus_per_gpu or self._cpus_per_gpu.get(slurm_id, 0)
        self.backend.set_shape(
            slurm_id,
            shape.nodes,
            shape.gpus_per_node,
            shape.node_names,
            cpus,
            shape.per_node if not shape.even else (),
            shape.gpu_type,
            shape.time_limit_min,
            start_now=True,
        )
        self._releases.append(slurm_id)  # released by flush(), with the cycle's others

    def hold(self, slurm_id: int) -> None:
        """Hold a pending job (by flush()): an admin hold, when the controller is a Slurm
        operator. Its plan is withdrawn now: released by anyone else, it runs nothing."""
        self._withdraw(slurm_id)
        self._holds.append(slurm_id)

    def flush(self, send: bool = True) -> dict[int, str]:
        """The cycle's holds, then its releases, each in one request: the jobs Slurm refused,
        with its error."""
        holds, releases = self._holds, self._releases
        self._holds, self._releases = [], []
        if not send:
            return {}
        failed = set_held_together(self.backend, holds, True, ok=("already",))
        # a job the list released may be running by the time it is released on its own
        ok = ("already", "not held", "no longer pending")
        return failed | set_held_together(self.backend, releases, False, ok=ok)

    def signal_checkpoint(self, slurm_id: int) -> None:
        self.backend.cancel(slurm_id, signal=self.signal, batch_only=True)

    def requeue_hold(self, slurm_id: int) -> None:
        """Requeue held (Slurm makes it a user hold; the loop turns it into the controller's
        own next cycle), the plan of the launch that ends withdrawn first."""
        self._withdraw(slurm_id)
        tolerate(self.backend.requeue_hold, slurm_id, ok=("already pending",))

    def _withdraw(self, slurm_id: int) -> None:
        if self.spool is not None:
            try:
                self.spool.withdraw(slurm_id)
            except OSError as exc:  # the hold matters more than the file: go on
                logger.warning("job %d: cannot withdraw its plan: %s", slurm_id, exc)

    def cancel(self, slurm_id: int) -> None:
        self.backend.cancel(slurm_id)

    def allow_requeue(self, slurm_id: int) -> None:
        self.backend.allow_requeue(slurm_id)

    def locate(self, slurm_ids: Sequence[int]) -> dict[int, str]:
        """Where Slurm lists these jobs now, outside the pool: id -> reservation ('' none).
        One call, made only when jobs the controller follows leave its observation."""
        wanted = set(slurm_ids)
        return {
            j.job_id: j.reservation
            for j in self.backend.jobs()
            if j.job_id in wanted and j.reservation != self.reservation
        }

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


class _Held:
    """GPUs and CPUs jobs hold on each node, by kind ("own", "foreign")."""

    def __init__(self) -> None:
        self._by: dict[tuple[str, str], list[int]] = {}

    def add(self, kind: str, names: Sequence[str], gpus: Sequence[int], cpus: int) -> None:
        per_cpu = -(-cpus // len(names)) if names else 0
        for name, g in zip(names, gpus, strict=False):
            have = self._by.setdefault((kind, name), [0, 0])
            have[0] += g
            have[1] += per_cpu

    def on(self, kind: str, name: str) -> tuple[int, int]:
        g, c = self._by.get((kind, name), (0, 0))
        return g, c


def _windows(listed: Sequence[SlurmReservation], pool: str, nodes: set[str]) -> tuple[Window, ...]:
    """The other reservations that hold some of the pool's ``nodes``, as windows."""
    out = []
    for r in listed:
        if r.name == pool or not r.nodes:
            continue
        try:
            mine = tuple(n for n in expand_nodelist(r.nodes) if n in nodes)
        except ValueError:
            continue
        if mine:
            out.append(Window(r.name, mine, r.start_time, r.end_time, r.flags))
    return tuple(out)


def _common_partition(nodes: Sequence[SlurmNode]) -> str:
    """The first partition (in the first node's order) that every one of ``nodes`` is in."""
    if not nodes:
        return ""
    rest = [set(n.partitions) for n in nodes[1:]]
    return next((p for p in nodes[0].partitions if all(p in r for r in rest)), "")


def _cpus_tag(tags: dict[str, str]) -> int:
    """The CPUs per GPU a job's comment keeps (``cpus=``), 0 when absent or out of bounds."""
    raw = tags.get("cpus", "")
    if not (raw.isascii() and raw.isdigit() and len(raw) <= 4):
        return 0
    return int(raw) if 1 <= int(raw) <= MAX_CPUS_PER_GPU else 0


def _date(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t))
