"""Slurm's limits as the controller applies them. Pure.

* :func:`policy_limits`: the limits the cluster reads (a :class:`LimitBook`) and the caps
  refused launches taught (:mod:`hpcorch.controller.learned`) as the policy's
  :class:`~hpcorch.policy.limit_types.Limits`: each job's bounds (GPUs, nodes, GPUs and
  CPUs on a node, CPUs), and each group's room (a group cap less what the group's jobs
  outside the pool hold).
* :func:`limit_wait`: a start that must wait until the group's jobs give back what it
  needs (a job being shrunk still holds its GPUs): released before, Slurm would keep it
  pending for the limit.
* :func:`blocked`: why a queued job the plan left out waits for a limit, or can never run
  within one, for its reason in ``hpcorch status`` (never "waiting for GPUs").
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from hpcorch.cluster import Shape
from hpcorch.controller.learned import Learned, holding, members, room
from hpcorch.controller.store import JobRecord
from hpcorch.limits import Cap, LimitBook
from hpcorch.policy.limit_types import GroupCap, JobLimit, Limits

LIMIT_WAIT = "waiting for the limit"
NEVER = "can never run within the limits"
UNITS = {"gpus": "GPUs", "nodes": "nodes", "jobs": "jobs"}


def _least(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return min(known) if known else None


def job_limit(
    rec: JobRecord, book: LimitBook, learned: Sequence[Learned], cpus_per_gpu: int = 0
) -> JobLimit:
    """The job's bounds: its per-job caps, and what refused launches taught of it."""
    per_job = [c for c in book.of(rec.slurm_id) if c.per_job]
    mine = [c for c in learned if c.key == f"job/{rec.slurm_id}"]

    def taught(dim: str) -> int | None:
        return _least(*(c.value for c in mine if c.dim == dim))

    return JobLimit(
        max_gpus=_least(*(c.limit.gpus for c in per_job), taught("gpus")),
        max_nodes=_least(*(c.limit.nodes for c in per_job), taught("nodes")),
        max_gpus_per_node=_least(*(c.per_node.gpus for c in per_job), taught("gpus_per_node")),
        max_cpus=_least(*(c.limit.cpus for c in per_job)),
        max_cpus_per_node=_least(*(c.per_node.cpus for c in per_job)),
        cpus_per_gpu=rec.cpus_per_gpu or cpus_per_gpu,
    )


def group_members(records: Sequence[JobRecord], book: LimitBook) -> dict[str, list[JobRecord]]:
    """The jobs among ``records`` each group cap (not a per-job one) holds, by its key."""
    by: dict[str, list[JobRecord]] = defaultdict(list)
    for r in records:
        for k in book.jobs.get(r.slurm_id, ()):
            cap = book.caps.get(k)
            if cap is not None and not cap.per_job:
                by[k].append(r)
    return dict(by)


def _groups(
    records: Sequence[JobRecord], book: LimitBook
) -> dict[str, tuple[Cap, list[JobRecord]]]:
    return {k: (book.caps[k], rs) for k, rs in group_members(records, book).items()}


def policy_limits(
    records: Sequence[JobRecord],
    book: LimitBook,
    learned: Sequence[Learned],
    cpus_per_gpu: int = 0,
) -> Limits:
    """The policy's limits for the active ``records`` (see the module). ``cpus_per_gpu``:
    the site default CPUs per GPU (a job that asked for none gets them)."""
    active = [r for r in records if r.active]
    jobs = {}
    for r in active:
        own = job_limit(r, book, learned, cpus_per_gpu)
        if own:
            jobs[str(r.slurm_id)] = own
    groups = []
    for cap, rs in _groups(active, book).values():
        g = GroupCap(
            cap.describe(),
            tuple(str(r.slurm_id) for r in rs),
            gpus=room(cap, "gpus"),
            nodes=room(cap, "nodes"),
            cpus=room(cap, "cpus"),
            jobs=room(cap, "jobs"),
        )
        if (g.gpus, g.nodes, g.cpus, g.jobs) != (None, None, None, None):
            groups.append(g)
    for c in learned:
        if c.key.startswith("job/") or c.dim not in ("gpus", "nodes", "jobs"):
            continue
        rs = members(c.key, active, book)
        if rs:
            groups.append(
                GroupCap(c.text(), tuple(str(r.slurm_id) for r in rs), **{c.dim: c.value})
            )
    return Limits(jobs, tuple(groups))


def limit_wait(
    rec: JobRecord,
    shape: Shape,
    records: Sequence[JobRecord],
    book: LimitBook,
    learned: Sequence[Learned],
) -> str:
    """Why ``rec``'s start at ``shape`` must wait for a group limit ('' = go now): what
    the group's other jobs hold or are starting with (a job being shrunk holds its GPUs
    until it has stopped), what it holds outside the pool, and the start itself must fit.
    """
    need = {"gpus": shape.gpus, "nodes": shape.nodes, "jobs": 1}
    grouped = any(
        k in book.caps and not book.caps[k].per_job for k in book.jobs.get(rec.slurm_id, ())
    )
    if not grouped and not any(not c.key.startswith("job/") and c.dim in need for c in learned):
        return ""  # no group limit holds this job (the pool's jobs are not looked at)
    active = [r for r in records if r.active]
    checks: list[tuple[str, Mapping[str, int | None], Mapping[str, int], list[JobRecord]]] = []
    for k in book.jobs.get(rec.slurm_id, ()):
        cap = book.caps.get(k)
        if cap is None or cap.per_job:
            continue
        rs = [r for r in active if k in book.jobs.get(r.slurm_id, ())]
        checks.append(
            (
                cap.describe(),
                {d: cap.limit.get(d) for d in need},
                {d: cap.outside.get(d) or 0 for d in need},
                rs,
            )
        )
    for c in learned:
        if c.key.startswith("job/") or c.dim not in need:
            continue
        rs = members(c.key, active, book)
        if any(r.slurm_id == rec.slurm_id for r in rs):
            checks.append((c.text(), {c.dim: c.value}, {}, rs))
    for what, caps, outside, rs in checks:
        held = [holding(r) for r in rs if r.slurm_id != rec.slurm_id]
        have = {
            "gpus": sum(h[0] for h in held),
            "nodes": sum(h[1] for h in held),
            "jobs": sum(h[2] for h in held),
        }
        for d, limit in caps.items():
            if limit is None:
                continue
            total = have[d] + outside.get(d, 0) + need[d]
            if total > limit:
                return (
                    f"{LIMIT_WAIT} {what}: {have[d] + outside.get(d, 0)} {UNITS[d]} held "
                    f"({outside.get(d, 0)} outside the pool), {need[d]} more would pass it"
                )
    return ""


def blocked(
    rec: JobRecord,
    records: Sequence[JobRecord],
    book: LimitBook,
    learned: Sequence[Learned],
    groups: Mapping[str, Sequence[JobRecord]] | None = None,
) -> str:
    """Why a queued job the plan left out waits for a limit, or never fits one ('' when
    no limit holds it back: it waits for GPUs). ``groups``: ``group_members`` of the
    active ``records``, when the caller asks for many jobs of one cycle (only the groups
    of ``rec`` are then looked at: thousands of queued jobs cost no quadratic time)."""
    own = job_limit(rec, book, learned)
    most = own.max_gpus
    if own.max_gpus_per_node is not None and own.max_nodes is not None:
        most = _least(most, own.max_gpus_per_node * own.max_nodes)
    lo = rec.min_gpus
    if most is not None and most < lo:
        which = [c.describe() for c in book.of(rec.slurm_id) if c.per_job]
        which += [c.text() for c in learned if c.key == f"job/{rec.slurm_id}"]
        return (
            f"{NEVER}: at most {most} GPUs ({'; '.join(which) or 'its limits'}), below "
            f"its minimum of {lo} (resubmit with --min-gpus {max(1, most)} or another "
            "QOS or account)"
        )
    active = [r for r in records if r.active] if groups is None or learned else []
    if groups is None:
        groups = group_members(active, book)
    for key in book.jobs.get(rec.slurm_id, ()):
        rs = groups.get(key, ())
        if not any(r is rec for r in rs):
            continue
        cap = book.caps[key]
        limit = cap.limit.gpus
        if limit is not None and limit < lo:
            return f"{NEVER}: {cap.describe()} allows {limit} GPUs, below its minimum of {lo}"
        for d, need in (("gpus", lo), ("jobs", 1)):
            left = room(cap, d)
            if left is None:
                continue
            held = sum(holding(r)[0 if d == "gpus" else 2] for r in rs if r is not rec)
            if held + need > left:
                out = cap.outside.get(d) or 0
                return (
                    f"{LIMIT_WAIT} {cap.describe()}: {held + out} {d} held ({out} outside the pool)"
                )
    for c in learned:
        if c.key.startswith("job/") or c.dim not in ("gpus", "jobs"):
            continue
        rs = members(c.key, active, book)
        if any(r is rec for r in rs):
            held = sum(holding(r)[0 if c.dim == "gpus" else 2] for r in rs if r is not rec)
            if held + (lo if c.dim == "gpus" else 1) > c.value:
                return f"{LIMIT_WAIT}: {c.text()}"
    return ""
