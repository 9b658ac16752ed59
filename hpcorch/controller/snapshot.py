"""From what the controller knows to what a policy sees. Pure.

Only what jobs report reaches the policy: step times at the configurations they ran,
epoch progress and the gradient noise scale, their bounds, and the history of finished
jobs the store holds. A running job is shown where Slurm runs it. A job in the middle of a
transition is shown fixed (not resizable) on the GPUs it is moving to, which its launch
names exactly: a starting job on its planned placement, a job stopping to be resized on its
target (or queued, when it is being preempted). So is a running job that cannot be
stopped yet (still starting up, or trained less than its
restart cost: :func:`hpcorch.controller.reconcile.can_stop`), so the policy plans around it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import replace
from statistics import median

import numpy as np

from hpcorch.cluster import PoolNode
from hpcorch.controller.identity import model_key
from hpcorch.controller.reconcile import Settings, can_stop, target_shape
from hpcorch.controller.store import JobRecord, Sample
from hpcorch.gputypes import TAG_SEP, joined
from hpcorch.planner import BatchPlanError, plan_batch
from hpcorch.policy.types import (
    CompletedJob,
    CpuSample,
    JobPlan,
    JobView,
    Snapshot,
    StepSample,
)

PROFILE_WINDOW = 200
"""A configuration's step time is the median of its last this many measurements."""


class _Groups:
    """A job's measurements grouped by configuration, added to as the job reports."""

    def __init__(self) -> None:
        self.seen = 0
        self.last: Sample | None = None
        """The last sample added: a list it is no longer at ``seen - 1`` in was thinned."""
        self.steps: dict[tuple[int, int, int, int, str], list[float]] = defaultdict(list)
        self.cpus: dict[tuple[int, int, int], list[tuple[float, float | None]]] = defaultdict(list)
        self.value: tuple[tuple[StepSample, ...], tuple[CpuSample, ...]] | None = None

    def add(self, samples: Sequence[Sample]) -> None:
        for s in samples:
            if s.step_time <= 0 or s.gpus <= 0 or s.micro_batch <= 0:
                continue
            accum = max(1, s.accum_steps)
            times = self.steps[(s.nodes, s.gpus, s.micro_batch, accum, s.gpu_type)]
            times.append(s.step_time)
            del times[:-PROFILE_WINDOW]
            if s.cpus_per_gpu > 0:
                wait = s.data_wait / accum if s.data_wait is not None else None
                rows = self.cpus[(s.cpus_per_gpu, s.gpus, s.micro_batch)]
                rows.append((s.step_time / accum, wait))
                del rows[:-PROFILE_WINDOW]
        self.seen += len(samples)
        if samples:
            self.last = samples[-1]
        self.value = None

    def profiles(self) -> tuple[tuple[StepSample, ...], tuple[CpuSample, ...]]:
        if self.value is None:
            steps = tuple(
                StepSample(
                    nodes=n, gpus=g, micro_batch=m, step_time=median(t), sync_time=0.0,
                    accum_steps=k, gpu_type=kind,
                )
                for (n, g, m, k, kind), t in sorted(self.steps.items())
            )  # fmt: skip
            cpus = []
            for (c, g, m), rows in sorted(self.cpus.items()):
                waits = [w for _, w in rows if w is not None]
                cpus.append(
                    CpuSample(
                        cpus_per_gpu=c,
                        gpus=g,
                        micro_batch=m,
                        step_time=median([t for t, _ in rows]),
                        data_wait=median(waits) if waits else None,
                    )
                )
            self.value = (steps, tuple(cpus))
        return self.value


def profile_of(samples: Sequence[Sample]) -> tuple[StepSample, ...]:
    """Median seconds per optimizer step at each (nodes, GPUs, micro-batch, accumulation,
    GPU type) a job ran (its last ``PROFILE_WINDOW`` measurements of each)."""
    g = _Groups()
    g.add(samples)
    return g.profiles()[0]


def cpu_profile_of(samples: Sequence[Sample]) -> tuple[CpuSample, ...]:
    """Median seconds per micro-step (and input wait) at each CPUs-per-GPU count a job ran."""
    g = _Groups()
    g.add(samples)
    return g.profiles()[1]


class Profiles:
    """Each job's step-time and CPU profiles, kept up to date with what it reports (a
    round would otherwise take the medians of every job's samples again)."""

    def __init__(self) -> None:
        self._jobs: dict[int, _Groups] = {}

    def of(
        self, slurm_id: int, samples: Sequence[Sample]
    ) -> tuple[tuple[StepSample, ...], tuple[CpuSample, ...]]:
        """``samples``: the job's samples so far, oldest first, as the controller keeps
        them (added to at the end; thinned or read again: taken afresh)."""
        g = self._jobs.get(slurm_id)
        if g is None or g.seen > len(samples) or (g.seen and samples[g.seen - 1] is not g.last):
            g = self._jobs[slurm_id] = _Groups()
        if g.seen < len(samples):
            g.add(samples[g.seen :])
        return g.profiles()

    def forget(self, slurm_id: int) -> None:
        self._jobs.pop(slurm_id, None)


NOISE_WINDOW_S = 120.0
"""The gradient noise scale shown is the median of what the job reported this long before
its last report: recent enough to follow the noise as it grows epoch by epoch."""


def noise_stats(samples: Sequence[Sample], init_batch: int) -> tuple[float, float] | None:
    """(grad_sqr, grad_var) with grad_var / grad_sqr * init_batch = the noise scale."""
    if not samples:
        return None
    since = samples[-1].time - NOISE_WINDOW_S
    values = [
        s.noise_scale
        for s in samples[-50:]
        if s.time >= since and s.noise_scale is not None and s.noise_scale > 0
    ]
    if not values:
        return None
    return 1.0, float(np.median(values)) / max(1, init_batch)


def placement_of(rec: JobRecord, pool_index: Mapping[str, int]) -> dict[int, int]:
    """Where the job runs, as Slurm reports it: {node index: GPUs}, in rank order."""
    names = [n for n in rec.node_list.split(",") if n]
    if not names or not rec.gpus:
        return {}
    counts = [int(c) for c in rec.node_gpus.split(",") if c.isdigit()]
    if len(counts) != len(names):
        counts = [rec.gpus // len(names)] * len(names)
    return {pool_index[n]: c for n, c in zip(names, counts, strict=True) if n in pool_index}


def _moving_to(rec: JobRecord, pool_names: Sequence[str]) -> dict[int, int]:
    """The placement a transition moves the job to, if its launch names it exactly."""
    if rec.target_gpus <= 0:
        return {}
    shape = target_shape(rec, tuple(pool_names))
    if not shape.per_node or shape.gpus != rec.target_gpus:
        return {}
    return rec.placement()


def job_view(
    rec: JobRecord,
    samples: Sequence[Sample],
    pool_index: Mapping[str, int],
    pool_gpus: int,
    pin: int | None = None,
    request: tuple[int, int] | None = None,
    down: frozenset[int] = frozenset(),
    now: float = 0.0,
    settings: Settings | None = None,
    restart_cost_s: float = 0.0,
    profiles: Profiles | None = None,
    node_types: Sequence[str] = (),
    moving: bool = False,
) -> JobView:
    """``node_types``: the GPU type of each pool node, in a pool of several types (else
    ()): the job is shown on the type of its placement, Slurm's (``rec.gpu_type``) for a
    running job. ``request``: the GPUs and global batch the user asked for (default: the minimum
    GPUs and the initial batch), which the policies that honour requests give it.
    ``settings`` (with ``now`` and ``restart_cost_s``): the controller's rules for when a
    running job may be stopped; without them every running job is shown resizable."""
    lo, hi = min(rec.min_gpus, pool_gpus), min(rec.max_gpus, pool_gpus)
    if pin is not None:
        lo = hi = max(1, min(pin, pool_gpus))
    req_gpus, req_batch = request or (0, 0)
    req_gpus = min(max(req_gpus, lo), max(hi, lo))
    movable = rec.movable
    if rec.phase in ("starting", "stopping"):
        gpus, placement = rec.target_gpus, _moving_to(rec, list(pool_index))
        movable = False  # the controller acts on it again once the transition is over
    elif rec.phase == "running":
        gpus, placement = rec.gpus, placement_of(rec, pool_index)
        if settings is not None and not can_stop(rec, now, settings, restart_cost_s):
            movable = False
    else:
        gpus, placement = 0, {}
    if sum(placement.values()) != gpus or set(placement) & down or moving:
        # unknown, on a failed node (Slurm requeues it), or leaving its node: placed afresh
        gpus, placement = 0, {}
    kind = ""
    if node_types and placement:
        kind = joined(node_types[n] for n in placement if 0 <= n < len(node_types))
        if rec.phase == "running" and rec.gpu_type:
            kind = rec.gpu_type
    if gpus and not movable:  # it keeps what it has, whatever its bounds say now
        lo, hi = min(lo, gpus), max(hi, gpus)
    micro, accum = rec.micro_batch, max(1, rec.accum_steps)
    batch = rec.global_batch or rec.batch
    # the split its launch will use; also for a job that reports a split outside its
    # bounds (its script writes its lines), which a plan that keeps it could not honour
    if gpus and (not micro or rec.phase != "running" or micro > max(1, rec.max_micro)):
        try:
            split = plan_batch(max(rec.target_batch or rec.batch, gpus), gpus, rec.max_micro)
            micro, accum, batch = split.micro_batch, split.accum_steps, split.global_batch
        except BatchPlanError:
            pass
    stats = noise_stats(samples, rec.batch)
    if profiles is not None:
        profile, cpu_profile = profiles.of(rec.slurm_id, samples)
    else:
        profile, cpu_profile = profile_of(samples), cpu_profile_of(samples)
    steps_per_epoch = rec.steps_per_epoch or 1.0
    epochs = rec.epochs or rec.epoch + 1
    return JobView(
        job_id=str(rec.slurm_id),
        application=model_key(rec.user, rec.app, rec.fingerprint, rec.slurm_id),
        submit_time=rec.submit_time,
        requested_gpus=req_gpus,
        gpus_asked=bool(request and request[0]),
        requested_batch=req_batch or rec.batch,
        min_gpus=lo,
        max_gpus=max(hi, lo),
        min_batch=rec.batch,
        max_batch=max(rec.max_batch, rec.batch),
        min_micro_batch=1,
        max_micro_batch=max(1, rec.max_micro),
        max_epochs=epochs,
        progress_per_epoch_hint=steps_per_epoch,
        length_known=rec.epochs > 0 and rec.steps_per_epoch > 0,
        gpus=gpus,
        placement=placement,
        batch=batch,
        micro_batch=micro,
        accum_steps=accum,
        epoch=rec.epoch,
        progress=rec.progress,
        grad_sqr=stats[0] if stats else None,
        grad_var=stats[1] if stats else None,
        attained_service=rec.gpu_seconds,
        run_time=max(rec.run_total_s, rec.run_seconds),
        restarts=max(0, rec.launches - 1),
        profile=profile,
        model_bytes=rec.model_bytes,
        predictable=bool(rec.predictable),
        resizable=movable,
        rebatch=rec.mode != "sidecar",
        cpus_per_gpu=rec.cpus_per_gpu if gpus else 0,
        min_cpus_per_gpu=rec.min_cpus,
        cpu_profile=cpu_profile,
        gpu_type=kind,
        gpu_types=rec.accepted_types(),
    )


def noise_history(
    samples: Sequence[Sample], init_batch: int, epochs: int
) -> tuple[tuple[float, float], ...]:
    """(grad_sqr, grad_var) per epoch from the noise scale the job reported in it (the
    median); epochs it reported nothing in are interpolated between their neighbours."""
    by_epoch: dict[int, list[float]] = defaultdict(list)
    for s in samples:
        if s.noise_scale is not None and s.noise_scale > 0 and s.epoch >= 0:
            by_epoch[s.epoch].append(s.noise_scale)
    if not by_epoch:
        return ()
    known = sorted(by_epoch)
    noise = [float(np.median(by_epoch[e])) for e in known]
    ratio = np.interp(np.arange(max(epochs, known[-1] + 1)), known, noise) / max(1, init_batch)
    return tuple((1.0, float(r)) for r in ratio)


MIN_SHARE = 0.05
"""A user with a FairShare factor of 0 (used far more than their share) still counts this
much, so that their jobs are ordered last but not starved."""


def job_weights(records: Sequence[JobRecord], shares: Mapping[str, float]) -> dict[int, float]:
    """Each active job's ``JobView.weight``: its user's fair share (``shares``, 1 for a
    user not listed) split evenly over the user's active jobs, scaled to mean 1. One user
    with ten jobs then weighs as much as another with one."""
    active = [r for r in records if r.active]
    per_user: dict[str, int] = defaultdict(int)
    for r in active:
        per_user[r.user] += 1
    raw = {
        r.slurm_id: max(MIN_SHARE, min(1.0, shares.get(r.user, 1.0))) / per_user[r.user]
        for r in active
    }
    if not raw:
        return {}
    lo, hi = min(raw.values()), max(raw.values())
    if hi - lo <= 1e-12 * hi:
        return dict.fromkeys(raw, 1.0)  # everyone counts the same: exactly 1
    mean = sum(raw.values()) / len(raw)
    return {k: v / mean for k, v in raw.items()}


def completed(rec: JobRecord, samples: Sequence[Sample]) -> CompletedJob:
    epochs = rec.epochs or rec.epoch
    return CompletedJob(
        job_id=str(rec.slurm_id),
        application=model_key(rec.user, rec.app, rec.fingerprint, rec.slurm_id),
        jct=max(0.0, rec.finished_at - rec.submit_time),
        gpu_seconds=rec.gpu_seconds,
        progress=rec.progress,
        epochs=epochs,
        profile=profile_of(samples),
        grad_history=noise_history(samples, rec.batch, epochs),
        model_bytes=rec.model_bytes,
    )


def planned_type(snapshot: Snapshot, plan: JobPlan | None) -> str:
    """The GPU type a plan's launch requests: the policy's, else its nodes' (every
    policy's launch on a pool of several types asks for the type of where it goes)."""
    if plan is None:
        return ""
    kind = plan.gpu_type or snapshot.type_of(plan.placement)
    return "" if TAG_SEP in kind else kind  # a launch the site lets mix types asks for any


def _weighted(view: JobView, weight: float) -> JobView:
    return view if weight == view.weight else replace(view, weight=weight)


def fit_transitions(
    views: Sequence[JobView], moving: Collection[str], node_gpus: Sequence[int]
) -> tuple[JobView, ...]:
    """The views with every start's or stop's planned placement that no longer fits
    beside what runs (Slurm placed a job otherwise than planned) shown unplaced: the
    policy is given a pool it can plan, never more GPUs on a node than it has."""
    used = [0] * len(node_gpus)
    for v in views:
        if v.job_id not in moving:
            for node, n in v.placement.items():
                if 0 <= node < len(used):
                    used[node] += n
    out = []
    for v in views:
        if v.job_id in moving and v.placement:
            if any(
                not 0 <= node < len(used) or used[node] + n > node_gpus[node]
                for node, n in v.placement.items()
            ):
                v = replace(v, gpus=0, placement={})
            else:
                for node, n in v.placement.items():
                    used[node] += n
        out.append(v)
    return tuple(out)


def build_snapshot(
    now: float,
    nodes: Sequence[PoolNode],
    records: Sequence[JobRecord],
    samples: Mapping[int, Sequence[Sample]],
    history: Sequence[CompletedJob],
    pins: Mapping[int, int],
    round_s: float,
    restart_cost_s: float,
    requests: Mapping[int, tuple[int, int]] | None = None,
    fair_shares: Mapping[str, float] | None = None,
    settings: Settings | None = None,
    profiles: Profiles | None = None,
    mix_types: bool = False,
    moving: Collection[int] = (),
) -> Snapshot:
    """``mix_types``: the site lets one launch span nodes of several GPU types.
    ``moving``: running jobs that leave their nodes now (availability.py): shown as if
    queued, to be placed afresh."""
    pool_index = {n.name: i for i, n in enumerate(nodes)}
    # what jobs the controller did not place hold is never planned as free
    node_gpus = tuple(max(0, n.gpus - n.gpus_foreign) if n.usable else 0 for n in nodes)
    # CPUs are planned only where every node's count is known
    node_cpus = tuple(max(0, n.cpus - n.cpus_foreign) if n.usable else 0 for n in nodes)
    if not nodes or any(n.cpus <= 0 for n in nodes):
        node_cpus = ()
    # GPU types are planned only where every node's is known
    node_types = tuple(n.gpu_type for n in nodes)
    if not all(node_types):
        node_types = ()
    typed = node_types if len(set(node_types)) > 1 else ()
    total = sum(node_gpus)
    down = frozenset(i for i, n in enumerate(nodes) if not n.usable)
    gone = frozenset(moving)
    req = requests or {}
    weights = job_weights(records, fair_shares or {})
    views = tuple(
        _weighted(
            job_view(
                r,
                samples.get(r.slurm_id, ()),
                pool_index,
                total,
                pins.get(r.slurm_id),
                req.get(r.slurm_id),
                down,
                now,
                settings,
                restart_cost_s,
                profiles,
                typed,
                r.slurm_id in gone,
            ),
            weights[r.slurm_id],
        )
        for r in records
        if r.active
    )
    moving_ids = {str(r.slurm_id) for r in records if r.phase in ("starting", "stopping")}
    views = fit_transitions(views, moving_ids, node_gpus)
    return Snapshot(
        now=now,
        node_gpus=node_gpus,
        node_cpus=node_cpus,
        node_types=node_types,
        mix_types=mix_types,
        jobs=views,
        history=tuple(history),
        round_s=round_s,
        restart_cost_s=restart_cost_s,
    )
