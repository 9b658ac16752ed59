"""Which jobs share what was learned of them: pooled knowledge as a prior, never as truth.

Jobs (running and completed) that report the same ``application`` key are presumed to run
the same model, so their step times and gradient-noise histories are pooled. The key is
what identifies a model (the controller builds it from the owner and ``--app``, or from
the fingerprint the runtime reports), but a presumption only: a job leaves its group and
is modelled on its own measurements alone as soon as it shows it is another model:

* it reports a model size (gradient bytes) more than ``SIZE_TOLERANCE`` away from the
  group's median, or
* its measured compute time per micro-step is more than a factor ``1 + COMPUTE_TOLERANCE``
  (median over its own points) outside what the other members measured: interpolated
  between their per-GPU batches, and outside them between the nearest one's time and that
  time scaled by the batch (compute grows with the batch, at most proportionally).

Pure: jobs in, a key per job out.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

import numpy as np

from hpcorch.policy.types import CompletedJob, JobView, StepSample

SIZE_TOLERANCE = 0.1
COMPUTE_TOLERANCE = 1.0


def _compute_points(profile: Sequence[StepSample]) -> dict[int, float]:
    """Per-GPU batch -> least compute seconds of one micro-step the job measured."""
    out: dict[int, float] = {}
    for s in profile:
        if s.step_time <= 0 or s.micro_batch <= 0:
            continue
        if s.gpus == 1:
            c = s.step_time
        elif s.sync_time > 0:
            c = s.step_time - s.sync_time
        else:
            continue  # the all-reduce part is not known: not comparable
        out[s.micro_batch] = min(out.get(s.micro_batch, c), max(c, 1e-9))
    return out


def _disagrees(own: dict[int, float], curve: tuple[np.ndarray, np.ndarray] | None) -> bool:
    if not own or curve is None:
        return False
    bs, cs = curve
    ratios = []
    for b, c in own.items():
        # the band the others' curve allows at b: interpolated inside their batches;
        # outside, compute is monotone in the batch and grows at most proportionally
        if b < bs[0]:
            lo, hi = cs[0] * b / bs[0], cs[0]
        elif b > bs[-1]:
            lo, hi = cs[-1], cs[-1] * b / bs[-1]
        else:
            lo = hi = float(np.interp(b, bs, cs))
        ratios.append(max(c / hi, lo / c, 1.0))
    return float(np.median(ratios)) > 1.0 + COMPUTE_TOLERANCE


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


def model_keys(
    jobs: Sequence[JobView], history: Sequence[CompletedJob] = ()
) -> tuple[dict[str, str], dict[str, str]]:
    """The pooling key of every running job and of every completed one (by job id).

    A job keeps its ``application`` unless its own report or measurements contradict its
    group; then its key is its own (``application#job_id``).
    """
    members: dict[str, list[tuple[str, int, dict[int, float]]]] = {}
    for h in history:
        members.setdefault(h.application, []).append(
            (h.job_id, h.model_bytes, _compute_points(h.profile))
        )
    for j in jobs:
        members.setdefault(j.application, []).append(
            (j.job_id, j.model_bytes, _compute_points(j.profile))
        )
    own: set[str] = set()
    for group in members.values():
        if len(group) < 2:
            continue
        sizes = [b for _, b, _ in group if b > 0]
        median = float(np.median(sizes)) if sizes else 0.0
        for job_id, size, _pts in group:
            if size > 0 and median > 0 and abs(size / median - 1.0) > SIZE_TOLERANCE:
                own.add(job_id)
        measured = [(k, p) for k, _, p in group if k not in own and p]
        merged: dict[int, list[float]] = {}
        for _, pts in measured:
            for b, c in pts.items():
                merged.setdefault(b, []).append(c)
        ranked = {b: sorted(v) for b, v in merged.items()}
        base = {b: _median_without(v, -1) for b, v in ranked.items()}
        bs_all = np.array(sorted(base), dtype=float)
        cs_all = np.array([base[int(b)] for b in bs_all])
        for job_id, pts in measured:
            # the others' curve: the group's, less this job's own points (one pass per group)
            cs = cs_all.copy()
            keep = np.ones(len(bs_all), dtype=bool)
            for b, c in pts.items():
                vals = ranked[b]
                k = int(np.searchsorted(bs_all, b))
                if len(vals) > 1:
                    cs[k] = _median_without(vals, bisect.bisect_left(vals, c))
                else:
                    keep[k] = False
            curve = (bs_all[keep], cs[keep]) if keep.any() else None
            if _disagrees(pts, curve):
                own.add(job_id)

    def key(app: str, job_id: str) -> str:
        return f"{app}#{job_id}" if job_id in own else app

    return (
        {j.job_id: key(j.application, j.job_id) for j in jobs},
        {h.job_id: key(h.application, h.job_id) for h in history},
    )
