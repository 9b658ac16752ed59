"""Step-time model fitted online from the step times jobs report (pure numpy).

One model per application, pooled over every job of that application the controller has
seen (running and completed): all run the same code on the same kind of node.

* compute time of one micro-step at per-GPU batch ``b``: piecewise-linear through the
  measured single-GPU points (or step - sync of any measurement), extrapolated with a
  least-squares line;
* communication overhead of ``r > 1`` GPUs (step - compute): inverse-distance weighting
  over measurements of the same kind (one node / several nodes) in (log nodes, log GPUs,
  log batch), exact at measured points; an optimistic prior where nothing was measured yet;
* an iteration with ``k`` micro-steps (gradient accumulation) costs
  ``step + (k - 1) x compute``; a measurement of such an iteration (a job reports its
  seconds per optimizer step) is read the same way.

Jobs report only their seconds per optimizer step, not the all-reduce part of it
(``sync_time`` 0: unknown). Without a one-GPU measurement, reading a multi-GPU step as all
compute would predict perfect scaling up to the GPUs measured. :func:`split_sync` then
infers each configuration's all-reduce from the measurements themselves: the compute of a
micro-step depends only on the per-GPU batch (``a + b x micro``, the same on any number of
GPUs) and each micro-step of an accumulated step adds it again, while the all-reduce comes
once per step and depends on the GPUs and nodes only, so step times at several
accumulation counts and batches separate the two (least squares).

Where a kind of configuration (one node / several nodes) was never measured, the prior is
physical when the job reports its gradient bytes: the bytes times the seconds per byte the
cluster showed on *other* models (:class:`Network`, :func:`learn_network`); the all-reduce
grows with the GPUs within a node (``r - 1``) and is about flat in the node count across
nodes (a ring moves twice the gradient whatever its length). The same prior splits a step
measured only on several GPUs at one accumulation count into compute and all-reduce.
Without a reported size, the prior is a fraction of the compute (``PRIOR_INTRA`` /
``PRIOR_INTER``).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

_RANK_WARNING: type[Warning] = (
    getattr(np.exceptions, "RankWarning", None) or getattr(np, "RankWarning", None) or UserWarning
)
"""np.polyfit's warning: np.exceptions.RankWarning from numpy 2.0, np.RankWarning before."""


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
    @property
    def accum_steps(self) -> int: ...


# Prior overhead as a fraction of the compute time, before any measurement of that kind.
PRIOR_INTRA = 0.1
PRIOR_INTER = 1.0
# Prior compute time per sample at the initial batch, before the first measurement.
PRIOR_COMPUTE_S = 0.2
# Seconds per gradient byte before any model measured a kind: one node's GPUs over PCIe
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


def growth(nodes: np.ndarray, gpus: np.ndarray) -> np.ndarray:
    """All-reduce growth with the GPU count: ``r - 1`` on one node, flat across nodes."""
    n = np.asarray(nodes, dtype=float)
    g = np.asarray(gpus, dtype=float)
    return np.asarray(np.where(n > 1, 1.0, np.maximum(g - 1.0, 0.0)))


class _Sample:
    """A measurement with an inferred all-reduce time."""

    def __init__(self, s: StepLike, sync_time: float) -> None:
        self.nodes = s.nodes
        self.gpus = s.gpus
        self.micro_batch = s.micro_batch
        self.step_time = s.step_time
        self.accum_steps = s.accum_steps
        self.sync_time = sync_time


def split_sync(samples: Iterable[StepLike]) -> dict[tuple[int, int], float]:
    """Seconds of all-reduce per step for each (nodes, GPUs) measured on several GPUs
    without a sync time, inferred by least squares over every measurement:
    ``step = k x (a + b x micro) + sync[nodes, GPUs]`` (one GPU: no all-reduce). Empty where
    the measurements cannot tell compute from all-reduce (e.g. all at one accumulation
    count and no one-GPU step), or where any measurement carries its own sync time."""
    rows = [s for s in samples if s.step_time > 0]
    if any(s.gpus > 1 and s.sync_time > 0 for s in rows):
        return {}
    groups = sorted({(s.nodes, s.gpus) for s in rows if s.gpus > 1})
    if not groups:
        return {}
    col = {key: 2 + i for i, key in enumerate(groups)}
    a = np.zeros((len(rows), 2 + len(groups)))
    y = np.empty(len(rows))
    for i, s in enumerate(rows):
        k = max(1, s.accum_steps)
        a[i, 0], a[i, 1] = k, k * s.micro_batch
        if s.gpus > 1:
            a[i, col[(s.nodes, s.gpus)]] = 1.0
        y[i] = s.step_time
    scale = np.maximum(np.abs(a).max(axis=0), 1e-12)
    x, _res, rank, _sv = np.linalg.lstsq(a / scale, y, rcond=None)
    if rank < a.shape[1]:
        return {}
    x = x / scale
    return {key: max(float(x[col[key]]), 0.0) for key in groups}


class ThroughputModel:
    """Predicts seconds per iteration for (nodes, GPUs, micro-batch, accumulation)."""

    def __init__(
        self,
        samples: Iterable[StepLike],
        min_batch: int = 1,
        model_bytes: float = 0.0,
        network: Network | None = None,
    ) -> None:
        self.model_bytes = max(float(model_bytes), 0.0)
        self.network = network or Network()
        given = [s for s in samples if s.gpus > 0 and s.micro_batch > 0 and s.nodes > 0]
        syncs = split_sync(given)
        uniq: dict[tuple[int, int, int], StepLike] = {}
        for s in sorted(given, key=lambda s: s.accum_steps):  # fewest micro-steps first
            key = (s.nodes, s.gpus, s.micro_batch)
            if key not in uniq:
                sync = syncs.get((s.nodes, s.gpus))
                uniq[key] = s if sync is None else _Sample(s, min(sync, 0.95 * s.step_time))
        self.samples = list(uniq.values())
        self.micro_batches = {s.micro_batch for s in self.samples}
        """Per-GPU batches measured."""
        self.max_gpus_seen = max((s.gpus for s in self.samples), default=0)
        # one GPU: no all-reduce, every micro-step is compute
        single = sorted(
            (s.micro_batch, s.step_time / max(1, s.accum_steps))
            for s in self.samples
            if s.gpus == 1
        )
        if not single:
            single = sorted(
                (s.micro_batch, max((s.step_time - self._sync_of(s)) / max(1, s.accum_steps), 1e-6))
                for s in self.samples
            )
            merged: dict[int, float] = {}
            for b, t in single:
                merged[b] = min(merged.get(b, t), t)
            single = sorted(merged.items())
        if single:
            self._cb = np.array([float(b) for b, _ in single])
            self._ct = np.array([t for _, t in single])
        else:
            self._cb = np.array([float(max(min_batch, 1))])
            self._ct = np.array([PRIOR_COMPUTE_S])
        if len(self._cb) >= 2:
            # Samples at one micro batch make the fit rank-deficient; numpy then returns
            # the least-norm line (slope about time / batch), which is what is wanted here,
            # and warns once per fit: thousands of lines in a long simulation.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", _RANK_WARNING)
                slope, _icept = np.polyfit(self._cb, self._ct, 1)
            self._slope = max(float(slope), 0.0)
        else:
            self._slope = float(self._ct[0] / self._cb[0]) * 0.8
        multi = [s for s in self.samples if s.gpus > 1]
        self._m_feat = np.array(
            [[np.log2(s.nodes), np.log2(s.gpus), np.log2(s.micro_batch)] for s in multi]
        ).reshape(-1, 3)
        self._m_inter = np.array([s.nodes > 1 for s in multi], dtype=bool)
        comp = self.compute(np.array([float(s.micro_batch) for s in multi]))
        accum = np.array([max(1, s.accum_steps) for s in multi], dtype=float)
        # the all-reduce happens once per step, after the last micro-step
        self._m_over = np.maximum(np.array([s.step_time for s in multi]) - accum * comp, 0.0)
        grow = growth(np.array([s.nodes for s in multi]), np.array([s.gpus for s in multi]))
        self._m_unit = self._m_over / np.maximum(grow, 1.0)

    def _sync_of(self, s: StepLike) -> float:
        """The all-reduce part of a multi-GPU measurement: its own or inferred one, else the
        physical prior (reported bytes x seconds per byte), else none (0)."""
        if s.sync_time > 0 or self.model_bytes <= 0:
            return s.sync_time
        unit = self.network.inter if s.nodes > 1 else self.network.intra
        m = self.model_bytes * unit * float(growth(np.array(s.nodes), np.array(s.gpus)))
        return min(m, 0.5 * s.step_time)

    def unit_comm(self, inter: bool) -> list[float]:
        """Measured all-reduce seconds per unit of growth (see :func:`growth`) of a kind."""
        sel = self._m_inter if inter else ~self._m_inter
        return [float(u) for u in self._m_unit[sel]]

    def compute(self, micro: np.ndarray) -> np.ndarray:
        """Seconds of forward/backward of one micro-step at per-GPU batch ``micro``."""
        b = np.asarray(micro, dtype=float)
        lo, hi = self._cb[0], self._cb[-1]
        out = np.interp(b, self._cb, self._ct)
        out = np.where(b > hi, self._ct[-1] + self._slope * (b - hi), out)
        out = np.where(b < lo, self._ct[0] - self._slope * (lo - b), out)
        return np.asarray(np.maximum(out, 1e-6))

    def overhead(self, nodes: np.ndarray, gpus: np.ndarray, micro: np.ndarray) -> np.ndarray:
        """Seconds a multi-GPU step adds to the compute time (0 on one GPU)."""
        n = np.asarray(nodes, dtype=float)
        g = np.asarray(gpus, dtype=float)
        b = np.asarray(micro, dtype=float)
        comp = self.compute(b)
        inter = n > 1
        if self.model_bytes > 0:
            per = np.where(inter, self.network.inter, self.network.intra)
            prior = self.model_bytes * per * growth(n, g)
        else:
            prior = np.where(inter, PRIOR_INTER, PRIOR_INTRA) * comp
        out = prior
        if len(self._m_over):
            q = np.stack([np.log2(np.maximum(n, 1)), np.log2(np.maximum(g, 1)), np.log2(b)], -1)
            d2 = ((q[:, None, :] - self._m_feat[None, :, :]) ** 2).sum(-1)
            same = inter[:, None] == self._m_inter[None, :]
            w = np.where(same, 1.0 / (d2 + 1e-9), 0.0)
            wsum = w.sum(1)
            est = (w * self._m_over[None, :]).sum(1) / np.maximum(wsum, 1e-300)
            out = np.where(wsum > 0, est, prior)
        return np.asarray(np.where(g > 1, out, 0.0))

    def iteration_time(
        self, nodes: np.ndarray, gpus: np.ndarray, micro: np.ndarray, accum: np.ndarray
    ) -> np.ndarray:
        """Seconds per optimizer step."""
        comp = self.compute(micro)
        step = comp + self.overhead(nodes, gpus, micro)
        return np.asarray(step + (np.asarray(accum, dtype=float) - 1) * comp)


def learn_network(models: Sequence[ThroughputModel]) -> Network:
    """Seconds per gradient byte across all ``models`` that report their size: per kind, the
    median over models of each model's median measured all-reduce per byte; the defaults
    where no model measured a kind."""
    out: list[float] = []
    for inter, default in ((False, DEFAULT_INTRA_S_PER_BYTE), (True, DEFAULT_INTER_S_PER_BYTE)):
        per_model = [
            float(np.median(units)) / m.model_bytes
            for m in models
            if m.model_bytes > 0 and (units := m.unit_comm(inter))
        ]
        out.append(float(np.median(per_model)) if per_model else default)
    return Network(intra=out[0], inter=out[1])
