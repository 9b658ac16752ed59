"""A pool of several GPU types, as the policies see it: one view and one table of
estimates per type.

Each type's view (:func:`type_views`) is the snapshot restricted to that type's nodes: a job
that runs on the type keeps its placement there, any other job is shown queued (it would
restart to move). Its step-time profile on the type is what it measured there. A job whose
application never ran on the type is given, instead, its measurements on the other types
with their compute scaled by the types' relative speed, as Sia (SOSP'23) bootstraps a
job's model on a type from one measurement: the all-reduce, over the same network, is kept.

The relative speeds (:func:`type_speeds`) are learned from the applications measured on two
or more types, running or completed: each (application, type) pair's compute time per
micro-step at a per-GPU batch measured on (or near) both types, fitted as ``log time = c_app -
log speed_type`` by alternating means. A type no application has been compared on counts as
the others' mean speed until one is. Once a job runs on a type it is modelled on what it
measured there; its convergence model (noise, epochs) is the same on every type.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from hpcorch.model.throughput import Network, ThroughputModel
from hpcorch.policy.estimate import Estimates, estimate
from hpcorch.policy.lengths import PLAIN, Departed, Prior
from hpcorch.policy.pooling import model_keys
from hpcorch.policy.types import CompletedJob, JobView, Snapshot, StepSample


@dataclass(frozen=True)
class TypedEstimates:
    """Estimates of every job on every GPU type of the pool."""

    types: tuple[str, ...]
    """The pool's GPU types, sorted."""
    est: tuple[Estimates, ...]
    """One per type; rows are the snapshot's jobs in order. ``est[t].time[j, g]``: job
    ``j``'s remaining seconds on ``g`` GPUs of type ``t`` (inf where infeasible)."""
    nodes: tuple[tuple[int, ...], ...]
    """Global node indices of each type's nodes (the views' node ``k`` is ``nodes[t][k]``)."""
    views: tuple[Snapshot, ...]
    """The snapshot as seen on each type (:func:`type_views`)."""
    accepts: np.ndarray
    """(jobs, types) bool: the job accepts the type."""
    speed: dict[str, float]
    """Relative speed of each type (geometric mean 1 over the types compared)."""


MEMORY_APPS = 512
"""Applications whose per-type compute times a policy remembers after they left."""


def type_speeds(
    jobs: Sequence[JobView],
    history: Sequence[CompletedJob],
    types: Sequence[str],
    memory: dict[str, dict[str, float]] | None = None,
) -> dict[str, float]:
    """Relative speed of every type in ``types`` from the applications measured on several.
    ``memory``: what earlier calls saw (application -> type -> log compute time), updated
    in place: a policy that keeps it goes on knowing the types' speeds once the jobs that
    showed them have finished (and when completed jobs are not shown to it)."""
    by_pair: dict[tuple[str, str], list[StepSample]] = defaultdict(list)
    for app, profile in _profiles(jobs, history):
        for s in profile:
            if s.gpu_type in types:
                by_pair[(app, s.gpu_type)].append(s)
    per_app: dict[str, dict[str, list[StepSample]]] = defaultdict(dict)
    for (app, t), samples in by_pair.items():
        per_app[app][t] = samples
    y: dict[str, dict[str, float]] = {}
    for app, on in per_app.items():
        if len(on) < 2:
            continue
        row = _compared(on)
        if len(row) >= 2:
            y[app] = row
    if memory is not None:
        for app, row in y.items():
            memory.pop(app, None)
            memory[app] = row  # the newest last
        while len(memory) > MEMORY_APPS:
            memory.pop(next(iter(memory)))
        y = dict(memory)
    lam = dict.fromkeys(types, 0.0)
    y = {a: {t: v for t, v in row.items() if t in lam} for a, row in y.items()}
    y = {a: row for a, row in y.items() if len(row) >= 2}
    seen = sorted({t for row in y.values() for t in row})
    for _ in range(20 if y else 0):
        c = {a: float(np.mean([v + lam[t] for t, v in row.items()])) for a, row in y.items()}
        for t in seen:
            vals = [c[a] - row[t] for a, row in y.items() if t in row]
            lam[t] = float(np.mean(vals))
        mean = float(np.mean([lam[t] for t in seen]))
        for t in seen:
            lam[t] -= mean
    return {t: math.exp(lam[t]) for t in types}


REACH = 2.0
"""A type's compute time is compared at a per-GPU batch at most this factor outside the
per-GPU batches it was measured at (further, the throughput model extrapolates)."""


def _compared(on: Mapping[str, Sequence[StepSample]]) -> dict[str, float]:
    """Log compute time per micro-step of one application on each of its types, at one
    per-GPU batch that the most types measured near (within ``REACH``); the types measured
    only far from it are left out. A cold job measures a tiny per-GPU batch on its first
    type and its best one on the next: compared at one of them, the other type's time is an
    extrapolation that can be off by several times (an A100 "slower" than a T4)."""
    ranges = {
        t: (min(s.micro_batch for s in ss), max(s.micro_batch for s in ss)) for t, ss in on.items()
    }
    batches = sorted({s.micro_batch for ss in on.values() for s in ss})

    def near(b: int) -> list[str]:
        return [t for t, (lo, hi) in ranges.items() if lo / REACH <= b <= hi * REACH]

    middle = float(np.median(batches))
    micro = max(batches, key=lambda b: (len(near(b)), -abs(math.log(b / middle))))
    return {
        t: math.log(float(ThroughputModel(on[t]).compute(np.array([float(micro)]))[0]))
        for t in near(micro)
    }


def _profiles(
    jobs: Sequence[JobView], history: Sequence[CompletedJob]
) -> list[tuple[str, tuple[StepSample, ...]]]:
    return [(h.application, h.profile) for h in history] + [
        (j.application, j.profile) for j in jobs
    ]


def _bootstrap(
    profile: Sequence[StepSample], t: str, speed: Mapping[str, float]
) -> tuple[StepSample, ...]:
    """``profile``'s samples on other types as they would be on ``t``: compute scaled by
    the speed ratio, the rest of each step as measured."""
    others = [s for s in profile if s.gpu_type and s.gpu_type != t and s.gpu_type in speed]
    if not others:
        return ()
    out = []
    by_type: dict[str, list[StepSample]] = defaultdict(list)
    for s in others:
        by_type[s.gpu_type].append(s)
    for src, ss in by_type.items():
        ratio = speed[src] / speed[t]
        model = ThroughputModel(ss)
        comp = model.compute(np.array([float(s.micro_batch) for s in ss]))
        for s, c in zip(ss, comp, strict=True):
            part = min(float(c) * max(1, s.accum_steps), s.step_time)
            step = s.step_time - part + part * ratio
            sync = min(s.sync_time, step) if s.sync_time > 0 else 0.0
            out.append(replace(s, step_time=step, sync_time=sync, gpu_type=t))
    return tuple(out)


def _on_type(
    app: str,
    profile: Sequence[StepSample],
    t: str,
    measured: set[str],
    speed: Mapping[str, float],
) -> tuple[StepSample, ...]:
    """A profile as seen on type ``t``: its samples there; those of its other types
    bootstrapped onto ``t`` where its application never ran on ``t``."""
    own = tuple(s for s in profile if s.gpu_type == t)
    return own if app in measured else own + _bootstrap(profile, t, speed)


def type_nodes(snapshot: Snapshot, t: str) -> tuple[int, ...]:
    """Global indices of the pool's nodes of type ``t``."""
    return tuple(i for i, nt in enumerate(snapshot.node_types) if nt == t)


def on_nodes(
    j: JobView, local: Mapping[int, int], gpu_type: str, profile: tuple[StepSample, ...]
) -> JobView:
    """``j`` as a view of the nodes ``local`` (global -> local index) sees it: where it runs
    there, its placement on them (and ``gpu_type``); else queued. Its step times:
    ``profile``."""
    here = bool(j.gpus > 0 and j.placement and all(n in local for n in j.placement))
    return replace(
        j,
        profile=profile,
        gpus=j.gpus if here else 0,
        placement={local[n]: c for n, c in j.placement.items()} if here else {},
        cpus_per_gpu=j.cpus_per_gpu if here else 0,
        gpu_type=gpu_type if here else "",
    )


def sub_pool(
    snapshot: Snapshot,
    idx: Sequence[int],
    jobs: tuple[JobView, ...],
    history: tuple[CompletedJob, ...],
) -> Snapshot:
    """The pool of the nodes ``idx`` alone, one type, with ``jobs`` and ``history``."""
    cpus = tuple(snapshot.node_cpus[i] for i in idx) if snapshot.manages_cpus else ()
    return replace(
        snapshot,
        node_gpus=tuple(snapshot.node_gpus[i] for i in idx),
        node_cpus=cpus,
        node_types=(),
        jobs=jobs,
        history=history,
    )


def type_views(snapshot: Snapshot, speed: Mapping[str, float]) -> tuple[Snapshot, ...]:
    """The snapshot as seen on each of its GPU types (see the module's docstring)."""
    apps_on: dict[str, set[str]] = defaultdict(set)
    for app, profile in _profiles(snapshot.jobs, snapshot.history):
        for s in profile:
            apps_on[s.gpu_type].add(app)
    views = []
    for t in snapshot.gpu_types:
        idx = type_nodes(snapshot, t)
        local = {g: k for k, g in enumerate(idx)}
        seen = apps_on.get(t, set())
        jobs = tuple(
            on_nodes(j, local, t, _on_type(j.application, j.profile, t, seen, speed))
            for j in snapshot.jobs
        )
        history = tuple(
            replace(h, profile=_on_type(h.application, h.profile, t, seen, speed))
            for h in snapshot.history
        )
        views.append(sub_pool(snapshot, idx, jobs, history))
    return tuple(views)


def type_estimates(
    snapshot: Snapshot,
    *,
    explore: float = 4.0,
    gpu_cap: int = 64,
    first_gpus: int = 0,
    first_asked: bool = False,
    network: Network | None = None,
    memory: dict[str, dict[str, float]] | None = None,
    departed: Departed | None = None,
    done: Mapping[str, float] | None = None,
    prior: Prior = PLAIN,
) -> TypedEstimates:
    """:func:`hpcorch.policy.estimate.estimate` on every type's view. ``first_gpus``: the
    cap of a never-measured application (0: one node of the type); ``first_asked``: as
    :func:`hpcorch.policy.estimate.estimate`'s. ``memory``: see
    :func:`type_speeds`. ``departed``, ``done``, ``prior``: as
    :func:`hpcorch.policy.estimate.estimate`'s
    (work counted on one GPU of speed 1).

    A job measured on no type at all is modelled as a typical job on every type (the
    throughput model's prior), sped up by each type's relative speed."""
    types = snapshot.gpu_types
    speed = type_speeds(snapshot.jobs, snapshot.history, types, memory)
    views = type_views(snapshot, speed)
    nodes = tuple(type_nodes(snapshot, t) for t in types)
    # one set of pooling keys for every type: a job's group does not depend on the type
    # it is seen on (checked on the type with the most measurements)
    most = max(views, key=lambda v: sum(len(j.profile) for j in v.jobs))
    keys = model_keys(most.jobs, most.history, snapshot.pool_across_owners)
    est: list[Estimates] = []
    for view in views:
        e = estimate(
            view,
            explore=explore,
            gpu_cap=gpu_cap,
            first_gpus=first_gpus or max(view.node_gpus, default=1),
            first_asked=first_asked,
            network=network,
            keys=keys,
            departed=departed,
            done=done,
            speed=speed[types[len(est)]],
            prior=prior,
        )
        network = network or e.network
        # a job of unknown length was scaled to its inferred work at this type's speed
        new = [
            i
            for i, j in enumerate(view.jobs)
            if j.length_known and not any(s.gpu_type for s in snapshot.jobs[i].profile)
        ]
        e.time[new] /= speed[types[len(est)]]
        est.append(e)
    accepts = np.array(
        [[not j.gpu_types or t in j.gpu_types for t in types] for j in snapshot.jobs],
        dtype=bool,
    ).reshape(len(snapshot.jobs), len(types))
    return TypedEstimates(types, tuple(est), nodes, views, accepts, speed)
