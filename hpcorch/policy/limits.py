"""Every policy's plan within the scheduler's limits (``Snapshot.limits``). Pure.

:func:`limited_schedule` runs a policy (through :func:`hpcorch.policy.split.split_schedule`)
on the snapshot with each job's GPU bound lowered to what its own limits and each group
it belongs to allow (a job whose minimum no limit allows is not planned), then fits the
plan with :func:`fit_limits`: per job, the GPUs on each node, its nodes and its CPUs; per
group (a user's jobs under a QOS's ``MaxTRESPerUser``, an account's under ``GrpTRES``),
the GPUs, nodes, CPUs and jobs of its members together. Where it had to take GPUs away,
the policy plans once more with those jobs bounded at what they kept, so that the GPUs
freed go to jobs no limit holds back; the second plan is fitted again.

Fitting takes from the job the policy prefers least: a group over its GPUs gives up one
GPU at a time from its member holding the most GPUs above its minimum (the one that
loses least under diminishing returns), ties to the member it prefers least (not running
at its current size, then the lightest weight, then the latest); a group over its count
of jobs loses its least preferred member. A running job that cannot be stopped keeps its
GPUs whatever a limit says (Slurm does not stop a running job either).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from hpcorch.policy.common import split_batch
from hpcorch.policy.limit_types import GroupCap, JobLimit, Limits
from hpcorch.policy.split import split_schedule
from hpcorch.policy.types import (
    JobPlan,
    JobView,
    Plan,
    PlanError,
    Policy,
    Snapshot,
    planned_cpus_per_gpu,
)


def limited_schedule(policy: Policy, snapshot: Snapshot) -> Plan:
    """``policy``'s plan within ``snapshot.limits`` (see the module)."""
    if not snapshot.limits:
        return split_schedule(policy, snapshot)
    bounded = bounded_snapshot(snapshot)
    plan = split_schedule(policy, bounded)
    fitted = fit_limits(bounded, plan)
    trimmed = _trimmed(plan, fitted)
    if not trimmed:
        return fitted
    kept = fitted.by_id()
    again = []
    for j in bounded.jobs:
        if j.job_id not in trimmed or _fixed(j):
            again.append(j)
        elif j.job_id in kept:
            n = kept[j.job_id].gpus
            again.append(replace(j, max_gpus=n, min_gpus=min(j.min_gpus, n)))
    second = replace(bounded, jobs=tuple(again))
    return fit_limits(second, split_schedule(policy, second))


def bounded_snapshot(snapshot: Snapshot) -> Snapshot:
    """``snapshot`` with each job's GPU bound lowered to its limits and its groups' (one
    member alone never holds more than its group may); a job whose minimum that leaves no
    room for is not shown (it cannot run now), or, running, is shown fixed where it runs
    (stopped, it could not start again). A running job that cannot be stopped is shown as
    it is."""
    lim = snapshot.limits
    caps: dict[str, int] = {}
    for g in lim.groups:
        if g.gpus is not None:
            for m in g.members:
                caps[m] = min(caps.get(m, g.gpus), g.gpus)
        if g.jobs is not None and g.jobs <= 0:
            for m in g.members:
                caps[m] = 0
    jobs = []
    for j in snapshot.jobs:
        if _fixed(j):
            jobs.append(j)
            continue
        hi = j.max_gpus
        own = lim.of(j.job_id)
        for cap in (own.max_gpus, caps.get(j.job_id), _per_node_cap(own, snapshot)):
            if cap is not None:
                hi = min(hi, cap)
        if hi < j.min_gpus:
            if j.running:  # limits lowered under it: it runs on, as Slurm lets it
                jobs.append(replace(j, min_gpus=j.gpus, max_gpus=j.gpus, resizable=False))
            continue
        jobs.append(j if hi == j.max_gpus else replace(j, max_gpus=hi))
    return replace(snapshot, jobs=tuple(jobs))


def _per_node_cap(own: JobLimit, snapshot: Snapshot) -> int | None:
    """The most GPUs a job can hold with its per-node and node-count limits."""
    if own.max_nodes is None and own.max_gpus_per_node is None:
        return None
    per = sorted(snapshot.node_gpus, reverse=True)
    if own.max_gpus_per_node is not None:
        per = [min(n, own.max_gpus_per_node) for n in per]
    if own.max_nodes is not None:
        per = per[: own.max_nodes]
    return sum(per)


def _fixed(j: JobView) -> bool:
    return j.running and not j.resizable


def _kept(j: JobView, p: JobPlan) -> bool:
    """A running job planned exactly where it runs."""
    return j.running and p.gpus == j.gpus and dict(p.placement) == dict(j.placement)


def _trimmed(before: Plan, after: Plan) -> set[str]:
    kept = after.by_id()
    return {p.job_id for p in before.jobs if p.job_id not in kept or kept[p.job_id].gpus < p.gpus}


# --- fitting a plan -------------------------------------------------------------------
def fit_limits(snapshot: Snapshot, plan: Plan) -> Plan:
    """``plan`` with GPUs taken away until every limit of ``snapshot.limits`` holds (see
    the module); a job left below its minimum is left out (queued)."""
    lim = snapshot.limits
    if not lim:
        return plan
    jobs = {j.job_id: j for j in snapshot.jobs}
    plans: dict[str, JobPlan] = {}
    for p in plan.jobs:
        job = jobs.get(p.job_id)
        if job is None or _fixed(job):
            plans[p.job_id] = p
            continue
        fitted = _fit_job(snapshot, job, p, lim.of(p.job_id))
        if fitted is not None:
            plans[p.job_id] = fitted
    order = {j.job_id: i for i, j in enumerate(_preference(snapshot.jobs, plans))}
    stuck: set[int] = set()  # groups of which only jobs that cannot be stopped are left
    for _ in range(sum(p.gpus for p in plans.values()) + len(plans) + len(lim.groups) + 1):
        over = next(
            (
                k
                for k, g in enumerate(lim.groups)
                if k not in stuck and _over(snapshot, jobs, plans, g)
            ),
            None,
        )
        if over is None:
            break
        if not _shrink(snapshot, jobs, plans, lim.groups[over], order):
            stuck.add(over)  # they keep their GPUs
    return Plan(tuple(plans[p.job_id] for p in plan.jobs if p.job_id in plans))


def _preference(jobs: Sequence[JobView], plans: Mapping[str, JobPlan]) -> list[JobView]:
    """Most preferred first: kept at its current GPUs, heaviest weight, earliest."""

    def kept(j: JobView) -> bool:
        p = plans.get(j.job_id)
        return bool(j.running and p is not None and p.gpus == j.gpus)

    return sorted(jobs, key=lambda j: (not kept(j), -j.weight, j.submit_time, j.job_id))


def job_cpus_per_gpu(snapshot: Snapshot, job: JobView, p: JobPlan, own: JobLimit) -> int:
    """CPUs each GPU of ``p`` holds: the planned ones where CPUs are planned, else the
    job's own (``JobLimit.cpus_per_gpu``; 0: unknown)."""
    if snapshot.manages_cpus:
        return planned_cpus_per_gpu(snapshot, job, p)
    return own.cpus_per_gpu


def _fit_job(snapshot: Snapshot, job: JobView, p: JobPlan, own: JobLimit) -> JobPlan | None:
    if not own:
        return p
    place = dict(p.placement)
    cpn = job_cpus_per_gpu(snapshot, job, p, own)
    cpus_per_gpu = p.cpus_per_gpu
    if snapshot.manages_cpus and cpn > job.min_cpus_per_gpu:
        # fewer CPUs per GPU before fewer GPUs, down to the job's minimum
        most = max(place.values(), default=1)
        fit = cpn
        if own.max_cpus is not None:
            fit = min(fit, own.max_cpus // max(1, p.gpus))
        if own.max_cpus_per_node is not None:
            fit = min(fit, own.max_cpus_per_node // max(1, most))
        if fit < cpn:
            cpn = cpus_per_gpu = max(job.min_cpus_per_gpu, fit)
    per_node = own.max_gpus_per_node
    if own.max_cpus_per_node is not None and cpn > 0:
        by_cpus = own.max_cpus_per_node // cpn
        per_node = by_cpus if per_node is None else min(per_node, by_cpus)
    if per_node is not None:
        place = {n: min(c, per_node) for n, c in place.items() if min(c, per_node) > 0}
    if own.max_nodes is not None and len(place) > own.max_nodes:
        keep = sorted(place, key=lambda n: (-place[n], n))[: max(0, own.max_nodes)]
        place = {n: c for n, c in place.items() if n in keep}
    total = own.max_gpus
    if own.max_cpus is not None and cpn > 0:
        total = min(own.max_cpus // cpn, own.max_cpus if total is None else total)
    if total is not None:
        while place and sum(place.values()) > total:
            _drop_one(place)
    return _replanned(job, p, place, cpus_per_gpu)


def _drop_one(place: dict[int, int]) -> None:
    """One GPU less, from the node holding the fewest of them (a node left with none is
    given up)."""
    node = min(place, key=lambda n: (place[n], -n))
    place[node] -= 1
    if place[node] <= 0:
        del place[node]


def _replanned(
    job: JobView, p: JobPlan, place: Mapping[int, int], cpus_per_gpu: int
) -> JobPlan | None:
    gpus = sum(place.values())
    if gpus < max(1, job.min_gpus):
        return None
    if gpus == p.gpus and dict(place) == dict(p.placement) and cpus_per_gpu == p.cpus_per_gpu:
        return p
    total, micro, accum = split_batch(job, gpus, p.global_batch)
    return replace(
        p,
        gpus=gpus,
        placement=dict(place),
        global_batch=total,
        micro_batch=micro,
        accum_steps=accum,
        cpus_per_gpu=cpus_per_gpu,
    )


def group_use(
    snapshot: Snapshot, jobs: Mapping[str, JobView], plans: Mapping[str, JobPlan], g: GroupCap
) -> tuple[int, int, int, int]:
    """(GPUs, nodes, CPUs, jobs) the group's members hold under ``plans``."""
    gpus = nodes = cpus = count = 0
    for m in g.members:
        p = plans.get(m)
        if p is None or p.gpus <= 0:
            continue
        gpus += p.gpus
        nodes += len(p.placement)
        count += 1
        job = jobs.get(m)
        if job is not None:
            cpus += p.gpus * job_cpus_per_gpu(snapshot, job, p, snapshot.limits.of(m))
    return gpus, nodes, cpus, count


def _over(
    snapshot: Snapshot, jobs: Mapping[str, JobView], plans: Mapping[str, JobPlan], g: GroupCap
) -> bool:
    use = group_use(snapshot, jobs, plans, g)
    caps = (g.gpus, g.nodes, g.cpus, g.jobs)
    return any(c is not None and u > c for u, c in zip(use, caps, strict=True))


def _shrink(
    snapshot: Snapshot,
    jobs: Mapping[str, JobView],
    plans: dict[str, JobPlan],
    g: GroupCap,
    order: Mapping[str, int],
) -> bool:
    """Take one step towards ``g``'s cap; False when no member can give anything up."""
    cand = [
        m for m in g.members if m in plans and m in jobs and not _fixed(jobs[m]) and plans[m].gpus
    ]
    if not cand:
        return False
    _gpus, nodes, _cpus, count = group_use(snapshot, jobs, plans, g)
    last = max(cand, key=lambda m: order.get(m, len(order)))
    if g.jobs is not None and count > g.jobs:
        del plans[last]
        return True
    if g.nodes is not None and nodes > g.nodes:
        spread = [m for m in cand if len(plans[m].placement) > 1]
        if spread:  # a node less for the least preferred job spread over several
            m = max(spread, key=lambda m: order.get(m, len(order)))
            place = dict(plans[m].placement)
            while len(place) == len(plans[m].placement):
                _drop_one(place)
            return _replace(jobs, plans, m, place)
        del plans[last]
        return True
    above = [m for m in cand if plans[m].gpus > jobs[m].min_gpus]
    if not above:
        del plans[last]
        return True
    m = max(above, key=lambda m: (plans[m].gpus - jobs[m].min_gpus, order.get(m, len(order))))
    place = dict(plans[m].placement)
    _drop_one(place)
    return _replace(jobs, plans, m, place)


def _replace(
    jobs: Mapping[str, JobView], plans: dict[str, JobPlan], m: str, place: Mapping[int, int]
) -> bool:
    new = _replanned(jobs[m], plans[m], place, plans[m].cpus_per_gpu)
    if new is None:
        del plans[m]
    else:
        plans[m] = new
    return True


# --- checking a plan ------------------------------------------------------------------
def validate_limits(snapshot: Snapshot, plan: Plan) -> None:
    """Raise :class:`PlanError` unless ``plan`` keeps every limit of ``snapshot.limits``.
    A running job kept where it runs counts, but is never wrong: limits lowered under it,
    Slurm lets it run on, and so does the plan."""
    lim: Limits = snapshot.limits
    if not lim:
        return
    jobs = {j.job_id: j for j in snapshot.jobs}
    plans = plan.by_id()
    for p in plan.jobs:
        job = jobs.get(p.job_id)
        own = lim.of(p.job_id)
        if job is None or _kept(job, p) or not own:
            continue
        cpn = job_cpus_per_gpu(snapshot, job, p, own)
        most = max(p.placement.values(), default=0)
        checks = (
            (own.max_gpus, p.gpus, "GPUs"),
            (own.max_nodes, len(p.placement), "nodes"),
            (own.max_gpus_per_node, most, "GPUs on a node"),
            (own.max_cpus, p.gpus * cpn, "CPUs"),
            (own.max_cpus_per_node, most * cpn, "CPUs on a node"),
        )
        for cap, used, what in checks:
            if cap is not None and used > cap:
                raise PlanError(f"{p.job_id}: {used} {what}, its limits allow {cap}")
    for g in lim.groups:
        use = group_use(snapshot, jobs, plans, g)
        kept = {
            m: plans[m] for m in g.members if m in plans and m in jobs and _kept(jobs[m], plans[m])
        }
        fixed = group_use(snapshot, jobs, kept, g)
        names = ("GPUs", "nodes", "CPUs", "jobs")
        for used, held, cap, what in zip(
            use, fixed, (g.gpus, g.nodes, g.cpus, g.jobs), names, strict=True
        ):
            if cap is not None and used > max(cap, held):
                raise PlanError(f"{g.name}: {used} {what} planned, it allows {cap}")
