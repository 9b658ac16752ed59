"""True job behaviour, interpolated from the measured traces (never visible to policies).

One :class:`AppTrace` per application directory under ``traces/``:

* step time for any placement and per-GPU batch: linear interpolation in the per-GPU batch
  for a placement measured in ``placements.csv`` (read up to rotation), otherwise piecewise
  linear interpolation over (nodes, replicas, per-GPU batch) of the placement rows averaged
  per key together with ``scalability.csv`` (nodes capped at 16);
* gradient statistics of an epoch at any global batch: linear interpolation between the two
  validated batch sizes around it;
* progress at the end of epoch ``e``: the smallest ``progress`` of row ``e`` over the
  validation files; a job is done at the end of its last epoch.
"""

from __future__ import annotations

import copy
import csv
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

# Training length per application (epochs), as in the published runs.
EPOCHS: dict[str, int] = {
    "bert": 2,
    "cifar10": 100,
    "ncf": 10,
    "imagenet": 90,
    "deepspeech2": 80,
    "yolov3": 50,
}
# Trainable parameters of the measured models (what a job's runtime would report): ResNet-18
# (CIFAR-10), ResNet-50, BERT-base (SQuAD), YOLOv3 (Darknet-53, 20 VOC classes),
# DeepSpeech2 (2 convolutions, 5 bidirectional GRU layers of 800), NeuMF (MovieLens-1M,
# 32 factors, 3 MLP layers), as configured in the Pollux artifact's benchmark models.
PARAMS: dict[str, int] = {
    "cifar10": 11_173_962,
    "imagenet": 25_557_032,
    "bert": 108_893_186,
    "yolov3": 61_626_049,
    "deepspeech2": 41_200_000,
    "ncf": 1_602_177,
}
# Per-GPU batch caps that differ from the largest measured one.
MAX_MICRO_BATCH: dict[str, int] = {"yolov3": 8}
MAX_INTERP_NODES = 16


class TraceError(ValueError):
    """A trace directory is missing or malformed."""


def _read_csv(path: Path) -> list[dict[str, str]]:
    try:
        with path.open(newline="") as f:
            return list(csv.DictReader(f))
    except OSError as exc:
        raise TraceError(f"cannot read {path}: {exc.strerror}") from exc


def normalize_placement(counts: tuple[int, ...]) -> tuple[int, ...]:
    """Drop empty nodes and rotate to the lexicographically smallest rotation."""
    p = tuple(c for c in counts if c)
    if not p:
        raise ValueError("empty placement")
    return min(p[i:] + p[:i] for i in range(len(p)))


@dataclass(frozen=True)
class Validation:
    """One validation run (one row per epoch) at a fixed global batch size."""

    batch: int
    progress: np.ndarray
    grad_sqr: np.ndarray
    grad_var: np.ndarray


class AppTrace:
    """Measured behaviour of one application (the simulator's ground truth)."""

    def __init__(self, trace_dir: Path, epochs: int | None = None) -> None:
        self.name = trace_dir.name
        self.speed = 1.0
        """How many times as fast as the measured GPU this trace's GPU computes."""
        if not trace_dir.is_dir():
            raise TraceError(f"no trace directory {trace_dir}")
        vals: list[Validation] = []
        for path in sorted(trace_dir.glob("validation-*.csv")):
            rows = _read_csv(path)
            batch = int(path.stem.split("-")[-1])
            vals.append(
                Validation(
                    batch=batch,
                    progress=np.array([float(r["progress"]) for r in rows]),
                    grad_sqr=np.array([float(r["grad_sqr"]) for r in rows]),
                    grad_var=np.array([float(r["grad_var"]) for r in rows]),
                )
            )
        if not vals:
            raise TraceError(f"no validation-*.csv in {trace_dir}")
        vals.sort(key=lambda v: v.batch)
        self.validation = vals
        self.batches = np.array([v.batch for v in vals])
        self.init_batch = int(vals[0].batch)
        self.max_batch = int(vals[-1].batch)
        self.epochs = epochs or EPOCHS.get(self.name) or min(len(v.progress) for v in vals)
        # Progress at the end of epoch e (index e), e = 0..epochs.
        ends = [0.0]
        for e in range(1, self.epochs + 1):
            ends.append(min(float(v.progress[e - 1]) for v in vals))
        self.epoch_end = np.array(ends)
        self.epoch_grain_s = 1.0
        """An epoch lasts a whole number of these seconds in the simulator's model."""
        self.work_scale = 1.0
        """Every epoch's work (its progress) as a multiple of the measured one: see
        :meth:`scaled`."""

        prow = _read_csv(trace_dir / "placements.csv")
        self._placements: dict[tuple[int, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        by_key: dict[tuple[int, int, int], list[tuple[float, float]]] = {}
        raw: dict[tuple[int, ...], list[tuple[int, float, float]]] = {}
        for r in prow:
            digits = tuple(int(c) for c in r["placement"].strip())
            bsz, st, sy = int(r["local_bsz"]), float(r["step_time"]), float(r["sync_time"])
            raw.setdefault(digits, []).append((bsz, st, sy))
            by_key.setdefault((len(digits), sum(digits), bsz), []).append((st, sy))
        for digits, items in raw.items():
            items.sort()
            arr = np.array(items)
            self._placements[normalize_placement(digits)] = (arr[:, 0], arr[:, 1], arr[:, 2])
        local = [int(r["local_bsz"]) for r in prow]
        self.min_micro = min(local)
        self.max_micro = MAX_MICRO_BATCH.get(self.name, max(local))
        pts: list[tuple[float, float, float]] = []
        ys: list[tuple[float, float]] = []
        for key in sorted(by_key):
            pts.append((float(key[0]), float(key[1]), float(key[2])))
            vals_k = np.array(by_key[key]).mean(axis=0)
            ys.append((float(vals_k[0]), float(vals_k[1])))
        for r in _read_csv(trace_dir / "scalability.csv"):
            pts.append((float(r["num_nodes"]), float(r["num_replicas"]), float(r["local_bsz"])))
            ys.append((float(r["step_time"]), float(r["sync_time"])))
        try:
            from scipy.interpolate import (  # type: ignore[import-untyped]
                LinearNDInterpolator,
                NearestNDInterpolator,
            )
        except ImportError:
            raise TraceError("the simulator needs scipy (pip install 'hpcorch[sim]')") from None
        self._interp = LinearNDInterpolator(np.array(pts), np.array(ys))
        # Outside the measured hull (e.g. more than 4 GPUs on a node): nearest measurement.
        self._nearest = NearestNDInterpolator(np.array(pts), np.array(ys))
        self._cache: dict[tuple[tuple[int, ...], int], tuple[float, float]] = {}
        self._grad: dict[tuple[float, int], tuple[float, float]] = {}
        self._norm: dict[tuple[int, ...], tuple[int, ...]] = {}

    def scaled(self, factor: float) -> AppTrace:
        """This application with ``factor`` times the work in every epoch (a replay's time
        scale): steps take what they take, their statistical gain is unchanged, and an
        epoch (so a job) ends after ``factor`` times as many of them. Start-up and resize
        costs, which a real pool pays in wall time, are not scaled."""
        if not 0 < factor <= 1:
            raise TraceError(f"a time scale must be in (0, 1], got {factor:g}")
        out = copy.copy(self)
        out.work_scale = self.work_scale * factor
        out.epoch_grain_s = self.epoch_grain_s * factor
        out.epoch_end = self.epoch_end * factor
        return out

    def on_gpu(self, speed: float) -> AppTrace:
        """This application on a GPU ``speed`` times as fast as the one its traces were
        measured on: a micro-step's compute (its step time less its all-reduce) takes
        1/``speed`` as long; the all-reduce, over the same network, as long as measured."""
        if not (math.isfinite(speed) and 0.01 <= speed <= 100):
            raise TraceError(f"a GPU speed factor must be in [0.01, 100], got {speed:g}")
        out = copy.copy(self)
        out.speed = self.speed * speed
        out._cache = {}
        return out

    # -- throughput ---------------------------------------------------------------------
    def step_time(self, placement: tuple[int, ...], micro_batch: int) -> tuple[float, float]:
        """(step_time, sync_time) in seconds of one micro-step on ``placement``."""
        p = self._norm.get(placement)
        if p is None:
            p = self._norm[placement] = normalize_placement(placement)
        key = (p, int(micro_batch))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        meas = self._placements.get(p)
        if meas is not None:
            bs, st, sy = meas
            res = (float(np.interp(micro_batch, bs, st)), float(np.interp(micro_batch, bs, sy)))
        else:  # depends only on (nodes, GPUs, batch): one interpolation for all such
            nodes = min(len(p), MAX_INTERP_NODES)
            ikey = ((-nodes, sum(p)), int(micro_batch))
            got = self._cache.get(ikey)
            if got is None:
                q = np.array([[nodes, sum(p), micro_batch]], dtype=float)
                out = self._interp(q)[0]
                if not np.all(np.isfinite(out)):
                    out = self._nearest(q)[0]
                got = self._cache[ikey] = (float(out[0]), float(out[1]))
            res = got
        if self.speed != 1.0:
            res = (res[1] + (res[0] - res[1]) / self.speed, res[1])
        self._cache[key] = res
        return res

    def iteration_time(self, placement: tuple[int, ...], micro_batch: int, accum: int) -> float:
        """Seconds per optimizer step with ``accum`` micro-steps (accum - 1 extra)."""
        st, sy = self.step_time(placement, micro_batch)
        return st + (accum - 1) * (st - sy)

    # -- statistical efficiency ---------------------------------------------------------
    def grad_stats(self, batch: float, epoch: int) -> tuple[float, float]:
        """(grad_sqr, grad_var) during ``epoch`` at global batch ``batch``."""
        key = (float(batch), int(epoch))
        hit = self._grad.get(key)
        if hit is None:
            hit = self._grad[key] = self._grad_stats(batch, epoch)
        return hit

    def _grad_stats(self, batch: float, epoch: int) -> tuple[float, float]:
        b = min(max(float(batch), self.init_batch), self.max_batch)
        e = min(epoch, len(self.validation[0].progress) - 1)
        i = int(np.searchsorted(self.batches, b, side="left"))
        hi = self.validation[i]
        if hi.batch == b or i == 0:
            return float(hi.grad_sqr[e]), float(hi.grad_var[e])
        lo = self.validation[i - 1]
        w = (b - lo.batch) / (hi.batch - lo.batch)
        sqr = (1 - w) * lo.grad_sqr[e] + w * hi.grad_sqr[e]
        var = (1 - w) * lo.grad_var[e] + w * hi.grad_var[e]
        return float(sqr), float(var)

    def gain(self, batch: float, epoch: int) -> float:
        """Statistical progress per optimizer step at global batch ``batch``."""
        sqr, var = self.grad_stats(batch, epoch)
        scale = batch / self.init_batch
        return float((var + sqr) / (var / scale + sqr))

    @property
    def model_bytes(self) -> int:
        """Bytes of fp32 gradients one step all-reduces (0: unknown application)."""
        return 4 * PARAMS.get(self.name, 0)

    @property
    def total_progress(self) -> float:
        return float(self.epoch_end[-1])

    @property
    def progress_per_epoch_hint(self) -> float:
        """What a job knows up front: one pass over its data at the initial batch."""
        return float(self.validation[0].progress[0]) * self.work_scale


BUNDLED_DATA = Path(__file__).resolve().parent / "data" / "pollux"
"""The Pollux artifact's traces, workloads and published results, shipped with hpcorch
(Apache-2.0; see its README.md and LICENSE)."""


def default_data_dir() -> Path:
    """``$HPCORCH_POLLUX_DATA`` or the data bundled with hpcorch."""
    env = os.environ.get("HPCORCH_POLLUX_DATA")
    if env:
        return Path(env)
    return BUNDLED_DATA


_APPS: dict[Path, dict[str, AppTrace]] = {}


def load_apps(data_dir: Path | None = None) -> dict[str, AppTrace]:
    """All applications under ``data_dir/traces`` (cached per directory)."""
    root = (data_dir or default_data_dir()).resolve()
    cached = _APPS.get(root)
    if cached is not None:
        return cached
    tdir = root / "traces"
    if not tdir.is_dir():
        raise TraceError(
            f"no traces directory under {root} (set HPCORCH_POLLUX_DATA or pass --data)"
        )
    apps = {p.name: AppTrace(p) for p in sorted(tdir.iterdir()) if p.is_dir()}
    if not apps:
        raise TraceError(f"no application traces under {tdir}")
    _APPS[root] = apps
    return apps


def scale_apps(apps: Mapping[str, AppTrace], factor: float) -> dict[str, AppTrace]:
    """Every application of ``apps`` with ``factor`` times its work (:meth:`AppTrace.scaled`);
    ``apps`` itself when ``factor`` is 1."""
    if factor == 1:
        return dict(apps)
    return {name: app.scaled(factor) for name, app in apps.items()}
