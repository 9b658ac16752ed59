"""The controller: a reconcile loop over the cluster seam with durable state.

Each cycle: observe the pool (two Slurm calls on the Slurm side), move every job's state
machine along, read what the jobs reported, ask the policy for a plan when it is time,
write the intended actions to the store, then carry them out. The store is written before
anything is done, so a controller killed at any point picks up from the store and what
Slurm reports (hpcorch/controller/reconcile.py).

One job never stops the loop: what a user controls is checked before use
(hpcorch/controller/validate.py), a job whose comment fails is refused with the reason,
and an exception from one job's handling is recorded against that job (its reason in
``hpcorch status``, one log line) while the cycle goes on with the others. A start that
fails (the plan cannot be written, Slurm refuses) puts the job back in the queue, its GPUs
free for others, and is retried after an exponential back-off, a bounded number of times.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from hpcorch.cluster import Cluster, Observation, ObservedJob
from hpcorch.controller import adopt, availability, reconcile
from hpcorch.controller.availability import Fate
from hpcorch.controller.config import LoopConfig
from hpcorch.controller.execute import Executor, act, move_clocks
from hpcorch.controller.guard import PoolGuard
from hpcorch.controller.lease import Lease
from hpcorch.controller.limit_keeper import LimitKeeper
from hpcorch.controller.logs import describe, log_info, log_warning
from hpcorch.controller.memory import Records
from hpcorch.controller.reconcile import Action
from hpcorch.controller.reports import digest
from hpcorch.controller.rounds import Rounds
from hpcorch.controller.store import CycleStats, JobRecord, Sample, Store
from hpcorch.controller.validate import printable
from hpcorch.policy.types import CompletedJob, Policy

__all__ = ["ACTION_ORDER", "Controller", "LoopConfig"]

ACTION_ORDER = {
    "allow_requeue": 0,
    "signal": 0,
    "hold": 1,
    "requeue_hold": 2,
    "cancel": 2,
    "start": 3,
    "rebatch": 4,
}


LOG_LINES_PER_JOB = 5
"""Most log lines one job's reports may cause in one cycle (its script writes them)."""


class Controller:
    def __init__(
        self,
        cluster: Cluster,
        store: Store,
        policy: Policy,
        config: LoopConfig | None = None,
        log: Callable[[str], None] | None = None,
        lease: Lease | None = None,
    ) -> None:
        self.cluster = cluster
        self.lease = lease
        """The pool's lease this controller holds (None: acts without one, as simulated):
        checked before every cycle's actions (hpcorch/controller/lease.py)."""
        self.store = store
        self._config = config or LoopConfig()
        self.log = log or log_info
        """Where the controller's lines go (tests pass their own; default: logging)."""
        self.warn = log or log_warning
        """Lines about something that went wrong (level warning through logging)."""
        self.last_round = -1e18
        self.measured = False
        """A job's first report at what it was given came since the last round."""
        self.last_time: float | None = None
        self._errors: dict[tuple[int, str], str] = {}
        """The last error logged per (job, stage): the same one is not logged again."""
        self._pool_meta = ""
        self._windows: dict[str, dict[str, Any]] = {
            f"{w['name']}@{w['start']:.0f}": w for w in _json_list(store.get_meta("windows"))
        }
        """Every window seen on the pool's nodes (kept for ``hpcorch report``)."""
        self._flight: bool | None = None
        """Whether the last cycle left a transition in flight (None: no cycle yet)."""
        self.guard = PoolGuard(self.warn)
        """The controller's own holds, and the jobs it did not place (guard.py)."""
        self.executor = Executor(cluster, self.config, self.warn)
        """Carries out actions (execute.py)."""
        for d in store.decisions(status="pending"):
            store.finish_decision(d.id, "interrupted")
        self.records = Records(store)
        """Every job's record as the store holds it (the controller is its only writer)."""
        self.limits = LimitKeeper(store, self.log)
        """Slurm's limits and the caps refused launches taught (limit_keeper.py)."""
        self.rounds = Rounds(
            policy,
            self.config,
            self.records,
            self.executor.plan_batch,
            self._note,
            self._events,
            self.warn,
            self.limits,
        )
        """Scheduling rounds: the policy, and what it learned (rounds.py)."""

    @property
    def config(self) -> LoopConfig:
        return self._config

    @config.setter
    def config(self, config: LoopConfig) -> None:
        """A new configuration, for every part of the loop."""
        self._config = self.rounds.config = self.executor.config = config

    @property
    def policy(self) -> Policy:
        return self.rounds.policy

    @policy.setter
    def policy(self, policy: Policy) -> None:
        self.rounds.policy = policy

    @property
    def history(self) -> list[CompletedJob]:
        return self.rounds.history

    @property
    def last_decision_s(self) -> float:
        return self.rounds.last_decision_s

    # --- one cycle ----------------------------------------------------------------------
    def cycle(self, full: bool = True) -> CycleStats:
        """One cycle. ``full=False``: a fast cycle, which reads only the metrics of jobs in
        transition (what moves their state machines)."""
        try:
            return self._cycle(full)
        except BaseException:
            self.records.load()  # the store is the truth: drop what the cycle changed in memory
            raise

    def _cycle(self, full: bool) -> CycleStats:
        t0 = time.perf_counter()
        calls0, slurm_s0 = self.cluster.calls, self.cluster.call_seconds
        self.cluster.longest_call()  # from here on: this cycle's calls (not a ping between)
        observed_at = self.lease.clock() if self.lease is not None else 0.0
        obs = self.cluster.observe()
        if self.lease is not None:  # LeaseLost: another controller acts on the pool
            self.lease.check(obs.leases, observed_at)
        now = obs.time
        pool_nodes = tuple(n.name for n in obs.nodes)
        observed = {j.slurm_id: j for j in obs.jobs}
        types = {n.name: n.gpu_type for n in obs.nodes}
        changed = self._adopt_new(obs, now)
        records = self.records.active()
        self.limits.observe(obs, records, pool_nodes)
        elsewhere = self._locate([r.slurm_id for r in records if r.slurm_id not in observed])
        pending: list[tuple[JobRecord, Action]] = []
        for rec in records:
            try:
                out = reconcile.observe(
                    rec,
                    observed.get(rec.slurm_id),
                    now,
                    pool_nodes,
                    self.config.settings,
                    types,
                    elsewhere.get(rec.slurm_id),
                )
            except Exception as exc:
                self._job_error(rec, "following its state", exc)
                continue
            pending += [(rec, a) for a in out.actions]
            changed |= bool(out.events) and not rec.active
            self._events(rec, out.events)
            if rec.phase == "queued" and 0 < rec.retry_at <= now:
                rec.retry_at = 0.0  # its back-off is over: schedule it again
                changed = True
        pending += self._replan_blocked(records, obs, now)
        self._account(records, now)
        self._read_metrics(records if full else [r for r in records if _in_transition(r)])
        decision_s = 0.0
        fate = availability.fates(obs.nodes, obs.windows, now, self.config.settings)
        if changed or now >= self.next_round():
            decision_s, acts = self.rounds.schedule(obs, records, now, fate)
            pending += acts
            self.last_round, self.measured = now, False
        pending = [
            (r, self.limits.timed(self._limited(r, a, fate, now, observed))) for r, a in pending
        ]
        try:
            claims = reconcile.start_claims(records, pool_nodes)
        except Exception as exc:
            self.warn(f"placement claims ignored this cycle: {describe(exc)}")
            claims = {}
        active = self.records.active()
        pending = [
            (r, a) for r, a in pending if not self._must_wait(r, a, obs, now, claims, active)
        ]
        queueing = ("start", "hold", "requeue_hold", "cancel")
        acting = {r.slurm_id for r, a in pending if a.kind in queueing}
        holds = 0
        for rec in records:
            if rec.slurm_id not in acting and holds < self.config.max_holds_per_cycle:
                own = self.guard.own_hold(rec, observed.get(rec.slurm_id))
                pending += [(rec, a) for a in own]
                holds += len(own)

        def unstorable(rec: JobRecord, exc: BaseException) -> JobRecord:
            return self._unstorable(rec, exc, now)

        # What the cycle changed and what it means to do is durable before anything is done.
        with self.store.transaction():
            self.records.write(unstorable)
            self.limits.save()
            intents = [
                (rec, a, self._intent(rec, a))
                for rec, a in sorted(pending, key=lambda p: ACTION_ORDER[p[1].kind])
            ]
        done, unanswered = act(self.executor, self.config, intents, now, t0)
        stats = CycleStats(
            time=now,
            seconds=time.perf_counter() - t0,
            decision_s=decision_s,
            slurm_calls=self.cluster.calls - calls0,
            jobs=len(records),
            actions=len(intents),
            full=full,
            extra={
                "slurm_s": self.cluster.call_seconds - slurm_s0,
                "slurm_longest_s": self.cluster.longest_call(),
            },
        )
        pool = json.dumps(
            [
                {
                    "name": n.name,
                    "gpus": n.gpus,
                    "gpus_used": n.gpus_used,
                    "usable": n.usable,
                    "gpus_foreign": n.gpus_foreign,
                    "leaving": n.leaving,
                }
                for n in obs.nodes
            ]
        )
        ends = repr(obs.pool_ends_at) if obs.pool_ends_at else ""
        ends += "\n" + self.guard.foreign(obs)
        ending = {j.slurm_id for j in obs.jobs if j.state == "COMPLETING"}
        self.guard.gpu_view(obs.nodes, records, now, ending)
        with self.store.transaction():
            for decision_id, status in done:
                self.store.finish_decision(decision_id, status)
            self.records.write(unstorable)
            self.store.add_cycle(stats)
            meta = pool + "\n" + ends + "\n" + str(self.guard.view_mismatches)
            if meta != self._pool_meta:
                self.store.set_meta("gpu_view_mismatches", str(self.guard.view_mismatches))
                self.store.set_meta("pool", pool)
                end, _, foreign = ends.partition("\n")
                self.store.set_meta("reservation_end", end)
                self.store.set_meta("foreign", foreign)
                self._pool_meta = meta
            if availability.remember(self._windows, obs.windows):
                self.store.set_meta("windows", json.dumps(list(self._windows.values())))
        window = self.config.fast_for_s
        self._flight = any(
            r.phase in ("starting", "stopping") and now - r.phase_since < window for r in records
        )
        if unanswered is not None:
            raise unanswered  # what was done is stored; the service waits for Slurm
        return stats

    def excuse(self, seconds: float) -> int:
        """Slurm did not answer for ``seconds``: the clocks of the transitions under way
        (a launch pending or starting up, a stop's grace and signals) move on by that
        much, so that nothing is judged late for time Slurm could not act in. The number
        of jobs whose clocks moved. A node's GPUs in use that differed from the controller's
        view before the outage count afresh: slurmctld works through what ended meanwhile."""
        self.guard.view_afresh()
        with self.store.transaction():
            moved = move_clocks(self.records.active(), seconds)
            now = self.cluster.now()
            self.records.write(lambda rec, exc: self._unstorable(rec, exc, now))
        return moved

    def _replan_blocked(
        self, records: Sequence[JobRecord], obs: Observation, now: float
    ) -> list[tuple[JobRecord, Action]]:
        """Starts whose planned GPUs running jobs hold (Slurm placed one of those otherwise
        than planned): held if Slurm has them pending, and planned afresh."""
        try:
            blocked = reconcile.blocked_starts(records, obs.nodes)
        except Exception as exc:
            self.warn(f"starts not checked against what runs this cycle: {describe(exc)}")
            return []
        held = {j.slurm_id for j in obs.jobs if j.held}
        out: list[tuple[JobRecord, Action]] = []
        for rec in records:
            why = blocked.get(rec.slurm_id)
            if why is None:
                continue
            o = reconcile.Outcome()
            reconcile.queue_again(rec, now, o, "hold", why, self.config.settings.start_backoff_s)
            self._events(rec, [f"replan: {why}"])
            if rec.slurm_id not in held:
                out += [(rec, a) for a in o.actions]
        return out

    # --- adoption of new jobs -----------------------------------------------------------
    def _adopt_new(self, obs: Observation, now: float) -> bool:
        """Records for jobs seen for the first time, and for lost jobs seen again."""
        lost = self.records.lost
        seen = [j for j in obs.jobs if j.slurm_id not in self.records or j.slurm_id in lost]
        for j in seen:
            who = f"job {j.slurm_id} ({printable(j.name)}, {printable(j.user, 32)})"
            try:
                old = self.records.get(j.slurm_id) if j.slurm_id in lost else None
                if old is not None and j.tags.get("id", str(j.slurm_id)) == old.job_key:
                    rec = adopt.readopt(old, j, now)
                    what = f"reappeared in Slurm ({j.state.lower()}): re-adopted as"
                else:
                    rec = adopt.new_record(j, now)
                    what = "joined the pool:"
            except Exception as exc:
                rec = adopt.refused(j, now, f"controller error: {describe(exc)}")
                what = "joined the pool:"
            self.records.add(rec)  # stored with the cycle's records, before any action
            if rec.phase == "refused":
                self.warn(f"{who} {rec.reason}")
            else:
                self.log(f"{who} {what} {rec.phase}")
        return bool(seen)

    def _locate(self, missing: Sequence[int]) -> dict[int, str]:
        """Where Slurm lists the followed jobs the pool's observation lacks (moved out of
        the reservation); {} when none is missing or Slurm cannot say (they count as lost,
        and are re-adopted if they come back)."""
        if not missing:
            return {}
        try:
            return self.cluster.locate(missing)
        except Exception as exc:
            ids = ", ".join(map(str, missing[:5]))
            self.warn(f"cannot tell where jobs {ids} went: {describe(exc)}")
            return {}

    # --- bookkeeping --------------------------------------------------------------------
    def _job_error(self, rec: JobRecord, stage: str, exc: BaseException) -> None:
        """An exception from one job's handling: the job's reason says so, one log line
        (not repeated while the same error recurs), and the cycle goes on."""
        self._note(rec, stage, f"controller error {stage}: {describe(exc)}")

    def _note(self, rec: JobRecord, key: str, msg: str) -> None:
        """``msg`` as the job's reason, and logged unless it was the last one for ``key``."""
        rec.reason = msg = printable(msg, 300)
        if self._errors.get((rec.slurm_id, key)) != msg:
            self._errors[(rec.slurm_id, key)] = msg
            self.log(f"job {rec.slurm_id}: {msg}")

    def _unstorable(self, rec: JobRecord, exc: BaseException, now: float) -> JobRecord:
        """What is stored instead of a record the store refuses: a failed one with the
        reason, so that the job stops being handled rather than the loop."""
        self._job_error(rec, "saving its record", exc)
        return adopt.quarantined(rec, now)

    def _events(self, rec: JobRecord, events: Sequence[str]) -> None:
        for e in events:
            self.log(f"job {rec.slurm_id} {e}")

    def _account(self, records: Sequence[JobRecord], now: float) -> None:
        if self.last_time is not None:
            dt = max(0.0, now - self.last_time)
            for rec in records:
                if rec.phase in ("running", "stopping"):
                    rec.gpu_seconds += rec.gpus * dt
                    rec.run_total_s += dt
        self.last_time = now

    def _read_metrics(self, records: Sequence[JobRecord]) -> None:
        new: list[Sample] = []
        for rec in records:
            if rec.phase not in ("running", "stopping") or not rec.job_dir:
                continue
            budget = [LOG_LINES_PER_JOB]

            def log(msg: str, budget: list[int] = budget) -> None:
                budget[0] -= 1
                if budget[0] >= 0:
                    self.log(msg)

            try:
                lines, rec.metrics_offset = self.cluster.read_metrics(
                    rec.job_dir, rec.metrics_offset, rec.uid
                )
                for line in lines:
                    sample = digest(rec, line, log)
                    if sample is not None:
                        new.append(sample)
                        self.measured |= self.executor.first_report(sample)
            except Exception as exc:
                self._job_error(rec, "reading its metrics", exc)
        self.records.stage(new)  # stored with the cycle's records

    def next_round(self) -> float:
        """When the next scheduling round is due (sooner when a job arrives or ends)."""
        early = self.measured and self.config.measured_round > 0  # 0: never brought forward
        part = min(self.config.measured_round, 1.0) if early else 1.0
        return self.last_round + part * self.config.round_s

    # --- carrying out ---------------------------------------------------------------------
    def _limited(
        self,
        rec: JobRecord,
        a: Action,
        fate: Mapping[str, Fate],
        now: float,
        observed: Mapping[int, ObservedJob],
    ) -> Action:
        """A start with the time limit its launch gets (a window ahead on its nodes)."""
        if a.kind != "start" or a.shape is None:
            return a
        job = observed.get(rec.slurm_id)
        current = job.time_limit_min if job is not None else 0
        return replace(a, shape=availability.launch_limit(rec, a.shape, fate, now, current))

    def _must_wait(
        self,
        rec: JobRecord,
        a: Action,
        obs: Observation,
        now: float,
        claims: Mapping[int, Mapping[str, int]],
        active: Sequence[JobRecord],
    ) -> bool:
        """A start that must wait (reconcile.start_wait) stays held in phase starting;
        it is tried again every cycle, and planned afresh once it has waited as long as
        Slurm may keep a released launch pending (``launch_pending_s``)."""
        if a.kind != "start" or a.shape is None:
            return False
        s = self.config.settings
        try:
            why = reconcile.start_wait(rec, a.shape, obs.nodes, now, s, claims)
            why = why or self.limits.wait(rec, a.shape, active)
        except Exception as exc:  # this job's start waits; the others go on
            self._job_error(rec, "placing its start", exc)
            return True
        if why and now - rec.phase_since >= s.launch_pending_s:
            again = f"its start waited {now - rec.phase_since:.0f} s ({why}): planned again"
            reconcile.queue_again(rec, now, reconcile.Outcome(), "hold", again, s.start_backoff_s)
            self._events(rec, [f"replan: {again}"])  # (held all along: nothing to ask Slurm)
        elif why:
            rec.reason = why
        return bool(why)

    def _intent(self, rec: JobRecord, a: Action) -> int:
        to = a.shape.gpus if a.shape else rec.target_gpus
        return self.store.add_decision(
            rec.slurm_id, a.kind, rec.gpus, to, rec.target_batch or rec.batch, a.reason
        )

    @property
    def admin_holds(self) -> bool | None:
        """Whether the controller's holds are admin holds (None: not known yet)."""
        return self.guard.admin_holds

    # --- running ------------------------------------------------------------------------
    def in_flight(self) -> bool:
        """A transition is under way: some job is starting or stopping (for at most
        ``fast_for_s``)."""
        if self._flight is None:
            now = self.cluster.now()
            return any(
                r.phase in ("starting", "stopping") and now - r.phase_since < self.config.fast_for_s
                for r in self.records.active()
            )
        return self._flight

    def next_interval(self, calls: int = 0) -> float:
        """Seconds to the next cycle: short while a transition is in flight, but no more
        than ``max_calls_per_s`` Slurm calls a second (``calls``: the last cycle's)."""
        if not self.in_flight():
            return self.config.interval_s
        fast = min(self.config.fast_interval_s, self.config.interval_s)
        if self.config.max_calls_per_s > 0:
            fast = max(fast, calls / self.config.max_calls_per_s)
        return fast


def _in_transition(rec: JobRecord) -> bool:
    """A job whose reports move its state machine: starting, stopping, or running but not
    yet reported its start (it cannot be signalled before)."""
    return rec.phase in ("starting", "stopping") or (rec.phase == "running" and not rec.ready)


def _json_list(text: str | None) -> list[dict[str, Any]]:
    """A JSON list of objects kept in the store's meta ([] if absent or not one)."""
    try:
        raw = json.loads(text or "[]")
    except json.JSONDecodeError:
        return []
    return [r for r in raw if isinstance(r, dict)] if isinstance(raw, list) else []
