"""Caps learned from launches Slurm refused: never the same refused plan twice. Pure.

A launch the controller released that Slurm keeps pending for a reason that names a limit
(``QOSMaxGRESPerUser``, ``AssocGrpJobsLimit``, ``PartitionNodeLimit``, ...:
:func:`hpcorch.limits.refusal`) is held at once, and teaches a cap below what was refused,
on the job alone or on its group (the user's or the account's jobs under that limit, or the
QOS's), which every later plan keeps to; a reason hpcorch does not know is taken as a cap
on the job below its refused GPUs. Where the limits read do not say how far below (a limit
they do not show), the cap is half the refused launch's GPUs (nodes) on top of what the
group's other jobs hold, so that a few refusals find it, not one per GPU. Slurm's own
count of running jobs is exact: a refused job count is capped at what the others run. The
caps are kept in the controller's store, so a restarted controller keeps them.

A cap is unlearned when Slurm's limits, read again, explain the refusal (the limits read
then bound the plan themselves), or show more room than when it was learned (the limit was
raised, or the group's jobs outside the pool ended); and, where the limits read never
explain it, after ``LEARN_TTL_S``: the plan may then try the larger size once more.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from hpcorch.cluster import Shape
from hpcorch.controller.store import JobRecord
from hpcorch.limits import Cap, LimitBook, Refusal

LEARN_TTL_S = 1800.0
"""How long a cap the limits read do not explain is kept."""
MAX_LEARNED = 1000
"""At most this many are kept (the oldest go first)."""
META_KEY = "learned_limits"
"""Where the store keeps them (JSON)."""


@dataclass(frozen=True)
class Learned:
    """A cap taught by a refused launch: ``value`` of ``dim`` (gpus, nodes, jobs, time;
    ``gpus_per_node``) for the group ``key`` (``job/ID`` for the job alone, a limit's key
    in the :class:`LimitBook`, or ``user/NAME``)."""

    key: str
    dim: str
    value: int
    reason: str
    at: float
    slurm_id: int
    user: str
    basis: int | None = None
    """The room the limits read gave the group in ``dim`` when it was learned (None:
    they did not know the group)."""

    def text(self) -> str:
        what = {"gpus_per_node": "GPUs on a node", "gpus": "GPUs", "nodes": "nodes"}
        unit = what.get(self.dim, self.dim)
        who = "the job" if self.key.startswith("job/") else self.key
        return f"Slurm refused a launch ({self.reason}): at most {self.value} {unit} for {who}"


def holding(rec: JobRecord) -> tuple[int, int, int]:
    """(GPUs, nodes, jobs) a record holds or is starting with, as Slurm counts them."""
    if rec.phase in ("running", "stopping") and rec.gpus > 0:
        return rec.gpus, max(1, rec.nodes), 1
    if rec.phase == "starting" and rec.target_gpus > 0:
        return rec.target_gpus, max(1, len(rec.placement())), 1
    return 0, 0, 0


def members(key: str, records: Iterable[JobRecord], book: LimitBook) -> list[JobRecord]:
    """The active records a learned cap's group holds."""
    if key.startswith("job/"):
        sid = key[4:]
        return [r for r in records if str(r.slurm_id) == sid]
    if key.startswith("user/"):
        return [r for r in records if r.user == key[5:]]
    return [r for r in records if key in book.jobs.get(r.slurm_id, ())]


def room(cap: Cap, dim: str) -> int | None:
    """What the pool may hold of ``dim`` under a group cap (None: no limit)."""
    limit = cap.limit.get(dim)
    if limit is None:
        return None
    return max(0, limit - (cap.outside.get(dim) or 0))


def group_key(rec: JobRecord, why: Refusal, book: LimitBook) -> str:
    """The group a refusal's limit counts: its cap in the book where the book has one of
    that kind for the job (the tightest where several could be), else the user's jobs."""
    keys = book.jobs.get(rec.slurm_id, ())
    assoc = why.reason.startswith("Assoc")  # else a QOS's (MaxGRESPerAccount is one)
    if why.scope == "user":
        kinds = ("assoc/",) if assoc else ("/user/",)
    elif why.scope == "account":
        kinds = ("assoc/",) if assoc else ("/account/",)
    else:
        kinds = ("qos/",)
    found = [
        book.caps[k]
        for k in keys
        if k in book.caps and not book.caps[k].per_job and any(s in k for s in kinds)
    ]
    if why.scope == "qos":
        found = [c for c in found if c.key.count("/") == 1]  # the QOS's own Grp cap
    dim = why.dim if why.dim in ("gpus", "nodes", "jobs", "cpus") else "gpus"
    limited = [(room(c, dim), c.key) for c in found if room(c, dim) is not None]
    if limited:
        return min(limited, key=lambda x: (x[0] or 0, x[1]))[1]
    return f"user/{rec.user}"


def learn(
    rec: JobRecord,
    shape: Shape,
    why: Refusal,
    records: Sequence[JobRecord],
    book: LimitBook,
    now: float,
) -> Learned:
    """The cap a refused launch of ``rec`` at ``shape`` teaches (see the module)."""
    per_node = max(shape.per_node) if shape.per_node else shape.gpus_per_node
    if why.scope in ("job", "unknown") or why.dim == "time":
        if why.dim == "time":
            dim, value = "time", 0
        elif why.dim == "nodes" and not why.per_node:
            dim, value = "nodes", _below(shape.nodes)
        elif why.per_node:
            dim, value = "gpus_per_node", _below(per_node)
        else:
            dim, value = "gpus", _below(shape.gpus)
        basis = _job_basis(rec.slurm_id, dim, book)
        return Learned(f"job/{rec.slurm_id}", dim, max(0, value), why.reason, now,
                       rec.slurm_id, rec.user, basis)  # fmt: skip
    key = group_key(rec, why, book)
    others = [r for r in members(key, records, book) if r.slurm_id != rec.slurm_id]
    held = [holding(r) for r in others]
    cap = book.caps.get(key)
    basis = room(cap, dim_of(why)) if cap is not None else None
    if why.dim == "jobs":
        dim, value = "jobs", sum(h[2] for h in held)
    elif why.dim == "nodes":
        dim, value = "nodes", sum(h[1] for h in held) + _below(shape.nodes, basis)
    else:
        dim, value = "gpus", sum(h[0] for h in held) + _below(shape.gpus, basis)
    return Learned(key, dim, max(0, value), why.reason, now, rec.slurm_id, rec.user, basis)


def dim_of(why: Refusal) -> str:
    """The dimension a group refusal's cap counts (CPUs and memory go with the GPUs)."""
    return why.dim if why.dim in ("jobs", "nodes") else "gpus"


def _below(refused: int, basis: int | None = None) -> int:
    """Below a refused amount: one less where the limits read knew the group (Slurm
    refused what they allowed: the rest of the group's usage grew since), half of it
    where they did not."""
    if basis is not None:
        return max(0, refused - 1)
    return refused // 2


def _job_basis(slurm_id: int, dim: str, book: LimitBook) -> int | None:
    """The per-job limit the book gives the job in ``dim`` (None: none, or not known)."""
    if dim not in ("gpus", "nodes"):
        return None
    values = [c.limit.get(dim) for c in book.of(slurm_id) if c.per_job]
    known = [v for v in values if v is not None]
    return min(known) if known else None


def keep(
    cap: Learned,
    records: Sequence[JobRecord],
    book: LimitBook,
    now: float,
) -> bool:
    """Whether a learned cap still holds (see the module)."""
    if now - cap.at > LEARN_TTL_S:
        return False
    if not members(cap.key, [r for r in records if r.active], book):
        return False
    if book.read_at <= cap.at or cap.dim == "time":
        return True
    if cap.key.startswith("job/"):
        now_room = _job_basis(cap.slurm_id, cap.dim, book)
    else:
        found = book.caps.get(cap.key)
        now_room = room(found, cap.dim) if found is not None else None
        if found is None and cap.basis is not None:
            return False  # the limit is gone
    if now_room is None:
        return True
    if now_room <= cap.value:
        return False  # the limits read explain it: they bound the plan themselves
    return cap.basis is None or now_room <= cap.basis  # more room than then: unlearned


def dumps(caps: Sequence[Learned]) -> str:
    return json.dumps([asdict(c) for c in caps[-MAX_LEARNED:]], separators=(",", ":"))


def loads(text: str | None) -> list[Learned]:
    """Learned caps from the store; what cannot be read is dropped (they are relearned)."""
    if not text:
        return []
    try:
        rows = json.loads(text)
    except ValueError:
        return []
    out = []
    for row in rows if isinstance(rows, list) else []:
        try:
            out.append(Learned(**row))
        except TypeError:
            continue
    return out
