"""The limits slurmctld enforces on the pool's jobs, as a :class:`hpcorch.limits.LimitBook`.
Pure: the association manager's and the partitions' parsed text
(:mod:`hpcorch.slurm.assoc_mgr`) and the pool's jobs in, the caps that apply to each job
out, with what each group's jobs outside the pool hold.

A job of user U under account A, QOS Q, in partition P is bound, as slurmctld binds it:

* by Q (and P's own QOS, if P has one): ``MaxTRESPerJob``, ``MaxTRESPerNode`` and
  ``MaxWall`` on each job; ``GrpTRES``/``GrpJobs`` on all of Q's jobs together;
  ``MaxTRESPerUser``/``MaxJobsPerUser`` on U's; ``MaxTRESPerAccount``/``MaxJobsPerAccount``
  on A's;
* by its association (U in A, or U in A on P): ``MaxTRES`` (per job, nodes included) and
  ``MaxWall`` on each job, ``GrpTRES``/``GrpJobs``/``MaxJobs`` on the association's jobs;
  and by ``GrpTRES``/``GrpJobs`` of A's association and of every account above it (the
  ``Max*`` limits of an account are handed down to its users' associations, which is
  where slurmctld checks them);
* by P: ``MaxNodes``, ``MaxTime``, ``MaxCPUsPerNode`` and ``MaxMemPerNode`` on each job.

What slurmctld counts against a group cap includes the pool's running jobs; what the
group's other jobs hold (``Cap.outside``) is its count less theirs when it was read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from hpcorch.cluster import ENDED_STATES
from hpcorch.limits import DIMENSIONS, Amounts, Cap, LimitBook
from hpcorch.slurm.assoc_mgr import AssocMgr, Partition, PerJob, UsageLimits
from hpcorch.slurm.parse import SlurmJob

TRES = {"gpus": "gres/gpu", "nodes": "node", "cpus": "cpu", "mem_mb": "mem"}
"""Each dimension's TRES name."""


def _limits(tres: Mapping[str, int], jobs: int | None = None) -> Amounts:
    return Amounts(**{d: tres.get(t) for d, t in TRES.items()}, jobs=jobs)


def _grp_limit(u: UsageLimits, jobs: int | None = None) -> Amounts:
    limits = {k: v[0] for k, v in u.tres.items() if v[0] is not None}
    j = u.jobs[0]
    if jobs is not None:
        j = jobs if j is None else min(j, jobs)
    return _limits(limits, j)


def _used(u: UsageLimits) -> Amounts:
    return Amounts(
        **{d: u.tres.get(t, (None, None))[1] or 0 for d, t in TRES.items()}, jobs=u.jobs[1] or 0
    )


def _names(*pairs: tuple[bool, str]) -> str:
    return "/".join(name for on, name in pairs if on)


def _per_job_cap(key: str, owner: str, pj: PerJob, tres_name: str) -> Cap | None:
    limit = _limits(pj.tres)
    per_node = _limits(pj.per_node)
    kinds = _names(
        (limit.any(), tres_name),
        (per_node.any(), "MaxTRESPerNode"),
        (pj.wall_min is not None, "MaxWall"),
    )
    if not kinds:
        return None
    return Cap(
        key, f"{owner} {kinds}", per_job=True, limit=limit, per_node=per_node, wall_min=pj.wall_min
    )


def _group_cap(
    key: str, what: str, u: UsageLimits, jobs: int | None = None, submit: int | None = None
) -> Cap | None:
    limit = _grp_limit(u, jobs)
    sub = u.submit[0]
    if submit is not None:
        sub = submit if sub is None else min(sub, submit)
    if not limit.any() and sub is None:
        return None
    return Cap(key, what, limit=limit, outside=_used(u), submit=sub, submitted=u.submit[1] or 0)


def caps_of_job(mgr: AssocMgr, parts: Mapping[str, Partition], job: SlurmJob) -> list[Cap]:
    """Every cap that applies to ``job`` (its ``outside`` still slurmctld's whole count)."""
    return caps_of(mgr, parts, job.user, job.uid, job.account, job.qos, job.partition)


def caps_of(
    mgr: AssocMgr,
    parts: Mapping[str, Partition],
    user: str,
    uid: int,
    account: str,
    qos: str,
    partition: str,
) -> list[Cap]:
    """Every cap on a job of ``user`` (``uid``) under ``account`` and ``qos`` in
    ``partition`` (``Cap.outside``: slurmctld's whole count)."""
    job = _Who(user, uid, account, qos, partition)
    out: list[Cap | None] = []
    part = parts.get(job.partition)
    names = [q for q in (job.qos, part.qos if part else "") if q]
    for q in dict.fromkeys(names):
        rec = mgr.qos.get(q)
        if rec is None:
            continue
        out.append(_per_job_cap(f"qos/{q}/job", f"QOS {q}", rec.per_job, "MaxTRESPerJob"))
        out.append(_group_cap(f"qos/{q}", f"QOS {q} GrpTRES/GrpJobs", rec.grp))
        mine = rec.users.get(job.uid)
        if mine is not None:
            what = f"QOS {q} MaxTRESPerUser/MaxJobsPerUser ({job.user})"
            out.append(_group_cap(f"qos/{q}/user/{job.user}", what, mine))
        acct = rec.accounts.get(job.account)
        if acct is not None:
            what = f"QOS {q} MaxTRESPerAccount/MaxJobsPerAccount ({job.account})"
            out.append(_group_cap(f"qos/{q}/account/{job.account}", what, acct))
    assoc = mgr.association(job.account, job.user, job.partition)
    if assoc is not None:
        owner = f"association {job.account}/{job.user}"
        out.append(_per_job_cap(f"assoc/{assoc.id}/job", owner, assoc.per_job, "MaxTRES"))
        out.append(
            _group_cap(
                f"assoc/{assoc.id}",
                f"{owner} GrpTRES/MaxJobs",
                assoc.grp,
                jobs=assoc.max_jobs[0],
                submit=assoc.max_submit[0],
            )
        )
    seen: set[str] = set()
    above = mgr.account(job.account)
    while above is not None and above.account not in seen:
        seen.add(above.account)
        what = f"account {above.account} GrpTRES/GrpJobs"
        out.append(_group_cap(f"assoc/{above.id}", what, above.grp))
        above = mgr.account(above.parent) if above.parent else None
    if part is not None:
        out.append(_partition_cap(part))
    return [c for c in out if c is not None]


@dataclass(frozen=True)
class _Who:
    user: str
    uid: int
    account: str
    qos: str
    partition: str


def _partition_cap(p: Partition) -> Cap | None:
    limit = Amounts(nodes=p.max_nodes)
    per_node = Amounts(cpus=p.max_cpus_per_node, mem_mb=p.max_mem_per_node_mb)
    kinds = _names(
        (p.max_nodes is not None, "MaxNodes"),
        (p.max_time_min is not None, "MaxTime"),
        (p.max_cpus_per_node is not None, "MaxCPUsPerNode"),
        (p.max_mem_per_node_mb is not None, "MaxMemPerNode"),
    )
    if not kinds:
        return None
    return Cap(
        f"partition/{p.name}/job",
        f"partition {p.name} {kinds}",
        per_job=True,
        limit=limit,
        per_node=per_node,
        wall_min=p.max_time_min,
    )


def _holds(job: SlurmJob) -> bool:
    """Whether slurmctld counts the job's resources against its limits now."""
    return job.state not in ENDED_STATES and job.state != "PENDING"


def job_amounts(job: SlurmJob) -> dict[str, int]:
    gpus = sum(job.gpus_by_node) if job.gpus_by_node else job.gpus_per_node * job.node_count
    gpus = gpus or job.gpus_per_job
    return {"gpus": gpus, "nodes": job.node_count, "cpus": job.cpus, "mem_mb": 0, "jobs": 1}


def limit_book(
    mgr: AssocMgr, parts: Mapping[str, Partition], pool: Sequence[SlurmJob], now: float
) -> LimitBook:
    """The caps of the pool's jobs ``pool`` (hpcorch's, in its reservation), with
    ``Cap.outside`` what slurmctld counts less what the pool's running jobs hold."""
    caps: dict[str, Cap] = {}
    keys: dict[int, tuple[str, ...]] = {}
    for j in pool:
        if j.state in ENDED_STATES:
            continue
        found = caps_of_job(mgr, parts, j)
        for c in found:
            caps.setdefault(c.key, c)
        keys[j.job_id] = tuple(c.key for c in found)
    held: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(DIMENSIONS, 0))
    for j in pool:
        if j.job_id in keys and _holds(j):
            amounts = job_amounts(j)
            for k in keys[j.job_id]:
                for d in DIMENSIONS:
                    held[k][d] += amounts[d]
    for k, c in caps.items():
        if c.per_job:
            continue
        outside = {d: max(0, (c.outside.get(d) or 0) - held[k][d]) for d in DIMENSIONS}
        caps[k] = replace(c, outside=Amounts(**outside))
    book = LimitBook(caps=caps, jobs=keys, read_at=now)
    return replace(book, time_limits=_time_limits(book, pool))


def _time_limits(book: LimitBook, pool: Iterable[SlurmJob]) -> dict[int, int]:
    """The jobs whose own time limit (0: none) is longer than their caps allow."""
    out: dict[int, int] = {}
    for j in pool:
        wall = book.wall_min(j.job_id)
        if wall is not None and (j.time_limit_min <= 0 or j.time_limit_min > wall):
            out[j.job_id] = max(1, wall)
    return out


def rekey(
    book: LimitBook, mgr: AssocMgr, parts: Mapping[str, Partition], pool: Sequence[SlurmJob]
) -> LimitBook:
    """``book``'s caps for the pool's jobs now. A job that joined since the read gets the
    caps the read gives it: a group the book had no job of had none of the pool's running
    then, so what slurmctld counted for it was all outside the pool."""
    caps = dict(book.caps)
    keys: dict[int, tuple[str, ...]] = {}
    for j in pool:
        if j.state in ENDED_STATES:
            continue
        known = book.jobs.get(j.job_id)
        if known is None:
            found = caps_of_job(mgr, parts, j)
            for c in found:
                caps.setdefault(c.key, c)
            known = tuple(c.key for c in found)
        keys[j.job_id] = known
    later = replace(book, caps=caps, jobs=keys)
    return replace(later, time_limits=_time_limits(later, pool))
