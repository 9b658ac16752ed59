"""Carrying out one action of the controller's through the cluster seam, and what a failed
start does to the job (back to the queue, GPUs released, retried after a back-off)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from hpcorch.cluster import Cluster, Shape
from hpcorch.controller.actions import Action
from hpcorch.controller.config import LoopConfig
from hpcorch.controller.logs import describe
from hpcorch.controller.store import JobRecord, Sample
from hpcorch.controller.validate import printable
from hpcorch.errors import SlurmUnavailable
from hpcorch.planner import BatchPlanError, LaunchPlan, plan_batch

MEASURED_REBATCHES = 2
"""Batch changes of one launch whose first report brings the next round forward (after its
start's): a new job's probe and the batch its measurements call for."""
MAX_AWAITED = 4096
"""First reports awaited at most (the oldest forgotten first)."""


class Executor:
    def __init__(self, cluster: Cluster, config: LoopConfig, warn: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.config = config
        self.warn = warn
        self.plan_batch: dict[int, int] = {}
        """The global batch of the plan each running launch has (this controller's writes)."""
        self.awaited: dict[int, int] = {}
        """The global batch each job's first report after this controller's last launch or
        rebatch of it is expected at (the split its runtime derives): a new measurement."""
        self._rebatched: dict[int, int] = {}
        """Batch changes of each job's launch that await a report."""
        self._lock = threading.Lock()

    def launch_plan(
        self, rec: JobRecord, gpus: int, launch: int, batch: int, shape: Shape | None = None
    ) -> LaunchPlan:
        return LaunchPlan(
            global_batch=batch,
            gpus=gpus,
            max_micro_batch=max(1, rec.max_micro),
            job=rec.job_key,
            launch=launch,
            placement=tuple(zip(shape.node_names, shape.per_node, strict=False)) if shape else (),
            trained_step=rec.trained_step,
        )

    def await_report(self, rec: JobRecord, gpus: int, batch: int, start: bool) -> None:
        """Expect ``rec``'s next report at the split its runtime makes of ``batch``: after
        a ``start``, and after the first :data:`MEASURED_REBATCHES` batch changes of the
        launch that ask for a batch other than the one it reports."""
        try:
            split = plan_batch(max(batch, gpus), gpus, max(1, rec.max_micro)).global_batch
        except BatchPlanError:
            split = 0
        sid = rec.slurm_id
        with self._lock:  # actions of different jobs are carried out at once
            self.awaited.pop(sid, None)
            done = 0 if start else self._rebatched.get(sid, 0)
            if not start and (done >= MEASURED_REBATCHES or split == rec.global_batch):
                return
            self._rebatched[sid] = done + (not start)
            if split:
                self.awaited[sid] = split
            for d in (self.awaited, self._rebatched):  # jobs that ended before they reported
                while len(d) > MAX_AWAITED:
                    del d[next(iter(d))]

    def first_report(self, sample: Sample) -> bool:
        """Whether ``sample`` is its job's first report at the batch this controller last
        gave it (:meth:`await_report`: a few per launch, whatever the job reports)."""
        if self.awaited.get(sample.slurm_id) != sample.global_batch:
            return False
        del self.awaited[sample.slurm_id]
        return True

    def execute(self, rec: JobRecord, a: Action) -> str:
        """Carry out ``a``; the decision's status ('done' or the error). Slurm not
        answering (``SlurmUnavailable``) is raised: whether the action was done is not
        known (slurmctld may carry out a request it never answered), so it is no failure
        of the job's; the loop stops acting and reads the outcome from Slurm's next
        answer."""
        try:
            if a.kind == "start":
                assert a.shape is not None
                batch = max(rec.target_batch or rec.batch, a.shape.gpus)
                plan = self.launch_plan(rec, a.shape.gpus, rec.launches, batch, a.shape)
                self.cluster.write_plan(rec.slurm_id, plan, rec.uid)
                self.cluster.start(rec.slurm_id, a.shape)
                self.plan_batch[rec.slurm_id] = batch
                self.await_report(rec, a.shape.gpus, batch, start=True)
            elif a.kind == "rebatch":
                # the running launch's own plan, rewritten: the job takes the new batch at its
                # next step, no restart, no Slurm call (only jobs that can take it get this)
                plan = self.launch_plan(
                    rec, rec.gpus, max(0, rec.launches - 1), max(rec.target_batch, 1)
                )
                self.cluster.write_plan(rec.slurm_id, plan, rec.uid)
                self.plan_batch[rec.slurm_id] = plan.global_batch
                self.await_report(rec, rec.gpus, plan.global_batch, start=False)
            elif a.kind == "signal":
                self.cluster.signal_checkpoint(rec.slurm_id)
            elif a.kind == "hold":
                self.cluster.hold(rec.slurm_id)
            elif a.kind == "requeue_hold":
                self.cluster.requeue_hold(rec.slurm_id)
            elif a.kind == "cancel":
                self.cluster.cancel(rec.slurm_id)
            elif a.kind == "allow_requeue":
                self.cluster.allow_requeue(rec.slurm_id)
            return "done"
        except SlurmUnavailable:
            raise
        except Exception as exc:
            msg = describe(exc)
            if a.kind == "start":
                self.start_failed(rec, msg)
            else:
                self.warn(f"job {rec.slurm_id}: {a.kind} failed: {msg}")
            return f"error: {msg}"

    def refused(self, rec: JobRecord, a: Action, why: str) -> str:
        """Slurm refused the part of ``a`` sent with the cycle's others (a start's release,
        a hold): as if ``execute`` had failed; the decision's status."""
        if a.kind == "start":
            self.plan_batch.pop(rec.slurm_id, None)
            self.awaited.pop(rec.slurm_id, None)
            self.start_failed(rec, why)
        else:
            self.warn(f"job {rec.slurm_id}: {a.kind} failed: {why}")
        return f"error: {why}"

    def start_failed(self, rec: JobRecord, why: str) -> None:
        """Back to the queue with its GPUs released, retried after an exponential back-off;
        failed after ``max_start_failures`` starts in a row."""
        s = self.config.settings
        now = self.cluster.now()
        rec.start_failures += 1
        n = rec.start_failures
        rec.phase_since = now
        if n >= s.max_start_failures:
            rec.phase, rec.finished_at, rec.retry_at = "failed", now, 0.0
            rec.reason = printable(f"start failed {n} times, gave up: {why}", 400)
        else:
            delay = min(s.start_backoff_max_s, s.start_backoff_s * 2 ** (n - 1))
            rec.phase, rec.retry_at = "queued", now + delay
            rec.reason = printable(
                f"start failed ({why}): GPUs released, retry {n}/{s.max_start_failures - 1} "
                f"in {delay:.0f} s",
                400,
            )
        self.warn(f"job {rec.slurm_id}: {rec.reason}")
        # stored at the end of this cycle, with the decision's status


def act(
    executor: Executor,
    config: LoopConfig,
    intents: Sequence[tuple[JobRecord, Action, int]],
    now: float,
    t0: float,
) -> tuple[list[tuple[int, str]], SlurmUnavailable | None]:
    """Carry out the cycle's actions, each job's in order: the decisions' statuses, and
    Slurm not answering if it stopped them. Past ``max_starts_per_cycle`` starts, once the
    observation is older than ``stale_after_s``, or once Slurm does not answer, the
    rest are not carried out (but holds): each job's record says what it waits for, and the next
    cycle redoes it from what Slurm shows then (as after a restart). The starts' releases
    and the holds are sent together at the end (``Cluster.flush``). With
    ``parallel_actions`` above 1 the actions of up to that many jobs are carried out at
    once (a job's own in order, each job's record touched by one thread only)."""
    limit = config.max_starts_per_cycle
    starts = 0
    over: set[int] = set()
    for i, (_, action, _) in enumerate(intents):
        if action.kind == "start":
            starts += 1
            if starts > limit:
                over.add(i)
    acting = _Acting(t0, config.stale_after_s)
    statuses: list[str] = [""] * len(intents)

    def carry_out(indices: Iterable[int]) -> None:
        for i in indices:
            rec, action, _ = intents[i]
            statuses[i] = acting.carry_out(executor, rec, action, i in over, now)

    if config.parallel_actions <= 1 or len(intents) <= 1:
        carry_out(range(len(intents)))
    else:
        by_job: dict[int, list[int]] = {}
        for i, (rec, _, _) in enumerate(intents):
            by_job.setdefault(rec.slurm_id, []).append(i)
        workers = min(config.parallel_actions, len(by_job))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="act") as pool:
            for _ in pool.map(carry_out, by_job.values()):
                pass
    done = [(decision_id, statuses[i]) for i, (_, _, decision_id) in enumerate(intents)]
    unanswered = acting.unanswered
    sent: dict[int, tuple[int, JobRecord, Action]] = {
        rec.slurm_id: (i, rec, action)
        for i, (rec, action, _) in enumerate(intents)
        if action.kind in ("start", "hold") and statuses[i] == "done"
    }
    """Starts and holds carried out, by job: where their status is in ``done``."""
    try:
        refused = executor.cluster.flush(send=unanswered is None)
    except SlurmUnavailable as exc:
        unanswered, refused = exc, {}
    for i, rec, action in sent.values():
        if unanswered is not None:  # not sent, or not answered: asked for again
            done[i] = (done[i][0], f"unknown: Slurm did not answer ({describe(unanswered)})")
            not_carried_out(rec, action, now)
        elif rec.slurm_id in refused:
            done[i] = (done[i][0], executor.refused(rec, action, refused[rec.slurm_id]))
    return done, unanswered


class _Acting:
    """What the cycle's actions share while they are carried out: the time the view was
    taken, and Slurm not answering (the first such error)."""

    def __init__(self, t0: float, stale_after_s: float) -> None:
        self.t0 = t0
        self.stale_after_s = stale_after_s
        self.unanswered: SlurmUnavailable | None = None
        self._lock = threading.Lock()

    def carry_out(
        self, executor: Executor, rec: JobRecord, action: Action, over_limit: bool, now: float
    ) -> str:
        """One action's status: carried out, or why not."""
        why = ""
        if self.unanswered is not None:
            why = "not sent: Slurm did not answer"
        elif over_limit:
            why = "deferred"
        if not why and action.kind != "hold" and time.perf_counter() - self.t0 > self.stale_after_s:
            # a hold is safe on any view (a job it finds running is held by nothing): left
            # for the next cycle, a job planned back to the queue could start meanwhile
            why = "deferred: the pool's view is too old, planned again"
        if why:
            not_carried_out(rec, action, now)
            return why
        try:
            return executor.execute(rec, action)
        except SlurmUnavailable as exc:
            with self._lock:
                if self.unanswered is None:
                    self.unanswered = exc
            not_carried_out(rec, action, now)
            return f"unknown: Slurm did not answer ({describe(exc)})"


def not_carried_out(rec: JobRecord, action: Action, now: float) -> None:
    """An action that was not sent (or not answered) is asked for again: a start stays
    in phase starting (redone while Slurm holds the job), a stop is signalled again; a
    forced requeue and an end for a breach of the contract are forgotten, so that the
    next cycle asks for them again rather than take them as done."""
    if action.kind == "requeue_hold" and rec.forced_at == now:
        rec.forced_at = 0.0
    elif action.kind == "cancel" and rec.breach:
        rec.breach = ""


def move_clocks(records: Iterable[JobRecord], seconds: float) -> int:
    """Slurm did not answer for ``seconds``: the clocks of the transitions under way (a
    launch pending or starting up, a stop's grace and signals) move on by that much. The
    number of jobs whose clocks moved."""
    moved = 0
    for rec in records:
        if rec.phase in ("starting", "stopping") or (rec.phase == "running" and not rec.ready):
            rec.phase_since += seconds
            if rec.signalled_at > 0:
                rec.signalled_at += seconds
            if rec.forced_at > 0:
                rec.forced_at += seconds
            moved += 1
    return moved
