"""Which jobs share what was learned of them: pooled knowledge as a prior, never as truth.

Jobs (running and completed) that report the same ``application`` key are presumed to run
the same model, so their step times and gradient-noise histories are pooled. The key is
what identifies a model, and names its owner (:mod:`hpcorch.controller.identity`:
``<owner>/<app>``, ``<owner>/model:<fingerprint>``): by default only one owner's jobs pool.
Where the site opts in (``Snapshot.pool_across_owners``; :class:`AcrossOwners`, which
``hpcorch controller --pool-models-across-users`` wraps the policy in), the jobs of every
owner that report one fingerprint form one group. A name a user chose (``--app``) is never
shared.

A key is a presumption only: a job leaves its group and is modelled on its own measurements
alone as soon as it shows it is another model:

* it reports a model size (gradient bytes) more than ``SIZE_TOLERANCE`` away from the
  group's median, or
* its step times disagree with what the others measured: the ratios of its points to the
  band the others allow have a median above ``1 + COMPUTE_TOLERANCE``, or one of them is
  above ``(1 + COMPUTE_TOLERANCE) ** 2``. A point whose compute is known (one GPU, or a
  known all-reduce part) is compared with the others' compute time per micro-step (per
  per-GPU batch, the median of the others'): interpolated between their batches, and
  outside them between the nearest one's time and that time scaled by the batch (compute
  grows with the batch, at most proportionally). A point on several GPUs whose all-reduce
  part is not known (what the controller stores: jobs report their whole step) is compared
  whole with each other voter's steps, the median over voters taken: a step is no faster
  than one on as many or fewer nodes, GPUs, per-GPU batch and accumulation steps, and no
  slower than one on as many or more (a claim at a shape one voter alone ran is one vote).

The job that disagrees most leaves first, and the rest are checked again without it: a
liar does not take honest jobs with it.

Jobs of several owners in one group (the opt-in) vote as owners, not as jobs: a job is
compared with the *other* owners (each owner's median first), and the group's profile is,
per configuration, the median over owners of each owner's median (:func:`pooled_profiles`).
k lying jobs of one owner are one vote; lying owners move the group's estimate at a
configuration only where they outnumber the honest owners who measured it, and where they
are the majority of a group the honest jobs leave it instead: an honest job is never
modelled together with one that disagrees with it beyond the tolerance. A job that leaves
falls back to its owner's own group (as without the opt-in), where it is checked against
its owner's other jobs. A claim within the tolerance at a configuration no other owner ran
is believed.

Pure: jobs in, a key per job out.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from hpcorch.policy.types import CompletedJob, JobView, Plan, Policy, Snapshot, StepSample

SIZE_TOLERANCE = 0.1
COMPUTE_TOLERANCE = 1.0
MAX_PEERS = 48
"""A step without its all-reduce part is compared with at most this many other voters
(the most recent): the check stays linear in a group's jobs."""

Config = tuple[int, int, int, int]
"""(nodes, GPUs, per-GPU batch, accumulation steps) of a measurement."""

_SHARED = "model:"
"""The part of a key after its owner that the site's opt-in shares across owners."""


def owner_of(application: str) -> str:
    """The owner a key names (``alice/...``), or '' (``job:<id>``, a simulated app)."""
    owner, sep, _ = application.partition("/")
    return owner if sep else ""


def group_of(application: str, across_owners: bool) -> str:
    """The group a key pools in: the key itself, or with the site's opt-in the fingerprint
    without its owner (``alice/model:X`` -> ``model:X``)."""
    if across_owners:
        _, sep, rest = application.partition("/")
        if sep and rest.startswith(_SHARED):
            return rest
    return application


@dataclass
class _Member:
    job_id: str
    owner: str
    size: int
    compute: dict[int, float] = field(default_factory=dict)
    """Per-GPU batch -> least compute seconds of one micro-step measured."""
    steps: dict[Config, float] = field(default_factory=dict)
    """Every configuration measured -> least seconds per step."""
    loose: dict[Config, float] = field(default_factory=dict)
    """The steps on several GPUs whose all-reduce part is not known."""


def _member(job_id: str, application: str, size: int, profile: Sequence[StepSample]) -> _Member:
    m = _Member(job_id, owner_of(application), size)
    for s in profile:
        if s.step_time <= 0 or s.micro_batch <= 0 or s.gpus <= 0:
            continue
        k = max(1, s.accum_steps)
        cfg = (max(1, s.nodes), s.gpus, s.micro_batch, k)
        m.steps[cfg] = min(m.steps.get(cfg, s.step_time), s.step_time)
        if s.gpus == 1:
            c = s.step_time / k
        elif s.sync_time > 0:
            c = (s.step_time - s.sync_time) / k
        else:
            m.loose[cfg] = m.steps[cfg]  # the all-reduce part is not known: compared whole
            continue
        m.compute[s.micro_batch] = min(m.compute.get(s.micro_batch, c), max(c, 1e-9))
    return m


def _median_without(vals: list[float], i: int) -> float:
    """The median of sorted ``vals`` without the value at index ``i`` (-1: with all)."""
    if i < 0:
        n = len(vals)
        mid = n // 2
        return vals[mid] if n % 2 else 0.5 * (vals[mid - 1] + vals[mid])
    m = len(vals) - 1

    def at(k: int) -> float:
        return vals[k if k < i else k + 1]

    return at(m // 2) if m % 2 else 0.5 * (at(m // 2 - 1) + at(m // 2))


class _Consensus:
    """Per per-GPU batch: each voter's value (the median of its members' values) and the
    median of every voter's but one, as the others' curve (batches and values, sorted by
    batch): the all-voter curve is built once, and a voter changes it only at its own
    batches."""

    def __init__(self, values: Mapping[int, Mapping[str, list[float]]]) -> None:
        own = {k: {v: _median_without(sorted(xs), -1) for v, xs in by.items()}
               for k, by in values.items()}  # fmt: skip
        keys = sorted(own)
        self.ranked = [sorted(own[k].values()) for k in keys]
        self.batches = np.array(keys, dtype=float)
        self.values = np.array([_median_without(r, -1) for r in self.ranked], dtype=float)
        self.mine: dict[str, list[tuple[int, float]]] = {}
        """Voter -> (index of a batch it measured, its value there)."""
        for i, k in enumerate(keys):
            for v, x in own[k].items():
                self.mine.setdefault(v, []).append((i, x))

    def without(self, voter: str) -> tuple[np.ndarray, np.ndarray]:
        """The others' curve: per batch, the median of every voter's value but ``voter``'s
        (a batch only ``voter`` measured is left out)."""
        mine = self.mine.get(voter)
        if not mine:
            return self.batches, self.values
        vals, drop = self.values.copy(), []
        for i, x in mine:
            ranked = self.ranked[i]
            if len(ranked) > 1:
                vals[i] = _median_without(ranked, bisect.bisect_left(ranked, x))
            else:
                drop.append(i)
        if drop:
            keep = np.ones(len(vals), dtype=bool)
            keep[drop] = False
            return self.batches[keep], vals[keep]
        return self.batches, vals


def _compute_ratios(own: dict[int, float], others: tuple[np.ndarray, np.ndarray]) -> list[float]:
    bs, cs = others
    if not own or not len(bs):
        return []
    b = np.fromiter(own.keys(), dtype=float, count=len(own))
    c = np.fromiter(own.values(), dtype=float, count=len(own))
    # the band the others' curve allows at b: interpolated inside their batches; outside,
    # compute is monotone in the batch and grows at most proportionally
    mid = np.interp(b, bs, cs)
    lo = np.where(b < bs[0], cs[0] * b / bs[0], np.where(b > bs[-1], cs[-1], mid))
    hi = np.where(b < bs[0], cs[0], np.where(b > bs[-1], cs[-1] * b / bs[-1], mid))
    ratios: list[float] = np.maximum(np.maximum(c / hi, lo / c), 1.0).tolist()
    return ratios


class _Peers:
    """The steps of the most recent ``MAX_PEERS + 1`` voters, stacked: each job is compared
    with ``MAX_PEERS`` of them other than its own voter."""

    def __init__(self, voters: Sequence[str], steps: Mapping[str, Mapping[Config, float]]):
        self.voters = list(voters[: MAX_PEERS + 1])
        rows = [(c, t, i) for i, v in enumerate(self.voters) for c, t in steps[v].items()]
        self.cfg = np.array([c for c, _, _ in rows], dtype=float).reshape(-1, 4)
        self.val = np.array([t for _, t, _ in rows], dtype=float)
        self.idx = np.array([i for _, _, i in rows], dtype=np.int64)

    def ratios(self, own: Mapping[Config, float], voter: str) -> list[float]:
        """Per point of ``own``, the median over the peers of how far it is outside the band
        each one's steps allow (a step is no faster than one on as many or fewer nodes,
        GPUs, per-GPU batch and accumulation steps, and no slower than one on as many or
        more): a claim at a shape one peer alone ran is one vote, not the band of all."""
        n = len(self.voters)
        # its own voter's rows, else the oldest voter's of MAX_PEERS + 1 (if as many)
        skip = n - 1 if n > MAX_PEERS else -1
        if voter in self.voters:
            skip = self.voters.index(voter)
        mine = self.idx != skip
        cfg, val, idx = self.cfg[mine], self.val[mine], self.idx[mine]
        out = []
        for p, t in own.items():
            point = np.array(p, dtype=float)
            below, above = (cfg <= point).all(axis=1), (cfg >= point).all(axis=1)
            lo, hi = np.zeros(n), np.full(n, np.inf)
            np.maximum.at(lo, idx[below], val[below])
            np.minimum.at(hi, idx[above], val[above])
            seen = (lo > 0) | np.isfinite(hi)
            if seen.any():
                r = np.maximum(np.maximum(t / hi[seen], lo[seen] / t), 1.0)
                out.append(float(np.median(r)))
        return out


def _outliers(group: Sequence[_Member], voter: Callable[[_Member], str]) -> set[str]:
    """The job ids of ``group`` whose report or measurements disagree with the others'."""
    out: set[str] = set()
    by_voter: dict[str, list[float]] = {}
    for m in group:
        if m.size > 0:
            by_voter.setdefault(voter(m), []).append(m.size)
    sizes = [_median_without(sorted(v), -1) for v in by_voter.values()]
    median = float(np.median(sizes)) if sizes else 0.0
    for m in group:
        if m.size > 0 and median > 0 and abs(m.size / median - 1.0) > SIZE_TOLERANCE:
            out.add(m.job_id)
    measured = [m for m in group if m.job_id not in out and m.steps]
    tol = 1.0 + COMPUTE_TOLERANCE
    while len({voter(m) for m in measured}) > 1:  # the worst first, then the rest again
        scores = _scores(measured, voter)
        worst = max(range(len(measured)), key=lambda i: scores[i])
        if scores[worst] <= tol:
            break
        # its voter's other jobs are measured against the same others: decided as well
        v = voter(measured[worst])
        gone = {
            m.job_id for m, s in zip(measured, scores, strict=True) if voter(m) == v and s > tol
        }
        out |= gone
        measured = [m for m in measured if m.job_id not in gone]
    return out


def _scores(measured: Sequence[_Member], voter: Callable[[_Member], str]) -> list[float]:
    """How far each job's measurements are from the other voters' (1: within the band):
    the median of its ratios, or the square root of the largest, whichever is more."""
    compute: dict[int, dict[str, list[float]]] = {}
    steps: dict[str, dict[Config, list[float]]] = {}
    for m in measured:
        for b, c in m.compute.items():
            compute.setdefault(b, {}).setdefault(voter(m), []).append(c)
        mine = steps.pop(voter(m), {})
        steps[voter(m)] = mine  # (re)inserted: the most recent voter last
        for cfg, t in m.steps.items():
            mine.setdefault(cfg, []).append(t)
    by_compute = _Consensus(compute)
    own = {v: {c: _median_without(sorted(ts), -1) for c, ts in by.items()}
           for v, by in steps.items()}  # fmt: skip
    peers = _Peers(list(reversed(own)), own) if any(m.loose for m in measured) else None
    others: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    scores = []
    for m in measured:
        v = voter(m)
        if v not in others:  # the others' compute: one pass per voter
            others[v] = by_compute.without(v)
        ratios = _compute_ratios(m.compute, others[v])
        if m.loose and peers is not None:
            ratios += peers.ratios(m.loose, v)
        ratios.sort()
        scores.append(max(_median_without(ratios, -1), math.sqrt(ratios[-1])) if ratios else 1.0)
    return scores


def model_keys(
    jobs: Sequence[JobView],
    history: Sequence[CompletedJob] = (),
    across_owners: bool = False,
) -> tuple[dict[str, str], dict[str, str]]:
    """The pooling key of every running job and of every completed one (by job id).

    A job keeps its ``application`` (with ``across_owners``, its fingerprint's group where
    the other owners agree with it) unless its own report or measurements contradict its
    group; then its key is its own (``application#job_id``).
    """
    apps = {h.job_id: h.application for h in history} | {j.job_id: j.application for j in jobs}
    members = [_member(h.job_id, h.application, h.model_bytes, h.profile) for h in history]
    members += [_member(j.job_id, j.application, j.model_bytes, j.profile) for j in jobs]
    key: dict[str, str] = {}
    if across_owners:
        shared: dict[str, list[_Member]] = {}
        for m in members:
            g = group_of(apps[m.job_id], True)
            if g != apps[m.job_id]:
                shared.setdefault(g, []).append(m)
        for g, group in shared.items():
            if len({m.owner for m in group}) < 2:
                continue  # one owner's jobs: its own group, as without the opt-in
            out = _outliers(group, lambda m: m.owner)
            key |= {m.job_id: g for m in group if m.job_id not in out}
    # the rest by their own key: one owner's (or a simulation's) jobs, each a voter
    groups: dict[str, list[_Member]] = {}
    for m in members:
        if m.job_id not in key:
            groups.setdefault(apps[m.job_id], []).append(m)
    for app, group in groups.items():
        out = _outliers(group, lambda m: m.job_id) if len(group) > 1 else set()
        key |= {m.job_id: f"{app}#{m.job_id}" if m.job_id in out else app for m in group}
    return (
        {j.job_id: key[j.job_id] for j in jobs},
        {h.job_id: key[h.job_id] for h in history},
    )


def pooled_profiles(
    jobs: Sequence[JobView],
    history: Sequence[CompletedJob],
    keys: Mapping[str, str],
    hist_keys: Mapping[str, str],
) -> dict[str, list[StepSample]]:
    """The step samples each key's model is fitted on. One owner's key: every sample of its
    jobs (completed first). A group of several owners (the site's opt-in): one sample per
    configuration, the median over owners of each owner's median."""
    members: dict[str, list[tuple[str, Sequence[StepSample]]]] = {}
    for h in history:
        members.setdefault(hist_keys[h.job_id], []).append((owner_of(h.application), h.profile))
    for j in jobs:
        members.setdefault(keys[j.job_id], []).append((owner_of(j.application), j.profile))
    out: dict[str, list[StepSample]] = {}
    for k, group in members.items():
        if len({o for o, _ in group}) < 2:
            out[k] = [s for _, profile in group for s in profile]
            continue
        by_cfg: dict[Config, dict[str, list[StepSample]]] = {}
        for owner, profile in group:
            for s in profile:
                cfg = (s.nodes, s.gpus, s.micro_batch, max(1, s.accum_steps))
                by_cfg.setdefault(cfg, {}).setdefault(owner, []).append(s)
        rows = []
        for (n, g, b, acc), by_owner in sorted(by_cfg.items()):
            steps = [float(np.median([s.step_time for s in ss])) for ss in by_owner.values()]
            syncs = [float(np.median([s.sync_time for s in ss])) for ss in by_owner.values()]
            rows.append(StepSample(n, g, b, float(np.median(steps)), float(np.median(syncs)), acc))
        out[k] = rows
    return out


class AcrossOwners:
    """``policy`` with the site's opt-in: jobs of every owner that report one model
    fingerprint pool what was learned of it (``Snapshot.pool_across_owners``)."""

    def __init__(self, policy: Policy) -> None:
        self.inner = policy
        self.name = policy.name

    def schedule(self, snapshot: Snapshot) -> Plan:
        return self.inner.schedule(replace(snapshot, pool_across_owners=True))

    def __getattr__(self, attr: str) -> Any:
        if attr == "inner":  # not set yet (a copy being made): no recursion
            raise AttributeError(attr)
        return getattr(self.inner, attr)
