"""A scheduling round: the policy's view of the pool built from the store, its plan
checked, and the plan turned into each job's actions (hpcorch/controller/decide.py).

Set apart before the policy runs: a queued job backing off after a failed start, one whose
minimum the pool cannot give now (hpcorch/controller/waiting.py says why), and the nodes
its jobs must leave (a drain, a pending reboot, a maintenance window:
hpcorch/controller/availability.py). A policy that fails, or plans what the pool cannot
honour, changes nothing: every allocation stays as it is.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence

from hpcorch.cluster import Observation
from hpcorch.controller import availability, reconcile
from hpcorch.controller.actions import Action
from hpcorch.controller.availability import Fate
from hpcorch.controller.config import LoopConfig
from hpcorch.controller.limit_keeper import LimitKeeper
from hpcorch.controller.limits import LIMIT_WAIT
from hpcorch.controller.limits import NEVER as LIMIT_NEVER
from hpcorch.controller.logs import describe
from hpcorch.controller.memory import Records
from hpcorch.controller.snapshot import Profiles, build_snapshot, completed, planned_type
from hpcorch.controller.store import JobRecord
from hpcorch.controller.validate import TagError, pin_of, request_of
from hpcorch.controller.waiting import NEVER, WAITING, fits, silent_launches, why_waiting
from hpcorch.policy.limits import limited_schedule, validate_limits
from hpcorch.policy.types import CompletedJob, JobPlan, PlanError, Policy, validate_plan

Acts = list[tuple[JobRecord, Action]]
LIMITED = (LIMIT_WAIT, LIMIT_NEVER)
"""How a reason of a job one of Slurm's limits holds back begins."""


class Rounds:
    """The policy and what it learned from the jobs that ended (its history)."""

    def __init__(
        self,
        policy: Policy,
        config: LoopConfig,
        records: Records,
        plan_batch: Mapping[int, int],
        note: Callable[[JobRecord, str, str], None],
        events: Callable[[JobRecord, Sequence[str]], None],
        warn: Callable[[str], None],
        limits: LimitKeeper | None = None,
    ) -> None:
        self.policy = policy
        self.limits = limits
        """Slurm's limits, which every plan keeps to (None: none)."""
        self.config = config
        self.records = records
        self.plan_batch = plan_batch
        """The global batch of the plan each running launch has (the executor's)."""
        self.note, self.events, self.warn = note, events, warn
        self.history: list[CompletedJob] = []
        self._history_ids: set[int] = set()
        self._profiles = Profiles()
        self.last_decision_s = 0.0
        self._failed = ""
        """The last policy failure said (the same one is not said again)."""

    def _learn(self) -> None:
        """Jobs that ended: a finished one joins the history; their samples are dropped."""
        for rec in self.records.ended():
            if rec.phase == "done" and rec.slurm_id not in self._history_ids:
                self.history.append(completed(rec, self.records.samples(rec.slurm_id)))
                self._history_ids.add(rec.slurm_id)
            self.records.forget_samples(rec.slurm_id)
            self._profiles.forget(rec.slurm_id)

    def schedule(
        self,
        obs: Observation,
        records: Sequence[JobRecord],
        now: float,
        fate: Mapping[str, Fate],
    ) -> tuple[float, Acts]:
        """One round: the seconds the policy took, and the actions of its plan."""
        self._learn()
        s = self.config.settings
        active = [r for r in records if r.active and not (r.phase == "queued" and r.retry_at)]
        moving = availability.must_move(active, obs.nodes, fate, now, s) if fate else {}
        nodes = availability.planned_nodes(obs.nodes, active, fate, moving, now)
        acts: Acts = []
        unfit = [
            r
            for r in active
            if (r.phase == "queued" or r.slurm_id in moving) and r.min_gpus > fits(r, nodes)
        ]
        holders = silent_launches(records, now, s)  # once a round, not once a queued job
        for rec in unfit:  # it waits, or leaves its node for the queue
            if rec.slurm_id in moving:
                acts += self._decide(rec, None, now, (), "", moving[rec.slurm_id], None)
            else:
                self._waiting(rec, records, obs, now, holders)
        left_out = {id(r) for r in unfit}
        active = [r for r in active if id(r) not in left_out]
        pins, requests = self._requests(obs, active)
        tags = {j.slurm_id: j.tags for j in obs.jobs}
        samples = {r.slurm_id: self.records.samples(r.slurm_id) for r in active}
        t0 = time.perf_counter()
        try:
            snapshot = build_snapshot(
                now,
                nodes,
                active,
                samples,
                self.history,
                pins,
                self.config.round_s,
                self.config.restart_cost_s,
                requests,
                obs.fair_shares,
                s,
                self._profiles,
                self.config.mix_types,
                moving,
            )
            if self.limits is not None:
                snapshot = self.limits.constrain(snapshot, active)
            t0 = time.perf_counter()
            plan = limited_schedule(self.policy, snapshot)
            validate_plan(snapshot, plan)
            validate_limits(snapshot, plan)
        except Exception as exc:
            # An empty plan would preempt every job: keep every allocation as it is.
            what = "gave an invalid plan" if isinstance(exc, PlanError) else "failed"
            msg = f"policy {self.policy.name} {what}, plan ignored: {describe(exc)}"
            if self._failed != msg:
                self._failed = msg
                self.warn(msg)
            self.last_decision_s = time.perf_counter() - t0
            return self.last_decision_s, []
        self._failed = ""
        decision_s = self.last_decision_s = time.perf_counter() - t0
        targets = plan.by_id()
        pool_nodes = tuple(n.name for n in obs.nodes)
        failed = {n.name for n in obs.nodes if not n.usable and not n.leaving}
        for rec in active:
            if rec.phase not in ("queued", "running"):
                continue
            if rec.phase == "running" and failed & set(rec.node_list.split(",")):
                continue  # on a failed node: Slurm requeues it; nothing to ask of it
            if rec.phase == "running" and not rec.movable:
                rec.reason = rec.fixed_reason()
                continue
            jp = targets.get(str(rec.slurm_id))
            if jp is not None:
                rec.target_batch = jp.global_batch
            live = rec.mode != "sidecar" or tags.get(rec.slurm_id, {}).get("livebatch") == "1"
            live = live and bool(rec.job_dir)
            kind = planned_type(snapshot, jp)
            acts += self._decide(rec, jp, now, pool_nodes, kind, moving.get(rec.slurm_id, ""), live)
            if rec.phase == "queued" and not rec.retry_at:
                self._waiting(rec, records, obs, now, holders)
        return decision_s, acts

    def _decide(
        self,
        rec: JobRecord,
        jp: JobPlan | None,
        now: float,
        pool_nodes: tuple[str, ...],
        gpu_type: str,
        must_move: str,
        live: bool | None,
    ) -> Acts:
        """The job's actions for its plan ``jp`` (None: no GPUs this round); one job's error
        is its own (its reason), never the round's."""
        try:
            out = reconcile.decide(
                rec,
                jp.gpus if jp else 0,
                dict(jp.placement) if jp else {},
                now,
                pool_nodes,
                self.config.settings,
                jp.cpus_per_gpu if jp else 0,
                self.plan_batch.get(rec.slurm_id, 0),
                bool(live),
                restart_cost_s=self.config.restart_cost_s,
                gpu_type=gpu_type,
                chose_type=bool(jp and jp.gpu_type),
                must_move=must_move,
            )
        except Exception as exc:
            self.note(rec, "carrying out its plan", f"controller error: {describe(exc)}")
            return []
        self.events(rec, out.events)
        return [(rec, a) for a in out.actions]

    def _waiting(
        self,
        rec: JobRecord,
        records: Sequence[JobRecord],
        obs: Observation,
        now: float,
        holders: Sequence[JobRecord],
    ) -> None:
        """A queued job the round did not start: why it waits (waiting.py), where its
        reason is the plain wait or a minimum the pool can never give; one of Slurm's
        limits first (limit_keeper.py)."""
        if self.limits is not None and self.limits.explain(rec, records):
            return
        why = why_waiting(rec, records, obs.nodes, now, self.config.settings, holders)
        if why.startswith(NEVER) or rec.reason.startswith((WAITING, NEVER, *LIMITED)):
            rec.reason = why

    def _requests(
        self, obs: Observation, active: Sequence[JobRecord]
    ) -> tuple[dict[int, int], dict[int, tuple[int, int]]]:
        """Pins (``hpcorch resize``) and requests from the jobs' comments, checked: a bad
        one is ignored, and the job's reason says why."""
        by_id = {r.slurm_id: r for r in active}
        pins: dict[int, int] = {}
        requests: dict[int, tuple[int, int]] = {}
        for j in obs.jobs:
            rec = by_id.get(j.slurm_id)
            if rec is None:
                continue
            try:
                pin = pin_of(j.tags, rec.min_gpus, rec.max_gpus)
                request = request_of(j.tags)
            except TagError as exc:
                self.note(rec, "pin", f"pin or request ignored: {exc}")
                continue
            if pin is not None:
                pins[j.slurm_id] = pin
            if request is not None:
                requests[j.slurm_id] = request
        return pins, requests
