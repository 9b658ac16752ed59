"""From what the controller knows to what a policy sees. Pure.

Only what jobs report reaches the policy: step times at the configurations they ran,
epoch progress and the gradient noise scale, their bounds, and the history of finished
jobs. Jobs in the middle of a transition (starting, stopping) are shown holding the GPUs
they are moving to or from, so the policy does not hand those GPUs out twice.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np

from hpcorch.cluster import PoolNode
from hpcorch.controller.identity import model_key
from hpcorch.controller.store import JobRecord, Sample
from hpcorch.planner import BatchPlanError, plan_batch
from hpcorch.policy.types import CompletedJob, CpuSample, JobView, Snapshot, StepSample


def profile_of(samples: Sequence[Sample]) -> tuple[StepSample, ...]:
    """Median seconds per micro-step at each (nodes, GPUs, micro-batch) a job ran."""
    groups: dict[tuple[int, int, int], list[float]] = defaultdict(list)
    for s in samples:
        if s.step_time > 0 and s.gpus > 0 and s.micro_batch > 0:
            groups[(s.nodes, s.gpus, s.micro_batch)].append(s.step_time / max(1, s.accum_steps))
    return tuple(
        StepSample(nodes=n, gpus=g, micro_batch=m, step_time=float(np.median(t)), sync_time=0.0)
        for (n, g, m), t in sorted(groups.items())
    )


def cpu_profile_of(samples: Sequence[Sample]) -> tuple[CpuSample, ...]:
    """Median seconds per micro-step (and input wait) at each CPUs-per-GPU count a job ran."""
    groups: dict[tuple[int, int, int], list[tuple[float, float | None]]] = defaultdict(list)
    for s in samples:
        if s.cpus_per_gpu > 0 and s.step_time > 0 and s.gpus > 0 and s.micro_batch > 0:
            accum = max(1, s.accum_steps)
            wait = s.data_wait / accum if s.data_wait is not None else None
            groups[(s.cpus_per_gpu, s.gpus, s.micro_batch)].append((s.step_time / accum, wait))
    out = []
    for (c, g, m), rows in sorted(groups.items()):
        waits = [w for _, w in rows if w is not None]
        out.append(
            CpuSample(
                cpus_per_gpu=c,
                gpus=g,
                micro_batch=m,
                step_time=float(np.median([t for t, _ in rows])),
                data_wait=float(np.median(waits)) if waits else None,
            )
        )
    return tuple(out)


def noise_stats(samples: Sequence[Sample], init_batch: int) -> tuple[float, float] | None:
    """(grad_sqr, grad_var) with grad_var / grad_sqr * init_batch = the noise scale."""
    values = [s.noise_scale for s in samples[-20:] if s.noise_scale and s.noise_scale > 0]
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


def job_view(
    rec: JobRecord,
    samples: Sequence[Sample],
    pool_index: Mapping[str, int],
    pool_gpus: int,
    pin: int | None = None,
    request: tuple[int, int] | None = None,
    down: frozenset[int] = frozenset(),
) -> JobView:
    """``request``: the GPUs and global batch the user asked for (default: the minimum
    GPUs and the initial batch), which the policies that honour requests give it."""
    lo, hi = min(rec.min_gpus, pool_gpus), min(rec.max_gpus, pool_gpus)
    if pin is not None:
        lo = hi = max(1, min(pin, pool_gpus))
    req_gpus, req_batch = request or (0, 0)
    req_gpus = min(max(req_gpus, lo), max(hi, lo))
    if rec.phase in ("starting",):
        gpus, placement = rec.target_gpus, rec.placement()
    elif rec.phase in ("running", "stopping"):
        gpus, placement = rec.gpus, placement_of(rec, pool_index)
    else:
        gpus, placement = 0, {}
    if sum(placement.values()) != gpus or set(placement) & down:
        gpus, placement = 0, {}  # unknown, or on a failed node: Slurm requeues it
    if gpus and not rec.movable:  # it keeps what it has, whatever its bounds say now
        lo, hi = min(lo, gpus), max(hi, gpus)
    micro, accum = rec.micro_batch, max(1, rec.accum_steps)
    if gpus and (not micro or rec.phase == "starting"):  # the split its launch will use
        try:
            split = plan_batch(max(rec.target_batch or rec.batch, gpus), gpus, rec.max_micro)
            micro, accum = split.micro_batch, split.accum_steps
        except BatchPlanError:
            pass
    stats = noise_stats(samples, rec.batch)
    steps_per_epoch = rec.steps_per_epoch or 1.0
    epochs = rec.epochs or rec.epoch + 1
    return JobView(
        job_id=str(rec.slurm_id),
        application=model_key(rec.user, rec.app, rec.fingerprint, rec.slurm_id),
        submit_time=rec.submit_time,
        requested_gpus=req_gpus,
        requested_batch=req_batch or rec.batch,
        min_gpus=lo,
        max_gpus=max(hi, lo),
        min_batch=rec.batch,
        max_batch=max(rec.max_batch, rec.batch),
        min_micro_batch=1,
        max_micro_batch=max(1, rec.max_micro),
        max_epochs=epochs,
        progress_per_epoch_hint=steps_per_epoch,
        gpus=gpus,
        placement=placement,
        batch=rec.global_batch or rec.batch,
        micro_batch=micro,
        accum_steps=accum,
        epoch=rec.epoch,
        progress=rec.progress,
        grad_sqr=stats[0] if stats else None,
        grad_var=stats[1] if stats else None,
        attained_service=rec.gpu_seconds,
        run_time=rec.run_seconds,
        restarts=max(0, rec.launches - 1),
        profile=profile_of(samples),
        model_bytes=rec.model_bytes,
        predictable=bool(rec.predictable),
        resizable=rec.movable,
        cpus_per_gpu=rec.cpus_per_gpu if gpus else 0,
        min_cpus_per_gpu=rec.min_cpus,
        cpu_profile=cpu_profile_of(samples),
    )


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
    return CompletedJob(
        job_id=str(rec.slurm_id),
        application=model_key(rec.user, rec.app, rec.fingerprint, rec.slurm_id),
        jct=max(0.0, rec.finished_at - rec.submit_time),
        gpu_seconds=rec.gpu_seconds,
        progress=rec.progress,
        epochs=rec.epochs or rec.epoch,
        profile=profile_of(samples),
        model_bytes=rec.model_bytes,
    )


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
) -> Snapshot:
    pool_index = {n.name: i for i, n in enumerate(nodes)}
    node_gpus = tuple(n.gpus if n.usable else 0 for n in nodes)
    # CPUs are planned only where every node's count is known
    node_cpus = tuple(n.cpus if n.usable else 0 for n in nodes)
    if not nodes or any(n.cpus <= 0 for n in nodes):
        node_cpus = ()
    total = sum(node_gpus)
    down = frozenset(i for i, n in enumerate(nodes) if not n.usable)
    req = requests or {}
    weights = job_weights(records, fair_shares or {})
    views = tuple(
        replace(
            job_view(
                r,
                samples.get(r.slurm_id, ()),
                pool_index,
                total,
                pins.get(r.slurm_id),
                req.get(r.slurm_id),
                down,
            ),
            weight=weights[r.slurm_id],
        )
        for r in records
        if r.active
    )
    return Snapshot(
        now=now,
        node_gpus=node_gpus,
        node_cpus=node_cpus,
        jobs=views,
        history=tuple(history),
        round_s=round_s,
        restart_cost_s=restart_cost_s,
    )
