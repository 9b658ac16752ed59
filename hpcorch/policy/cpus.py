"""CPUs per GPU: the data-loading CPUs that go with each job's GPUs (after AITurbo).

A job starved of data-loading CPUs wastes its GPUs, so every policy ends with
:func:`fit_cpus`, which picks the CPUs per GPU of every planned job once its GPUs and
placement are decided:

1. **Need** (:func:`cpu_need`, from the job's CPU profile, or else from those of other
   jobs of the same application): the fewest CPUs per GPU whose measured throughput is
   within ``tolerance`` of the best measured, or at which the job reported (almost) no
   wait for input. A job whose largest measured count is still short (it reported input
   waits there, or its step time still fell from the count below) wants more: the count
   that its input wait says would remove the wait, else twice the count.
2. **Base**: the need, or with no evidence the site default (node CPUs / node GPUs), within
   the job's bounds and its nodes. A running job that stays where it is keeps its count
   unless more CPUs are predicted to speed it up by ``resize_gain`` (changing a job's
   CPUs restarts it).
3. **Node limits**: while a node's CPUs are over-committed, the job with most CPUs per GPU
   on it gives one up (jobs that move or start before jobs that stay); a job that cannot
   get its minimum leaves the plan.
4. **Exploration**: CPUs still free go to jobs that are short at their largest measured
   count, most promising first, up to what their input waits suggest.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from hpcorch.policy.types import CpuSample, JobPlan, JobView, Plan, Snapshot

TOLERANCE = 0.05
RESIZE_GAIN = 0.1


@dataclass(frozen=True)
class CpuNeed:
    """What a CPU profile says about a job's CPUs per GPU (0 = no evidence)."""

    target: int
    """Fewest CPUs per GPU measured to keep the job near its best throughput, or the
    largest measured count when all measured counts are short."""
    explore: int
    """CPUs per GPU worth trying next (above every measured count), 0 if none."""
    rates: Mapping[int, float]
    """Samples per GPU-second measured at each count (comparable configuration)."""
    waits: Mapping[int, float]
    """Largest fraction of a step spent waiting for input measured at each count."""


NO_NEED = CpuNeed(0, 0, {}, {})


def cpu_need(samples: Iterable[CpuSample], tolerance: float = TOLERANCE) -> CpuNeed:
    """Read ``samples`` (one job's or one application's CPU profile)."""
    samples = [s for s in samples if s.cpus_per_gpu > 0 and s.step_time > 0]
    if not samples:
        return NO_NEED
    # Compare step times within one configuration (GPUs, micro-batch): the one measured
    # at most CPU counts (ties: the smallest key, for determinism).
    groups: dict[tuple[int, int], dict[int, float]] = {}
    for s in samples:
        rate = s.micro_batch / s.step_time
        g = groups.setdefault((s.gpus, s.micro_batch), {})
        g[s.cpus_per_gpu] = max(g.get(s.cpus_per_gpu, 0.0), rate)
    key = min(groups, key=lambda k: (-len(groups[k]), k))
    rates = dict(sorted(groups[key].items()))
    waits: dict[int, float] = {}
    for s in samples:
        if s.data_wait is not None:
            frac = min(max(s.data_wait / s.step_time, 0.0), 0.99)
            waits[s.cpus_per_gpu] = max(waits.get(s.cpus_per_gpu, 0.0), frac)
    counts = sorted(set(rates) | set(waits))
    best = max(rates.values())
    measured = list(rates)
    # Step time still falling from the second largest measured count to the largest.
    falling = len(measured) >= 2 and rates[measured[-1]] >= (1 + tolerance) * rates[measured[-2]]

    def enough(c: int) -> bool:
        if c in waits:
            return waits[c] <= tolerance
        return len(measured) >= 2 and not falling and rates[c] >= (1 - tolerance) * best

    ok = [c for c in counts if enough(c)]
    top = counts[-1]
    if ok:
        return CpuNeed(ok[0], 0, rates, waits)
    if top in waits:
        # Input takes 1 / (1 - wait) of the compute time: that many times the CPUs.
        nxt = math.ceil(top * (1 - tolerance) / (1 - waits[top]))
    elif falling and top == measured[-1]:
        nxt = 2 * top
    else:
        return NO_NEED  # one count, no input waits measured: nothing to go on
    return CpuNeed(top, max(nxt, top + 1), rates, waits)


def _gain(need: CpuNeed, cur: int, new: int) -> float:
    """Predicted relative speed-up of going from ``cur`` to ``new`` CPUs per GPU."""
    if new <= cur:
        return 0.0
    if cur in need.rates and new in need.rates:
        return need.rates[new] / need.rates[cur] - 1.0
    if cur in need.waits:
        return min(new / cur, 1.0 / (1.0 - need.waits[cur])) - 1.0
    if cur in need.rates and cur < need.target:
        return need.rates[need.target] / need.rates[cur] - 1.0
    if cur == need.target and need.explore:
        return new / cur - 1.0  # still short: speed grows with the CPUs at most
    return 0.0


@dataclass
class _Slot:
    plan: JobPlan
    lo: int
    hi: int
    cpus: int
    stays: bool
    current: int
    need: CpuNeed


def fit_cpus(
    snapshot: Snapshot,
    plan: Plan,
    tolerance: float = TOLERANCE,
    resize_gain: float = RESIZE_GAIN,
) -> Plan:
    """``plan`` with CPUs per GPU chosen for every job (unchanged if CPUs are not managed)."""
    if not snapshot.manages_cpus or not plan.jobs:
        return plan
    views = {j.job_id: j for j in snapshot.jobs}
    pooled: dict[str, list[CpuSample]] = {}
    for h in snapshot.history:
        pooled.setdefault(h.application, []).extend(h.cpu_profile)
    for j in snapshot.jobs:
        pooled.setdefault(j.application, []).extend(j.cpu_profile)
    app_need = {app: cpu_need(s, tolerance) for app, s in pooled.items()}
    slots = [
        _slot(snapshot, views[p.job_id], p, app_need, tolerance, resize_gain) for p in plan.jobs
    ]
    free = _shrink_to_fit(snapshot, slots)
    _explore(slots, free, resize_gain)
    return Plan(tuple(replace(s.plan, cpus_per_gpu=s.cpus) for s in slots))


def _slot(
    snapshot: Snapshot,
    job: JobView,
    p: JobPlan,
    app_need: Mapping[str, CpuNeed],
    tolerance: float,
    resize_gain: float,
) -> _Slot:
    need = cpu_need(job.cpu_profile, tolerance)
    if need.target == 0:
        need = app_need.get(job.application, NO_NEED)
    lo = max(job.min_cpus_per_gpu, 1)
    hi = min(snapshot.node_cpus[n] // c for n, c in p.placement.items())
    if job.max_cpus_per_gpu > 0:
        hi = min(hi, job.max_cpus_per_gpu)
    want = need.target or snapshot.site_cpus_per_gpu(p.placement)
    stays = job.running and job.cpus_per_gpu > 0 and dict(p.placement) == dict(job.placement)
    if stays and want != job.cpus_per_gpu and _gain(need, job.cpus_per_gpu, want) < resize_gain:
        want = job.cpus_per_gpu
    want = max(lo, min(want, hi))
    return _Slot(p, lo, hi, want, stays, job.cpus_per_gpu, need)


def _shrink_to_fit(snapshot: Snapshot, slots: list[_Slot]) -> list[int]:
    """Take CPUs from the greediest jobs (drop jobs below their minimum) until every node
    fits; return the CPUs left free per node."""
    while True:
        free = list(snapshot.node_cpus)
        for s in slots:
            for n, c in s.plan.placement.items():
                free[n] -= c * s.cpus
        over = [n for n, f in enumerate(free) if f < 0]
        if not over:
            return free
        node = over[0]
        on = [s for s in slots if node in s.plan.placement]
        above = [s for s in on if s.cpus > s.lo]
        if above:
            pick = min(above, key=lambda s: (-s.cpus, s.stays, s.plan.job_id))
            pick.cpus -= 1
        else:
            pick = min(on, key=lambda s: (s.stays, -slots.index(s)))
            slots.remove(pick)


def _explore(slots: list[_Slot], free: list[int], resize_gain: float) -> None:
    """Give free CPUs to jobs still short at their largest measured count."""
    cand = [s for s in slots if s.need.explore > s.cpus and s.cpus >= s.need.target]
    cand.sort(key=lambda s: (-_gain(s.need, s.cpus, s.need.explore), s.plan.job_id))
    for s in cand:
        room = min(s.cpus + free[n] // c for n, c in s.plan.placement.items())
        new = min(s.need.explore, s.hi, room)
        if new <= s.cpus:
            continue
        if s.stays and s.cpus == s.current and _gain(s.need, s.cpus, new) < resize_gain:
            continue
        for n, c in s.plan.placement.items():
            free[n] -= c * (new - s.cpus)
        s.cpus = new
