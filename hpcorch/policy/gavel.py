"""Gavel: heterogeneity-aware least attained service (Narayanan et al., OSDI 2020).

The field's baseline for pools of several GPU types. Jobs are not elastic: each runs with
the GPU count (its scale factor ``s_j``) and the batch it requested, on one type.

1. **Throughput matrix** ``X[j, k]``: the job's speed on type ``k`` at its requested
   scale, ``1 / time[j, s_j]`` from :func:`hpcorch.policy.typed.type_estimates` (0 where
   the job does not accept the type, the type holds fewer GPUs than the job's minimum, or
   nothing is known there). A job known on no type counts as equally fast on every type
   it accepts (Gavel assumes profiled throughputs; nothing is known before a job runs).
2. **Policy**: time fractions ``x[j, k]`` that maximize ``min_j X_j . x_j / (w_j X^eq_j)``
   subject to ``sum_k x[j, k] <= 1`` and ``sum_j s_j x[j, k] <= N_k``, where ``X^eq_j`` is
   the job's throughput on an equal ``1/n`` share of every type's GPUs (its time on them
   scaled to at most 1) and ``w_j`` its weight. At that level the total normalized
   throughput is then maximized (one step of Gavel's water filling), so capacity the
   bottleneck jobs cannot use goes to the others rather than idling.
3. **Mechanism**: every ``round_s`` seconds, priority ``x[j, k] / f[j, k]``, ``f`` the
   fraction of its time in the pool the job has run on type ``k`` (from what runs, kept
   across calls); (job, type) pairs are taken in priority order, a job at most once, while
   the type has GPUs free, and packed on the fewest nodes of the type. A job picked again
   where it runs keeps its nodes. Between rounds running jobs keep their GPUs and free
   GPUs go to waiting jobs in priority order.

**Solver** (numpy only): both linear programs by a Mehrotra predictor-corrector interior
point method whose Newton systems are reduced, job by job, to a dense system of (types +
1) unknowns: O(jobs x types^3) per iteration, 7-35 iterations. On 300 random instances
(up to 30 jobs, 4 types) the max-min level agreed with HiGHS' to 2e-7 (relative); the
second step keeps every job within ``SLACK`` (1e-6) of it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from hpcorch.policy.common import free_gpus, job_plan, keep_plan, place_packed
from hpcorch.policy.cpus import fit_cpus
from hpcorch.policy.types import JobPlan, Plan, Snapshot

if TYPE_CHECKING:
    from hpcorch.policy.typed import TypedEstimates

TOL = 1e-10
SLACK = 1e-6  # the second step keeps every job at (1 - SLACK) x the max-min level or more


class _LP:
    """min cx.x + ct t  s.t.  w_j t <= a_j.x_j, sum_k x_jk <= 1, sum_j S_jk x_jk <= 1,
    x >= 0 (x_jk = 0 where a_jk = 0), t >= t_lo if given. Each constraint is one entry of
    the slacks ``s`` and duals ``lam``, in blocks: x >= 0 (n x T), throughput (n), time
    (n), capacity (T), t >= t_lo (1); ``mk`` masks the rows that do not exist."""

    def __init__(self, a: np.ndarray, w: np.ndarray, S: np.ndarray, t_lo: float | None):
        n, T = a.shape
        self.a, self.w, self.S, self.m = a, w, S, (a > 0).astype(float)
        self.mk = np.concatenate((self.m.ravel(), np.ones(2 * n + T), [float(t_lo is not None)]))
        self.h = np.concatenate((np.zeros(n * T + n), np.ones(n + T), [-(t_lo or 0.0)]))
        self.cuts = np.cumsum([n * T, n, n, T])

    def G(self, x: np.ndarray, t: float) -> np.ndarray:
        a, m, S = self.a, self.m, self.S
        rows = (-x.ravel(), self.w * t - (a * x).sum(1), (m * x).sum(1), (S * x).sum(0), [-t])
        return np.concatenate(rows) * self.mk

    def GT(self, u: np.ndarray) -> tuple[np.ndarray, float]:
        u0, u1, u2, u3, u4 = np.split(u, self.cuts)
        ux = -u0.reshape(self.m.shape) - self.a * u1[:, None] + self.m * u2[:, None]
        return (ux + self.S * u3[None, :]) * self.m, float((self.w * u1).sum() - u4[0])

    def solve(self, cx: np.ndarray, ct: float, iters: int = 100) -> np.ndarray:
        """The best x found (the iterate with the least gap and residuals)."""
        m, mk, h = self.m, self.mk, self.h
        x = 0.5 * m / m.sum(1, keepdims=True)
        x *= np.minimum(1.0, 0.5 / np.maximum((self.S * x).sum(0), 1e-12))
        t = float(((self.a * x).sum(1) / self.w).min()) - 1.0
        s = np.where(mk > 0, np.maximum(h - self.G(x, t), 0.1), 1.0)
        lam = mk.copy()
        best, best_x = np.inf, x
        for _ in range(iters):
            rp = (self.G(x, t) + s - h) * mk
            gx, gt = self.GT(lam)
            rdx, rdt = (cx + gx) * m, ct + gt
            mu = float((lam * s).sum()) / mk.sum()
            merit = max(mu, np.abs(rp).max(), np.abs(rdx).max(initial=0.0), abs(rdt))
            if merit < best:
                best, best_x = merit, x
            if merit < TOL or merit > 1e3 * best:  # done, or round-off took over
                break
            try:
                dx, dt, dlam, ds = self._step(s, lam, rp, rdx, rdt)
            except np.linalg.LinAlgError:
                break
            x, t, s, lam = x + dx, t + dt, s + ds, lam + dlam
        return np.asarray(np.clip(best_x * m, 0.0, 1.0))

    def _step(
        self, s: np.ndarray, lam: np.ndarray, rp: np.ndarray, rdx: np.ndarray, rdt: float
    ) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
        """One Mehrotra predictor-corrector step, scaled to stay interior. The Newton
        system ``G' D G dz = r`` (D = lam / s) is solved by eliminating each job's T x T
        block, which leaves the T capacity multipliers and dt: a (T + 1) dense system."""
        a, w, m, S, mk = self.a, self.w, self.m, self.S, self.mk
        n, T = a.shape
        D = mk * lam / s
        d0, d1, d2, d3, d4 = np.split(D, self.cuts)
        B = d1[:, None, None] * a[:, :, None] * a[:, None, :]
        B += d2[:, None, None] * m[:, :, None] * m[:, None, :]
        diag = B[:, np.arange(T), np.arange(T)]
        B[:, np.arange(T), np.arange(T)] += (
            d0.reshape(n, T) + (1 - m) + 1e-14 * diag.max(1)[:, None]
        )
        Binv = np.linalg.inv(B)
        b = -(d1 * w)[:, None] * a
        Q = Binv * S[:, None, :]
        R = np.einsum("jik,jk->ji", Binv, b)
        K = np.empty((T + 1, T + 1))
        K[:T, :T] = np.einsum("jk,jkl->kl", S, Q) + np.diag(1.0 / np.maximum(d3, 1e-300))
        K[:T, T] = K[T, :T] = (S * R).sum(0)
        K[T, T] = (b * R).sum() - (d1 * w * w).sum() - d4[0]

        def lin(rx: np.ndarray, rt: float) -> tuple[np.ndarray, float]:
            P = np.einsum("jik,jk->ji", Binv, rx)
            sol = np.linalg.solve(K, np.append((S * P).sum(0), (b * P).sum() - rt))
            return (P - np.einsum("jik,k->ji", Q, sol[:T]) - R * sol[T]) * m, float(sol[T])

        def direction(rc: np.ndarray) -> tuple[np.ndarray, float, np.ndarray, np.ndarray]:
            ux, ut = self.GT(D * rp + mk * rc / s)
            rx, rt = -rdx - ux, -rdt - ut
            dx, dt = lin(rx, rt)
            for _ in range(2):  # iterative refinement on the operator G' D G itself
                mx, mt = self.GT(D * self.G(dx, dt))
                ex, et = lin(rx - mx, rt - mt)
                dx, dt = dx + ex, dt + et
            gd = self.G(dx, dt)
            return dx, dt, D * (gd + rp) + mk * rc / s, -(rp + gd) * mk

        def reach(v: np.ndarray, dv: np.ndarray) -> float:
            neg = dv < 0
            return float(min(1.0, (-v[neg] / dv[neg]).min(initial=np.inf)))

        mu = float((lam * s).sum()) / mk.sum()
        _, _, dla, dsa = direction(-lam * s * mk)
        ap, ad = reach(s, dsa), reach(lam, dla)
        sigma = (float(((lam + ad * dla) * (s + ap * dsa)).sum()) / mk.sum() / mu) ** 3
        dx, dt, dl, ds = direction(mk * (sigma * mu - lam * s - dla * dsa))
        ap, ad = min(1.0, 0.99 * reach(s, ds)), min(1.0, 0.99 * reach(lam, dl))
        return ap * dx, ap * dt, ad * dl, ap * ds


def max_min_shares(
    thr: np.ndarray, w: np.ndarray, scale: np.ndarray, cap: np.ndarray, *, spread: bool = True
) -> tuple[np.ndarray, float]:
    """Gavel's heterogeneity-aware max-min time fractions (see the module's docstring).

    ``thr`` (jobs, types): throughput (0: cannot run there); ``w`` weights; ``scale``
    (jobs, types): GPUs the job takes on the type; ``cap`` GPUs per type. Returns ``x``
    and the max-min level of ``X_j . x_j / (w_j X^eq_j)``. ``spread``: also maximize the
    total normalized throughput at that level. Jobs that run nowhere get zeros.
    """
    n, T = thr.shape
    x = np.zeros((n, T))
    ok = (thr > 0) & (scale > 0) & (cap[None, :] > 0)
    rows = np.flatnonzero(ok.any(1))
    if not len(rows):
        return x, 0.0
    ok, thr, scale, w = ok[rows], thr[rows], scale[rows].astype(float), w[rows]
    eq = np.where(ok, cap[None, :] / (len(rows) * np.maximum(scale, 1.0)), 0.0)
    eq /= np.maximum(eq.sum(1, keepdims=True), 1.0)  # a job's time sums to at most 1
    a = np.where(ok, thr / (thr * eq).sum(1, keepdims=True), 0.0)
    S = np.where(ok, scale / np.maximum(cap[None, :], 1.0), 0.0)
    y = _LP(a, w, S, None).solve(np.zeros_like(a), -1.0)
    level = float(((a * y).sum(1) / w).min())
    if spread:
        y = _LP(a, w, S, level * (1 - SLACK)).solve(-a / w[:, None] / len(rows), 0.0)
    x[rows] = y
    return x, float(((a * y).sum(1) / w).min())


def _typed_estimates(snapshot: Snapshot, top: int) -> TypedEstimates:
    from hpcorch.policy.typed import type_estimates  # numpy-only; imported when typed

    return type_estimates(snapshot, explore=float(top), gpu_cap=top, first_gpus=top)


@dataclass
class GavelPolicy:
    """Heterogeneity-aware LAS with Gavel's round-based mechanism (state across calls)."""

    round_s: float = 360.0
    """Gavel's round (6 minutes in the paper): jobs rotate only at a round's start."""
    forget_s: float = 3600.0
    """A job missing this long (finished or left) is forgotten."""
    name: str = "gavel"
    shares: dict[str, dict[str, float]] = field(default_factory=dict)
    """The last time fractions computed: job -> type -> fraction."""
    _got: dict[str, dict[str, float]] = field(default_factory=dict)
    _age: dict[str, float] = field(default_factory=dict)
    _seen: dict[str, float] = field(default_factory=dict)
    _last: float | None = None
    _round_at: float | None = None

    def _account(self, snapshot: Snapshot, types: tuple[str, ...]) -> None:
        """Credit the seconds since the last call to what ran; forget jobs long gone."""
        now = snapshot.now
        dt = 0.0 if self._last is None else max(0.0, now - self._last)
        self._last = now
        for j in snapshot.jobs:
            kind = snapshot.type_of(j.placement)
            if j.job_id in self._age and j.running and kind in types:
                got = self._got.setdefault(j.job_id, {})
                got[kind] = got.get(kind, 0.0) + dt
            self._age[j.job_id] = self._age.get(j.job_id, -dt) + dt  # 0 when first seen
            self._seen[j.job_id] = now
        for key in [k for k, t in self._seen.items() if now - t > self.forget_s]:
            for d in (self._seen, self._age, self._got, self.shares):
                d.pop(key, None)

    def schedule(self, snapshot: Snapshot) -> Plan:
        types = snapshot.gpu_types or ("",)
        self._account(snapshot, types)
        jobs = snapshot.jobs
        if not jobs or not snapshot.node_gpus:
            return Plan()
        kinds = snapshot.node_types if snapshot.gpu_types else ("",) * len(snapshot.node_gpus)
        nodes = [tuple(i for i, t in enumerate(kinds) if t == k) for k in types]
        cap = np.array([sum(snapshot.node_gpus[i] for i in ns) for ns in nodes], dtype=float)
        req = np.array([min(max(j.requested_gpus, j.min_gpus), j.max_gpus) for j in jobs])
        g = np.minimum(req[:, None], cap[None, :].astype(np.int64))
        ok = g >= np.array([max(j.min_gpus, 1) for j in jobs])[:, None]
        ok &= [[not j.gpu_types or k in j.gpu_types or k == "" for k in types] for j in jobs]
        thr = _throughputs(snapshot, types, g, ok)
        w = np.array([max(j.weight, 1e-6) for j in jobs])
        x, _ = max_min_shares(thr, w, g, cap)
        x[x < 1e-6] = 0.0
        self.shares = {
            j.job_id: dict(zip(types, x[i].tolist(), strict=True)) for i, j in enumerate(jobs)
        }
        age = np.array([self._age[j.job_id] for j in jobs])
        got = np.array([[self._got.get(j.job_id, {}).get(k, 0.0) for k in types] for j in jobs])
        frac = np.divide(got, age[:, None], out=np.zeros_like(got), where=age[:, None] > 0)
        prio = x / np.maximum(frac, 1e-9)
        new_round = self._round_at is None or snapshot.now - self._round_at >= self.round_s
        if new_round:
            self._round_at = snapshot.now
        index = {k: i for i, k in enumerate(types)}
        chosen: dict[int, int] = {}
        stay: set[int] = set()  # they keep their GPUs
        left = cap.copy()
        for i, j in enumerate(jobs):  # fixed jobs, and between rounds every running job
            kind = snapshot.type_of(j.placement)
            if j.running and (not j.resizable or (not new_round and kind in index)):
                chosen[i] = index.get(kind, -1)
                stay.add(i)
                for node, c in j.placement.items():
                    left[index[kinds[node]]] -= c
        submit = np.repeat([j.submit_time for j in jobs], len(types))
        for pair in np.lexsort((submit, -x.ravel(), -prio.ravel())):
            i, k = divmod(int(pair), len(types))
            if i not in chosen and ok[i, k] and g[i, k] <= left[k]:
                chosen[i] = k
                left[k] -= g[i, k]
                j = jobs[i]
                if j.running and j.gpus == g[i, k] and snapshot.type_of(j.placement) == types[k]:
                    stay.add(i)  # picked again where it runs: it keeps its nodes
        free = free_gpus(snapshot, {jobs[i].job_id: jobs[i].placement for i in stay})
        plans: list[JobPlan] = []
        for i in sorted(stay):
            kind = snapshot.type_of(jobs[i].placement)
            plans.append(replace(keep_plan(jobs[i]), gpu_type="" if "+" in kind else kind))
        for i, k in sorted(chosen.items(), key=lambda p: (-g[p], p[0])):
            if i in stay:
                continue
            where = place_packed([free[n] for n in nodes[k]], int(g[i, k]))
            assert where is not None  # the count fits the type's free GPUs
            placement = {nodes[k][n]: c for n, c in where.items()}
            for n, c in placement.items():
                free[n] -= c
            plan = job_plan(jobs[i], placement, jobs[i].requested_batch)
            plans.append(replace(plan, gpu_type=types[k]))
        return fit_cpus(snapshot, Plan(tuple(plans)))


def _throughputs(
    snapshot: Snapshot, types: tuple[str, ...], g: np.ndarray, ok: np.ndarray
) -> np.ndarray:
    """X[j, k] (see the module's docstring); ``ok`` loses the types a job does not accept."""
    n = len(snapshot.jobs)
    thr = np.zeros(g.shape)
    if len(types) > 1 and ok.any():
        te = _typed_estimates(snapshot, max(1, int(g[ok].max())))
        for k, kind in enumerate(types):
            e = te.est[te.types.index(kind)]
            tk = e.time[np.arange(n), np.minimum(g[:, k], e.time.shape[1] - 1)]
            good = (g[:, k] < e.time.shape[1]) & np.isfinite(tk) & (tk > 0)
            thr[good, k] = 1.0 / tk[good]
            ok[:, k] &= te.accepts[:, te.types.index(kind)]
    thr[~(thr * ok > 0).any(1)] = 1.0  # nothing known anywhere: alike where it may run
    return np.where(ok, thr, 0.0)
