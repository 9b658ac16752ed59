"""Step-time model fitted online from the step times jobs report (pure numpy).

One model per job, or per group of jobs known to run the same model (their measurements
pooled). A micro-step on ``r`` GPUs is its compute plus the part of the gradient all-reduce
that the backward pass does not hide:

* compute of one micro-step at per-GPU batch ``b``: piecewise-linear through the measured
  points (single-GPU step times, or step - all-reduce of any measurement), extrapolated
  with a least-squares line; with one point, a fixed part ``FIXED_FRACTION`` of it does
  not grow with the batch;
* all-reduce ``m`` of a step: within one node it grows with the GPUs (``m = u x (r - 1)``),
  across nodes it is about constant in the node count (a ring moves twice the gradient
  whatever the ring's length); the step waits for ``max(m - OVERLAP x compute,
  FLOOR x m)`` of it (the backward pass hides part of it);
* ``u`` per kind (one node / several nodes) is inverse-distance weighted over the job's
  own measurements of that kind in (log nodes, log GPUs, log batch), exact at measured
  points. Where a kind was never measured, the prior is physical: the gradient bytes the
  job reports times the seconds per byte the cluster showed on other jobs
  (:class:`Network`, learned across applications); without a reported size, a fraction of
  the compute time (``PRIOR_INTRA`` / ``PRIOR_INTER``);
* an iteration with ``k`` micro-steps (gradient accumulation) costs
  ``step + (k - 1) x compute``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np


class StepLike(Protocol):
    """One measured configuration (e.g. :class:`hpcorch.policy.types.StepSample`)."""

    @property
    def nodes(self) -> int: ...
    @property
    def gpus(self) -> int: ...
    @property
    def micro_batch(self) -> int: ...
    @property
    def step_time(self) -> float: ...
    @property
    def sync_time(self) -> float: ...


# Overhead as a fraction of the compute time, before any measurement of that kind, for a
# job that does not report its size.
PRIOR_INTRA = 0.1
PRIOR_INTER = 1.0
# Prior compute time per micro-step at the initial batch, before the first measurement.
PRIOR_COMPUTE_S = 0.2
# Part of a single measured compute time that does not grow with the batch.
FIXED_FRACTION = 0.2
# Part of the compute that hides the all-reduce, and the least part of it always waited.
OVERLAP = 0.25
FLOOR = 0.1
# Fraction by which the all-reduce of a kind of configuration the job (or its group) never
# ran is assumed shorter than the prior says: optimism drives it to measure it.
OPTIMISM = 0.0
# Seconds per gradient byte before any job measured a kind: one node's GPUs over PCIe
# (per GPU beyond the first) and a 10 Gb/s network between nodes.
DEFAULT_INTRA_S_PER_BYTE = 1 / 4e9
DEFAULT_INTER_S_PER_BYTE = 1 / 0.6e9


@dataclass(frozen=True)
class Network:
    """Seconds of all-reduce per gradient byte: a property of the cluster, not of a job."""

    intra: float = DEFAULT_INTRA_S_PER_BYTE
    """Within one node, per GPU beyond the first."""
    inter: float = DEFAULT_INTER_S_PER_BYTE
    """Across nodes."""
    measured: tuple[bool, bool] = (False, False)
    """Whether ``intra`` / ``inter`` come from measurements (else defaults)."""


def _hidden(m: np.ndarray, comp: np.ndarray) -> np.ndarray:
    """Seconds of all-reduce ``m`` the step waits for beside compute ``comp``."""
    return np.asarray(np.maximum(m - OVERLAP * comp, FLOOR * m))


def _unhide(over: float, comp: float) -> float:
    """The all-reduce ``m`` whose waited part beside ``comp`` is ``over`` (inverse)."""
    over = max(over, 0.0)
    m = over + OVERLAP * comp
    return m if over >= FLOOR * m else over / FLOOR


def _scale(nodes: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """All-reduce growth with the GPU count: ``r - 1`` on one node, flat across nodes."""
    return np.where(nodes > 1, 1.0, np.maximum(gpus - 1.0, 0.0))


class ThroughputModel:
    """Predicts seconds per iteration for (nodes, GPUs, micro-batch, accumulation)."""

    def __init__(
        self,
        samples: Iterable[StepLike],
        min_batch: int = 1,
        model_bytes: float = 0.0,
        network: Network | None = None,
        fixed_fraction: float | None = None,
    ) -> None:
        uniq: dict[tuple[int, int, int], StepLike] = {}
        for s in samples:
            if s.step_time > 0 and s.gpus > 0 and s.micro_batch > 0:
                uniq.setdefault((max(s.nodes, 1), s.gpus, s.micro_batch), s)
        self.samples = list(uniq.values())
        self.model_bytes = float(model_bytes)
        self.network = network or Network()
        self.max_gpus_seen = max((s.gpus for s in self.samples), default=0)
        self.max_nodes_seen = max((s.nodes for s in self.samples), default=0)
        single = [(s.micro_batch, s.step_time) for s in self.samples if s.gpus == 1]
        if not single:
            single = [(s.micro_batch, self._compute_of(s)) for s in self.samples]
        merged: dict[int, float] = {}
        for b, t in single:
            merged[b] = min(merged.get(b, t), t)
        points = sorted(merged.items())
        if points:
            self._cb = np.array([float(b) for b, _ in points])
            self._ct = np.array([t for _, t in points])
        else:
            self._cb = np.array([float(max(min_batch, 1))])
            self._ct = np.array([PRIOR_COMPUTE_S])
        if len(self._cb) >= 2:
            slope, _icept = np.polyfit(self._cb, self._ct, 1)
            self._slope = max(float(slope), 0.0)
        else:
            fixed = FIXED_FRACTION if fixed_fraction is None else fixed_fraction
            self._slope = float(self._ct[0] / self._cb[0]) * (1.0 - fixed)
        multi = [s for s in self.samples if s.gpus > 1]
        self._m_feat = np.array(
            [[np.log2(s.nodes), np.log2(s.gpus), np.log2(s.micro_batch)] for s in multi]
        ).reshape(-1, 3)
        self._m_inter = np.array([s.nodes > 1 for s in multi], dtype=bool)
        comp = self.compute(np.array([float(s.micro_batch) for s in multi]))
        unit = [
            _unhide(s.step_time - c, c) / float(_scale(np.array(s.nodes), np.array(s.gpus)))
            for s, c in zip(multi, comp, strict=True)
        ]
        self._m_unit = np.array(unit, dtype=float)

    def _compute_of(self, s: StepLike) -> float:
        """Compute part of a multi-GPU measurement: step - all-reduce if it was timed, else
        step less the prior's all-reduce."""
        if s.sync_time > 0:
            return max(s.step_time - s.sync_time, 1e-6)
        if self.model_bytes > 0:
            unit = self.network.inter if s.nodes > 1 else self.network.intra
            m = self.model_bytes * unit * float(_scale(np.array(s.nodes), np.array(s.gpus)))
            # step = c + max(m - OVERLAP c, FLOOR m), solved for c
            c = (s.step_time - m) / (1.0 - OVERLAP)
            if m - OVERLAP * c < FLOOR * m:
                c = s.step_time - FLOOR * m
            return max(c, 0.5 * s.step_time)
        frac = PRIOR_INTER if s.nodes > 1 else PRIOR_INTRA
        return s.step_time / (1.0 + frac)

    def measured(self, nodes: int) -> bool:
        """Whether a configuration of this kind (one node / several) was measured."""
        if nodes > 1:
            return bool(self._m_inter.any())
        return bool(len(self._m_inter)) and not bool(self._m_inter.all())

    def compute(self, micro: np.ndarray) -> np.ndarray:
        """Seconds of forward/backward of one micro-step at per-GPU batch ``micro``."""
        b = np.asarray(micro, dtype=float)
        lo, hi = self._cb[0], self._cb[-1]
        out = np.interp(b, self._cb, self._ct)
        out = np.where(b > hi, self._ct[-1] + self._slope * (b - hi), out)
        out = np.where(b < lo, self._ct[0] - self._slope * (lo - b), out)
        return np.asarray(np.maximum(out, 1e-6))

    def _prior_unit(self, inter: np.ndarray, comp: np.ndarray, scale: np.ndarray) -> np.ndarray:
        if self.model_bytes > 0:
            per = np.where(inter, self.network.inter, self.network.intra)
            return np.asarray(self.model_bytes * per)
        # a fraction of the compute, as the waited part
        frac = np.where(inter, PRIOR_INTER, PRIOR_INTRA)
        m = frac * comp + OVERLAP * comp
        return np.asarray(m / np.maximum(scale, 1.0))

    def overhead(self, nodes: np.ndarray, gpus: np.ndarray, micro: np.ndarray) -> np.ndarray:
        """Seconds a multi-GPU step adds to the compute time (0 on one GPU)."""
        n = np.asarray(nodes, dtype=float)
        g = np.asarray(gpus, dtype=float)
        b = np.asarray(micro, dtype=float)
        comp = self.compute(b)
        inter = n > 1
        scale = _scale(n, g)
        unit = self._prior_unit(inter, comp, scale) * (1.0 - OPTIMISM)
        if len(self._m_unit):
            q = np.stack([np.log2(np.maximum(n, 1)), np.log2(np.maximum(g, 1)), np.log2(b)], -1)
            d2 = ((q[:, None, :] - self._m_feat[None, :, :]) ** 2).sum(-1)
            same = inter[:, None] == self._m_inter[None, :]
            w = np.where(same, 1.0 / (d2 + 1e-9), 0.0)
            wsum = w.sum(1)
            est = (w * self._m_unit[None, :]).sum(1) / np.maximum(wsum, 1e-300)
            unit = np.where(wsum > 0, est, unit)
        return np.asarray(np.where(g > 1, _hidden(unit * scale, comp), 0.0))

    def iteration_time(
        self, nodes: np.ndarray, gpus: np.ndarray, micro: np.ndarray, accum: np.ndarray
    ) -> np.ndarray:
        """Seconds per optimizer step."""
        comp = self.compute(micro)
        step = comp + self.overhead(nodes, gpus, micro)
        return np.asarray(step + (np.asarray(accum, dtype=float) - 1) * comp)

    def unit_comm(self, inter: bool) -> list[float]:
        """All-reduce seconds per unit of growth measured for this kind (see ``_scale``)."""
        sel = self._m_inter if inter else ~self._m_inter
        return [float(u) for u in self._m_unit[sel]]


def learn_network(models: Sequence[ThroughputModel]) -> Network:
    """Seconds per gradient byte across all ``models`` that report their size: the median
    over jobs of each job's median, per kind; the defaults where no job measured a kind."""
    out: list[float] = []
    found: list[bool] = []
    for inter, default in ((False, DEFAULT_INTRA_S_PER_BYTE), (True, DEFAULT_INTER_S_PER_BYTE)):
        per_job = [
            float(np.median(units)) / m.model_bytes
            for m in models
            if m.model_bytes > 0 and (units := m.unit_comm(inter))
        ]
        found.append(bool(per_job))
        out.append(float(np.median(per_job)) if per_job else default)
    return Network(intra=out[0], inter=out[1], measured=(found[0], found[1]))
