"""The controller: a reconcile loop over the cluster seam with durable state.

Each cycle: observe the pool (two Slurm calls on the Slurm side), move every job's state
machine along, read what the jobs reported, ask the policy for a plan when it is time,
write the intended actions to the store, then carry them out. The store is written before
anything is done, so a controller killed at any point picks up from the store and what
Slurm reports (hpcorch/controller/reconcile.py).
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from hpcorch.cluster import Cluster, Observation, ObservedJob
from hpcorch.controller import reconcile
from hpcorch.controller.identity import fingerprint, model_bytes
from hpcorch.controller.reconcile import Action, Settings
from hpcorch.controller.snapshot import build_snapshot, completed
from hpcorch.controller.store import CycleStats, JobRecord, Sample, Store
from hpcorch.errors import HpcorchError
from hpcorch.planner import LaunchPlan
from hpcorch.policy.split import split_schedule
from hpcorch.policy.types import CompletedJob, PlanError, Policy, validate_plan
from hpcorch.protocol import DEFAULT_MAX_RELAUNCHES

ACTION_ORDER = {"signal": 0, "hold": 1, "requeue_hold": 2, "start": 3, "rebatch": 4}


@dataclass(frozen=True)
class LoopConfig:
    interval_s: float = 10.0
    """Seconds between cycles."""
    fast_interval_s: float = 0.25
    """Seconds between cycles while a transition is in flight (a job starting or
    stopping): the controller acts on a checkpoint exit or a start as soon as Slurm shows
    it, not at the next full cycle. These fast cycles observe and move the state machines;
    they read the metrics of jobs in transition only (every job's at least every
    ``interval_s``)."""
    max_calls_per_s: float = 8.0
    """Slurm calls per second the fast cycles may make at most (0: no bound): a cycle
    that made n calls is followed by at least n / max_calls_per_s seconds."""
    fast_for_s: float = 300.0
    """A transition is polled fast for at most this long (a job left pending by Slurm
    for longer is looked at every ``interval_s``)."""
    round_s: float = 60.0
    """Seconds between scheduling rounds (sooner when a job arrives or ends)."""
    restart_cost_s: float = 30.0
    """What the policy assumes a resize costs a job."""
    max_starts_per_cycle: int = 64
    settings: Settings = field(default_factory=Settings)


logger = logging.getLogger("hpcorch.controller")
_JOB_RE = re.compile(r"job (\d+)\b")


def _extra(msg: str) -> dict[str, Any]:
    """The Slurm job a line is about, as a field of its own (JSON logs: a label)."""
    m = _JOB_RE.match(msg)
    return {"slurm_job_id": int(m.group(1))} if m else {}


def _log(msg: str) -> None:
    logger.info("%s", msg, extra=_extra(msg))


def _warn(msg: str) -> None:
    logger.warning("%s", msg, extra=_extra(msg))


def _int(tags: Mapping[str, str], key: str, default: int) -> int:
    value = tags.get(key, "")
    return int(value) if value.isdigit() else default


class Controller:
    def __init__(
        self,
        cluster: Cluster,
        store: Store,
        policy: Policy,
        config: LoopConfig | None = None,
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.store = store
        self.policy = policy
        self.config = config or LoopConfig()
        self.log = log or _log
        """Where the controller's lines go (tests pass their own; default: logging)."""
        self.warn = log or _warn
        """Lines about something that went wrong (level warning through logging)."""
        self.last_round = -1e18
        self.last_time: float | None = None
        self.last_decision_s = 0.0
        self.history: list[CompletedJob] = []
        self._history_ids: set[int] = set()
        self._flight: bool | None = None
        """Whether the last cycle left a transition in flight (None: no cycle yet)."""
        self._known: set[int] | None = None
        """Slurm ids of the jobs in the store (read once, then kept up to date)."""
        self._plan_batch: dict[int, int] = {}
        """The global batch of the plan each running launch has (this controller's writes)."""
        for d in store.decisions(status="pending"):
            store.finish_decision(d.id, "interrupted")

    # --- one cycle ----------------------------------------------------------------------
    def cycle(self, full: bool = True) -> CycleStats:
        """One cycle. ``full=False``: a fast cycle, which reads only the metrics of jobs in
        transition (what moves their state machines)."""
        t0 = time.perf_counter()
        calls0 = self.cluster.calls
        obs = self.cluster.observe()
        now = obs.time
        pool_nodes = tuple(n.name for n in obs.nodes)
        observed = {j.slurm_id: j for j in obs.jobs}
        changed = self._adopt_new(obs, now)
        records = self.store.jobs(active_only=True)
        pending: list[tuple[JobRecord, Action]] = []
        for rec in records:
            out = reconcile.observe(
                rec, observed.get(rec.slurm_id), now, pool_nodes, self.config.settings
            )
            pending += [(rec, a) for a in out.actions]
            changed |= bool(out.events) and not rec.active
            self._events(rec, out.events)
        self._account(records, now)
        self._read_metrics(records if full else [r for r in records if _in_transition(r)])
        decision_s = 0.0
        if changed or now - self.last_round >= self.config.round_s:
            samples = {r.slurm_id: self.store.samples(r.slurm_id)[-200:] for r in records}
            decision_s, acts = self._schedule(obs, records, samples, now)
            pending += acts
            self.last_round = now
        claims = reconcile.start_claims(records, pool_nodes)
        pending = [(r, a) for r, a in pending if not self._must_wait(r, a, obs, now, claims)]
        with self.store.transaction():
            for rec in records:
                self.store.put_job(rec)
            intents = [
                (rec, a, self._intent(rec, a))
                for rec, a in sorted(pending, key=lambda p: ACTION_ORDER[p[1].kind])
            ]
        starts = 0
        for rec, action, decision_id in intents:
            if action.kind == "start":
                starts += 1
                if starts > self.config.max_starts_per_cycle:
                    self.store.finish_decision(decision_id, "deferred")
                    continue
            self._execute(rec, action, decision_id)
        stats = CycleStats(
            time=now,
            seconds=time.perf_counter() - t0,
            decision_s=decision_s,
            slurm_calls=self.cluster.calls - calls0,
            jobs=len(records),
            actions=len(intents),
        )
        self.store.add_cycle(stats)
        pool = [
            {"name": n.name, "gpus": n.gpus, "gpus_used": n.gpus_used, "usable": n.usable}
            for n in obs.nodes
        ]
        self.store.set_meta("pool", json.dumps(pool))
        self.store.set_meta("reservation_end", repr(obs.pool_ends_at) if obs.pool_ends_at else "")
        window = self.config.fast_for_s
        self._flight = any(
            r.phase in ("starting", "stopping") and now - r.phase_since < window for r in records
        )
        return stats

    # --- adoption of new jobs -----------------------------------------------------------
    def _adopt_new(self, obs: Observation, now: float) -> bool:
        if self._known is None:
            self._known = self.store.job_ids()
        new = [j for j in obs.jobs if j.slurm_id not in self._known]
        with self.store.transaction():
            for j in new:
                rec = self._record(j, now)
                self.store.put_job(rec)
                self.log(f"job {j.slurm_id} ({j.name}, {j.user}) joined the pool: {rec.phase}")
        self._known.update(j.slurm_id for j in new)
        return bool(new)

    def _record(self, j: ObservedJob, now: float) -> JobRecord:
        t = dict(j.tags)
        min_gpus = _int(t, "min", max(1, j.gpus))
        batch = _int(t, "batch", 0) or 32 * min_gpus
        if j.state == "PENDING":
            phase = "queued" if j.held else "starting"
        elif j.ended:
            phase = {
                "COMPLETED": "done" if j.exit_code == 0 else "failed",
                "CANCELLED": "cancelled",
            }.get(j.state, "failed")
        else:
            phase = "running"
        rec = JobRecord(
            slurm_id=j.slurm_id,
            job_key=t.get("id", str(j.slurm_id)),
            name=j.name,
            user=j.user,
            job_dir=t.get("dir", ""),
            app=t.get("app", ""),
            min_gpus=min_gpus,
            max_gpus=max(min_gpus, _int(t, "max", min_gpus)),
            batch=batch,
            max_batch=max(batch, _int(t, "maxbatch", batch)),
            max_micro=_int(t, "micro", 0) or max(1, batch // min_gpus),
            submit_time=j.submit_time or now,
            phase=phase,
            phase_since=now,
            target_gpus=j.gpus if phase in ("running", "starting") else 0,
            slurm_restarts=j.restarts,
            reason="adopted" if phase != "queued" else "waiting for GPUs",
            mode="sidecar" if t.get("mode") == "sidecar" else "managed",
            resumable=0 if t.get("resume") == "no" else 1,
            predictable=0 if t.get("progress") == "no" else 1,
            stop_grace_s=float(_int(t, "grace", 0)),
            min_cpus=max(1, _int(t, "mincpus", 1)),
            time_budget_s=float(_int(t, "budget", 0)),
            max_relaunches=_int(t, "relaunches", DEFAULT_MAX_RELAUNCHES),
        )
        if phase == "starting" and not rec.target_gpus:
            rec.target_gpus = rec.min_gpus
        return rec

    # --- bookkeeping --------------------------------------------------------------------
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
            lines, rec.metrics_offset = self.cluster.read_metrics(rec.job_dir, rec.metrics_offset)
            for line in lines:
                sample = self._digest(rec, line)
                if sample is not None:
                    new.append(sample)
        if new:
            with self.store.transaction():
                self.store.add_samples(new)

    def _digest(self, rec: JobRecord, line: dict[str, Any]) -> Sample | None:
        event = line.get("event")
        if event in ("launch", "mode", "checkpoint", "resumed", "stop"):
            self._sidecar_event(rec, event, line)
            return None
        if event == "start":
            rec.ready = 1
            epochs, size = line.get("epochs"), line.get("dataset_size")
            if isinstance(epochs, int) and epochs > 0:
                rec.epochs = epochs
            if isinstance(size, int) and size > 0:
                rec.steps_per_epoch = size / max(1, rec.batch)
            rec.fingerprint = fingerprint(line.get("model"), line.get("params"), size)
            rec.model_bytes = model_bytes(line.get("model_bytes"))
            return None
        if event != "steps":
            return None
        try:
            step_time = float(line["step_time"])
            gpus = int(line.get("gpus") or rec.gpus)
            batch = int(line.get("global_batch") or rec.global_batch or rec.batch)
            rec.epoch = int(line.get("epoch", rec.epoch))
            step = int(line.get("step", 0))
        except (KeyError, TypeError, ValueError):
            return None
        total = line.get("total_steps")
        if isinstance(total, int) and total > 0 and rec.mode == "sidecar":
            rec.epochs = rec.epochs or 1
            rec.steps_per_epoch = total * batch / max(1, rec.batch) / rec.epochs
        rec.global_batch = batch
        rec.cpus_per_gpu = int(line.get("cpus_per_gpu") or rec.cpus_per_gpu)
        wait = line.get("data_wait")
        rec.micro_batch = int(line.get("per_gpu_batch") or 0)
        rec.accum_steps = int(line.get("accum_steps") or 1)
        rec.samples_per_s = float(line.get("samples_per_s") or 0.0)
        rec.progress = max(rec.progress, step * batch / max(1, rec.batch))
        noise = line.get("noise_scale")
        return Sample(
            slurm_id=rec.slurm_id,
            time=float(line.get("time", 0.0)),
            gpus=gpus,
            nodes=max(1, rec.nodes),
            micro_batch=rec.micro_batch,
            accum_steps=rec.accum_steps,
            global_batch=batch,
            step_time=step_time,
            samples_per_s=rec.samples_per_s,
            loss=float(line["loss"]) if isinstance(line.get("loss"), int | float) else None,
            noise_scale=float(noise) if isinstance(noise, int | float) else None,
            step=step,
            cpus_per_gpu=rec.cpus_per_gpu,
            data_wait=float(wait) if isinstance(wait, int | float) else None,
        )

    def _sidecar_event(self, rec: JobRecord, event: str, line: dict[str, Any]) -> None:
        """What the sidecar (or the runtime) says about stopping and resuming the job."""
        if event == "launch":
            if rec.mode_detected:
                return  # it uses the runtime: ready once the runtime reports its start
            rec.ready = 1  # the sidecar holds the signal: it can be stopped from now on
            rec.mode = "sidecar"
            rec.resumable = int(bool(line.get("resumable", rec.resumable)))
            rec.predictable = int(bool(line.get("predictable", rec.predictable)))
            rec.needs_ckpt = int(bool(line.get("watches_checkpoints", rec.needs_ckpt)))
        elif event == "mode" and line.get("mode") == "managed":
            rec.mode, rec.mode_detected = "managed", 1
            rec.resumable = rec.predictable = 1
            self.log(f"job {rec.slurm_id} uses hpcorch's runtime: managed mode")
        elif event == "checkpoint":
            rec.checkpoints += 1
        elif event == "resumed":
            lost = line.get("lost_steps")
            if isinstance(lost, int) and lost > 0:
                rec.lost_steps += lost
                self.log(
                    f"job {rec.slurm_id} resumed at step {line.get('step')}: {lost} steps lost"
                )
        elif event == "stop" and line.get("graceful") is False:
            rec.kills += 1
            self.log(
                f"job {rec.slurm_id} ignored its stop signal and was killed after "
                f"{line.get('waited_s')} s"
            )

    # --- scheduling ---------------------------------------------------------------------
    def _schedule(
        self,
        obs: Observation,
        records: Sequence[JobRecord],
        samples: dict[int, list[Sample]],
        now: float,
    ) -> tuple[float, list[tuple[JobRecord, Action]]]:
        for rec in self.store.jobs():
            if not rec.active and rec.slurm_id not in self._history_ids and rec.phase == "done":
                self.history.append(completed(rec, self.store.samples(rec.slurm_id)))
                self._history_ids.add(rec.slurm_id)
        tags = {j.slurm_id: j.tags for j in obs.jobs}
        pins = {sid: int(t["pin"]) for sid, t in tags.items() if t.get("pin", "").isdigit()}
        requests = {
            sid: (_int(t, "req", 0), _int(t, "reqbatch", 0))
            for sid, t in tags.items()
            if "req" in t or "reqbatch" in t
        }
        active = [r for r in records if r.active]
        snapshot = build_snapshot(
            now,
            obs.nodes,
            active,
            samples,
            self.history,
            pins,
            self.config.round_s,
            self.config.restart_cost_s,
            requests,
            obs.fair_shares,
        )
        t0 = time.perf_counter()
        try:
            plan = split_schedule(self.policy, snapshot)
            validate_plan(snapshot, plan)
        except PlanError as exc:
            # An empty plan would preempt every job: keep every allocation as it is.
            self.warn(f"policy {self.policy.name} gave an invalid plan, ignored: {exc}")
            self.last_decision_s = time.perf_counter() - t0
            return self.last_decision_s, []
        decision_s = time.perf_counter() - t0
        self.last_decision_s = decision_s
        targets = plan.by_id()
        pool_nodes = tuple(n.name for n in obs.nodes)
        acts: list[tuple[JobRecord, Action]] = []
        unusable = {n.name for n in obs.nodes if not n.usable}
        for rec in active:
            if rec.phase not in ("queued", "running"):
                continue
            if unusable & set(rec.node_list.split(",")):
                continue  # on a failed node: Slurm requeues it; nothing to ask of it
            if rec.phase == "running" and not rec.movable:
                rec.reason = rec.fixed_reason()
                continue
            jp = targets.get(str(rec.slurm_id))
            gpus = jp.gpus if jp else 0
            if jp is not None:
                rec.target_batch = jp.global_batch
            live = rec.mode != "sidecar" or tags.get(rec.slurm_id, {}).get("livebatch") == "1"
            out = reconcile.decide(
                rec,
                gpus,
                dict(jp.placement) if jp else {},
                now,
                pool_nodes,
                self.config.settings,
                jp.cpus_per_gpu if jp else 0,
                self._plan_batch.get(rec.slurm_id, 0),
                live and bool(rec.job_dir),
            )
            acts += [(rec, a) for a in out.actions]
            self._events(rec, out.events)
        return decision_s, acts

    # --- carrying out ---------------------------------------------------------------------
    def _must_wait(
        self,
        rec: JobRecord,
        a: Action,
        obs: Observation,
        now: float,
        claims: Mapping[int, Mapping[str, int]],
    ) -> bool:
        """A start that must wait (reconcile.start_wait) stays held in phase starting;
        it is tried again every cycle."""
        if a.kind != "start" or a.shape is None:
            return False
        why = reconcile.start_wait(rec, a.shape, obs.nodes, now, self.config.settings, claims)
        if why:
            rec.reason = why
        return bool(why)

    def _intent(self, rec: JobRecord, a: Action) -> int:
        to = a.shape.gpus if a.shape else rec.target_gpus
        return self.store.add_decision(
            rec.slurm_id, a.kind, rec.gpus, to, rec.target_batch or rec.batch, a.reason
        )

    def _execute(self, rec: JobRecord, a: Action, decision_id: int) -> None:
        try:
            if a.kind == "start":
                assert a.shape is not None
                batch = max(rec.target_batch or rec.batch, a.shape.gpus)
                if rec.job_dir:
                    self.cluster.write_plan(
                        rec.job_dir,
                        LaunchPlan(
                            global_batch=batch,
                            gpus=a.shape.gpus,
                            max_micro_batch=max(1, rec.max_micro),
                            job=rec.job_key,
                            launch=rec.launches,
                            placement=tuple(
                                zip(a.shape.node_names, a.shape.per_node, strict=False)
                            ),
                        ),
                    )
                self.cluster.start(rec.slurm_id, a.shape)
                self._plan_batch[rec.slurm_id] = batch
            elif a.kind == "rebatch":  # same launch, same GPUs: no Slurm call
                self.cluster.write_plan(
                    rec.job_dir,
                    LaunchPlan(
                        global_batch=rec.target_batch,
                        gpus=rec.gpus,
                        max_micro_batch=max(1, rec.max_micro),
                        job=rec.job_key,
                        launch=max(0, rec.launches - 1),
                    ),
                )
                self._plan_batch[rec.slurm_id] = rec.target_batch
            elif a.kind == "signal":
                self.cluster.signal_checkpoint(rec.slurm_id)
            elif a.kind == "hold":
                self.cluster.hold(rec.slurm_id)
            elif a.kind == "requeue_hold":
                self.cluster.requeue_hold(rec.slurm_id)
            self.store.finish_decision(decision_id)
        except (HpcorchError, OSError) as exc:
            self.store.finish_decision(decision_id, f"error: {exc}")
            self.warn(f"job {rec.slurm_id}: {a.kind} failed: {exc}")

    # --- running ------------------------------------------------------------------------
    def in_flight(self) -> bool:
        """A transition is under way: some job is starting or stopping (for at most
        ``fast_for_s``)."""
        if self._flight is None:
            now = self.cluster.now()
            return any(
                r.phase in ("starting", "stopping") and now - r.phase_since < self.config.fast_for_s
                for r in self.store.jobs(active_only=True)
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

    def run(self, should_stop: Callable[[], bool], sleep: Callable[[float], object]) -> None:
        """Cycle until ``should_stop``: a full cycle every ``interval_s``, fast ones in
        between while a transition is in flight."""
        backoff = self.config.interval_s
        last_full = -1e18
        clock = self.cluster.now
        while not should_stop():
            t0 = clock()
            full = t0 - last_full >= self.config.interval_s
            try:
                stats = self.cycle(full=full)
                backoff = self.config.interval_s
            except HpcorchError as exc:
                self.warn(f"cycle failed, retrying in {backoff:.0f} s: {exc}")
                sleep(backoff)
                backoff = min(backoff * 2, 300.0)
                continue
            if full:
                last_full = t0
            wait = self.next_interval(stats.slurm_calls)
            if not self.in_flight():  # the next full cycle is due interval_s after this one
                wait = max(0.0, last_full + self.config.interval_s - t0)
            sleep(max(0.0, wait - (clock() - t0)))


def _in_transition(rec: JobRecord) -> bool:
    """A job whose reports move its state machine: starting, stopping, or running but not
    yet reported its start (it cannot be signalled before)."""
    return rec.phase in ("starting", "stopping") or (rec.phase == "running" and not rec.ready)
