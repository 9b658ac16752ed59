"""Placement of a GPU-count schedule on the nodes (used by ``ones``).

Jobs whose GPU count is unchanged keep their nodes (moving them would restart them). Every
other job restarts anyway and is placed afresh, largest first, on the fewest nodes: whole
free nodes, then the remainder on the best-fitting node. Where the free GPUs are too
scattered for that, a job spread over more nodes than it needs is compared, with the
step-time model, against fewer GPUs on fewer nodes (cross-node all-reduce can make a
spread job several times slower than a packed one), and the faster is taken. GPUs left
free go, node by node, to the job that gains most from them without spanning more nodes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from hpcorch.policy.common import free_gpus, job_plan, place_packed, split_batch
from hpcorch.policy.estimate import Estimates
from hpcorch.policy.ones_ops import Group, fits_groups
from hpcorch.policy.types import JobPlan, Plan, Snapshot


def fit_nodes(free: list[int], gpus: int, per_node: int) -> dict[int, int] | None:
    """``gpus`` on the fewest nodes: whole free nodes, then the remainder on the node
    that fits it best. None if the free GPUs do not allow that many nodes."""
    arr = np.asarray(free)
    whole = [int(n) for n in np.flatnonzero(arr >= per_node)]
    k, r = divmod(gpus, per_node)
    if len(whole) < k:
        return None
    out = {n: per_node for n in whole[:k]}
    if r == 0:
        return out if k else None
    fits = arr >= r
    fits[list(out)] = False
    cand = np.flatnonzero(fits)
    if not cand.size:
        return None
    out[int(cand[np.argmin(arr[cand])])] = r  # the fullest that fits; the lowest such node
    return out


def _take(free: list[int], placement: Mapping[int, int]) -> None:
    for node, c in placement.items():
        free[node] -= c


def place_schedule(
    snapshot: Snapshot,
    est: Estimates,
    value: np.ndarray,
    schedule: np.ndarray,
    groups: Sequence[Group] = (),
) -> Plan:
    """Place the GPU counts ``schedule`` (one per job of ``est``); ``value[j, g]`` is the
    score of job ``j`` on ``g`` GPUs, used to hand out GPUs the placement leaves free
    (within the group limits ``groups``)."""
    jobs = snapshot.jobs
    g = schedule.copy()
    per_node = max(snapshot.node_gpus)
    placements = {i: dict(j.placement) for i, j in enumerate(jobs) if g[i] > 0 and g[i] == j.gpus}
    free = free_gpus(snapshot, {jobs[i].job_id: p for i, p in placements.items()})
    rest = [i for i in range(len(jobs)) if g[i] > 0 and i not in placements]
    for i in sorted(rest, key=lambda i: -int(g[i])):
        gi = int(g[i])
        placed = fit_nodes(free, gi, per_node)
        if placed is None:
            gi, placed = _spread_or_fewer(snapshot, est, free, i, gi, per_node)
        if placed is None:
            g[i] = 0
            continue
        _take(free, placed)
        placements[i] = placed
        g[i] = gi
    _refill(est, value, free, placements, g, groups)
    plans: list[JobPlan] = []
    for i, p in sorted(placements.items()):
        plans.append(job_plan(jobs[i], p, int(est.batch[i, int(g[i])])))
    return Plan(tuple(plans))


def _spread_or_fewer(
    snapshot: Snapshot, est: Estimates, free: list[int], i: int, gpus: int, per_node: int
) -> tuple[int, dict[int, int] | None]:
    """The faster of ``gpus`` spread over the most-free nodes and fewer GPUs on fewer."""
    spread = place_packed(list(free), gpus)
    job = snapshot.jobs[i]
    model = est.models.get(est.keys.get(job.job_id, job.application))
    t = float(est.time[i, gpus])
    if spread is None or model is None or not np.isfinite(t):
        return gpus, spread
    need = -(-gpus // per_node)
    _, micro, accum = split_batch(job, gpus, int(est.batch[i, gpus]))
    it = model.iteration_time(
        np.array([len(spread), need]),
        np.array([gpus, gpus]),
        np.array([micro, micro]),
        np.array([accum, accum]),
    )
    best_t = t * float(it[0]) / float(it[1])  # est.time assumes the fewest nodes
    best, placed = gpus, spread
    desc = sorted(free, reverse=True)
    for nodes in range(1, need + 1):
        cap = min(gpus - 1, sum(desc[:nodes]))
        if cap < max(int(est.gmin[i]), 1):
            continue
        alt = fit_nodes(free, cap, per_node)
        if alt is None or len(alt) > nodes:
            continue
        if float(est.time[i, cap]) < best_t:
            best_t, best, placed = float(est.time[i, cap]), cap, alt
    return best, placed


def _refill(
    est: Estimates,
    value: np.ndarray,
    free: list[int],
    placements: dict[int, dict[int, int]],
    g: np.ndarray,
    groups: Sequence[Group] = (),
) -> None:
    """Give each node's free GPUs to the job that gains most from them there: a job
    already on that node, or a waiting job starting on it (the first such job and the
    fewest GPUs where gains tie)."""
    if groups:
        _refill_within(est, value, free, placements, g, groups)
        return
    width, n = value.shape[1], len(g)
    unplaced = np.ones(n, dtype=bool)
    on_node: dict[int, list[int]] = {}
    for i, p in placements.items():
        unplaced[i] = False
        for node in p:
            on_node.setdefault(node, []).append(i)
    gmin = np.asarray(est.gmin, dtype=np.int64)
    gmax = np.asarray(est.gmax, dtype=np.int64)
    for node in range(len(free)):
        while free[node] > 0:
            elig = unplaced.copy()
            elig[on_node.get(node, [])] = True
            idx = np.flatnonzero(elig)
            if not idx.size:
                break
            have = g[idx].astype(np.int64)
            d = np.arange(1, free[node] + 1)
            k = have[:, None] + d[None, :]
            ok = d[None, :] >= np.maximum(gmin[idx] - have, 1)[:, None]
            ok &= (k < width) & (k <= gmax[idx][:, None])
            with np.errstate(invalid="ignore"):
                gain = value[idx[:, None], np.minimum(k, width - 1)] - value[idx, have][:, None]
            gain = np.where(ok & ~np.isnan(gain), gain, -np.inf)
            best = int(np.argmax(gain))  # row-major: the first job, then the fewest GPUs
            if not gain.flat[best] > 0.0:
                break
            row, col = divmod(best, free[node])
            best_i, best_d = int(idx[row]), col + 1
            p = placements.setdefault(best_i, {})
            if node not in p:
                on_node.setdefault(node, []).append(best_i)
            unplaced[best_i] = False
            p[node] = p.get(node, 0) + best_d
            g[best_i] += best_d
            free[node] -= best_d


def _refill_within(
    est: Estimates,
    value: np.ndarray,
    free: list[int],
    placements: dict[int, dict[int, int]],
    g: np.ndarray,
    groups: Sequence[Group],
) -> None:
    """:func:`_refill` under the group limits ``groups`` (job by job)."""
    width = value.shape[1]
    for node in range(len(free)):
        while free[node] > 0:
            best_gain, best_i, best_d = 0.0, -1, 0
            for i in range(len(g)):
                p = placements.get(i)
                if p is not None and node not in p:
                    continue
                lo = max(int(est.gmin[i]) - int(g[i]), 1)
                for d in range(lo, free[node] + 1):
                    k = int(g[i]) + d
                    if k >= width or k > est.gmax[i] or not fits_groups(groups, g, i, d):
                        break
                    gain = float(value[i, k] - value[i, int(g[i])])
                    if gain > best_gain:
                        best_gain, best_i, best_d = gain, i, d
            if best_i < 0:
                break
            p = placements.setdefault(best_i, {})
            p[node] = p.get(node, 0) + best_d
            g[best_i] += best_d
            free[node] -= best_d
