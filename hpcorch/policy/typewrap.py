"""A policy that does not know GPU types, on a pool of several: two ways to run it.

* :class:`PerType`: one pool per type, as sites run mixed clusters today. Each job is
  assigned a type once, when the policy first sees it: the one type it accepts, else (a user
  who picks a partition) a weighted round-robin over the types it accepts in proportion to
  their GPUs, by arrival. An instance of the policy per type schedules that type's jobs on
  that type's nodes; a job never changes type. Where the site lets a launch span types
  (``Snapshot.mix_types``), the policy schedules the pool as one instead.
* :class:`TypeBlind`: the policy is shown one pool whose GPUs are all alike (no types, every
  measurement as if of one type); its launches may span types, where they run at the
  slowest type's speed. Only where the site lets a launch mix types
  (``Snapshot.mix_types``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from hpcorch.policy.typed import on_nodes, sub_pool, type_nodes
from hpcorch.policy.types import JobPlan, Plan, Policy, Snapshot


@dataclass
class PerType:
    """``make()``'s policy, one instance per GPU type, each on its own type's nodes."""

    make: Callable[[], Policy]
    name: str = ""
    _inner: dict[str, Policy] = field(default_factory=dict)
    _assigned: dict[str, str] = field(default_factory=dict)
    _counts: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = self.name or f"{self.make().name}-per-type"

    @property
    def sees_fixed(self) -> bool:
        """As the wrapped policy (see :func:`hpcorch.policy.split.split_schedule`)."""
        return bool(getattr(self.make(), "sees_fixed", False))

    def _of(self, t: str) -> Policy:
        if t not in self._inner:
            self._inner[t] = self.make()
        return self._inner[t]

    def _assign(self, snapshot: Snapshot) -> None:
        types = snapshot.gpu_types
        gpus = {t: 0 for t in types}
        for g, t in zip(snapshot.node_gpus, snapshot.node_types, strict=True):
            gpus[t] += g
        here = {j.job_id for j in snapshot.jobs}
        self._assigned = {k: v for k, v in self._assigned.items() if k in here}
        for j in sorted(snapshot.jobs, key=lambda j: (j.submit_time, j.job_id)):
            if j.job_id in self._assigned and self._assigned[j.job_id] in types:
                continue
            if j.gpu_type in types:  # already running somewhere: it stays
                self._assigned[j.job_id] = j.gpu_type
                continue
            ok = [t for t in types if not j.gpu_types or t in j.gpu_types] or list(types)
            # the type furthest below its share of the jobs assigned so far
            total = sum(self._counts.get(t, 0) for t in ok) + 1
            pick = max(ok, key=lambda t: (gpus[t] / max(1, sum(gpus[u] for u in ok)))
                       - self._counts.get(t, 0) / total)  # fmt: skip
            self._assigned[j.job_id] = pick
            self._counts[pick] = self._counts.get(pick, 0) + 1

    def schedule(self, snapshot: Snapshot) -> Plan:
        types = snapshot.gpu_types
        if not types:
            return self._of("").schedule(snapshot)
        if snapshot.mix_types:  # the site lets launches span types: one pool, as if alike
            return self._of("").schedule(_untyped(snapshot))
        self._assign(snapshot)
        plans: list[JobPlan] = []
        for t in types:
            idx = type_nodes(snapshot, t)
            local = {g: k for k, g in enumerate(idx)}
            jobs = tuple(
                on_nodes(j, local, "", j.profile)
                for j in snapshot.jobs
                if self._assigned.get(j.job_id) == t
            )
            if not jobs:
                continue
            history = tuple(
                replace(h, profile=tuple(s for s in h.profile if s.gpu_type == t))
                for h in snapshot.history
            )
            view = sub_pool(snapshot, idx, jobs, history)
            plan = self._of(t).schedule(view)
            for p in plan.jobs:
                placement = {idx[n]: c for n, c in p.placement.items()}
                plans.append(replace(p, placement=placement, gpu_type=t))
        return Plan(tuple(plans))


@dataclass
class TypeBlind:
    """``inner`` shown the pool as one type (see the module's docstring)."""

    inner: Policy
    name: str = ""

    def __post_init__(self) -> None:
        self.name = self.name or f"{self.inner.name}-blind"

    @property
    def sees_fixed(self) -> bool:
        return bool(getattr(self.inner, "sees_fixed", False))

    def schedule(self, snapshot: Snapshot) -> Plan:
        if snapshot.gpu_types and not snapshot.mix_types:
            raise ValueError("a type-blind policy needs a pool that lets a launch mix types")
        return self.inner.schedule(_untyped(snapshot))


def _untyped(snapshot: Snapshot) -> Snapshot:
    """The pool as one of alike GPUs: no node's type, no job's."""
    return replace(
        snapshot,
        node_types=(),
        jobs=tuple(replace(j, gpu_type="", gpu_types=()) for j in snapshot.jobs),
    )
