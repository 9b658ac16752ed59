"""The controller's hold on Slurm's limits, between its cycles: the limits the cluster last
reported, the caps refused launches taught (kept in the store), and what the loop asks of
them. The decisions are pure functions (hpcorch/controller/limits.py, learned.py); this
keeps their state and writes it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from hpcorch.cluster import Observation, ObservedJob, Shape
from hpcorch.controller import learned as lrn
from hpcorch.controller.limits import blocked, group_members, limit_wait, policy_limits
from hpcorch.controller.reconcile import REQUEUED, Action, target_shape
from hpcorch.controller.store import JobRecord, Store
from hpcorch.limits import LimitBook, refusal
from hpcorch.policy.types import Snapshot


class LimitKeeper:
    def __init__(self, store: Store, log: Callable[[str], None]) -> None:
        self.store = store
        self.log = log
        self.book = LimitBook()
        self.learned: list[lrn.Learned] = lrn.loads(store.get_meta(lrn.META_KEY))
        self._saved = lrn.dumps(self.learned)
        self._cpus_per_gpu = 0
        self._groups: tuple[Sequence[JobRecord], list[JobRecord], dict[str, list[JobRecord]]]
        self._groups = ((), [], {})
        """The records ``explain`` last saw, their active ones and those in each group."""

    def observe(
        self,
        obs: Observation,
        records: Sequence[JobRecord],
        pool_nodes: tuple[str, ...],
    ) -> None:
        """Take the cluster's limits; learn from every launch Slurm keeps pending for a
        limit (the state machine holds it this cycle); unlearn what no longer holds."""
        self._groups = ((), [], {})
        self.book = obs.limits
        usable = [n for n in obs.nodes if n.usable and n.gpus > 0 and n.cpus > 0]
        self._cpus_per_gpu = min((n.cpus // n.gpus for n in usable), default=0)
        seen = {j.slurm_id: j for j in obs.jobs}
        for rec in records:
            job = seen.get(rec.slurm_id)
            if job is not None and self._refused(rec, job):
                why = refusal(job.reason)
                assert why is not None
                shape = target_shape(rec, pool_nodes)
                cap = lrn.learn(rec, shape, why, records, self.book, obs.time)
                same = (cap.key, cap.dim, cap.slurm_id, cap.reason)
                self.learned = [
                    c for c in self.learned if (c.key, c.dim, c.slurm_id, c.reason) != same
                ]
                self.learned.append(cap)
                self.log(f"job {rec.slurm_id}: {cap.text()}")
        kept = [c for c in self.learned if lrn.keep(c, records, self.book, obs.time)]
        for c in self.learned:
            if c not in kept:
                self.log(f"unlearned ({c.key}, {c.dim} <= {c.value}): {c.reason}")
        self.learned = kept

    @staticmethod
    def _refused(rec: JobRecord, job: ObservedJob) -> bool:
        """A launch the controller released that Slurm keeps pending for a limit."""
        return (
            rec.phase == "starting"
            and job.state == "PENDING"
            and not job.held
            and not job.special_exit
            and not rec.reason.startswith(REQUEUED)
            and rec.target_gpus > 0
            and refusal(job.reason) is not None
        )

    def constrain(self, snapshot: Snapshot, records: Sequence[JobRecord]) -> Snapshot:
        """``snapshot`` with the limits of its jobs."""
        limits = policy_limits(records, self.book, self.learned, self._cpus_per_gpu)
        return replace(snapshot, limits=limits) if limits else snapshot

    def wait(self, rec: JobRecord, shape: Shape, records: Sequence[JobRecord]) -> str:
        """Why a start must wait for a group limit ('' = go now)."""
        return limit_wait(rec, shape, records, self.book, self.learned)

    def timed(self, action: Action) -> Action:
        """A start with a time limit within the job's limits (``MaxWall``, a partition's
        ``MaxTime``): the tighter of the one its launch gets (a window cut, -1: none) and
        theirs, or theirs where its own time limit is longer."""
        if action.kind != "start" or action.shape is None:
            return action
        wall = self.book.wall_min(action.slurm_id)
        if wall is None:
            return action
        asked = action.shape.time_limit_min
        if asked > 0:
            minutes = min(asked, wall)
        elif asked < 0:
            minutes = wall
        else:
            minutes = self.book.time_limits.get(action.slurm_id, 0)
        if minutes == asked:
            return action
        return replace(action, shape=replace(action.shape, time_limit_min=minutes))

    def explain(self, rec: JobRecord, records: Sequence[JobRecord]) -> bool:
        """A queued job the plan left out: its reason is the limit that holds it back, if
        one does (True)."""
        if rec.phase != "queued" or rec.retry_at:
            return False
        if self._groups[0] is not records:  # once a cycle: its queued jobs ask in turn
            active = [r for r in records if r.active]
            self._groups = (records, active, group_members(active, self.book))
        _, active, groups = self._groups
        why = blocked(rec, active, self.book, self.learned, groups)
        if why:
            rec.reason = why
        return bool(why)

    def save(self) -> None:
        """The learned caps into the store (in the caller's transaction), if they changed."""
        text = lrn.dumps(self.learned)
        if text != self._saved:
            self.store.set_meta(lrn.META_KEY, text)
            self._saved = text
