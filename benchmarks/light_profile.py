"""An application's measured profile as plain numbers, for jobs that import neither numpy
nor scipy (benchmarks/light_job.py).

:func:`make_profile` (run once by a benchmark, with numpy and scipy) writes what
:class:`hpcorch.sim.traces.AppTrace` computes from: the measured placements' step times,
the Delaunay triangulation scipy's ``LinearNDInterpolator`` built over (nodes, GPUs,
per-GPU batch), the validation runs' gradient statistics and the epochs' ends, at a time
scale. :class:`Profile` (pure Python) answers ``iteration_time`` and ``gain`` from it as
``AppTrace`` does: the same 1-D interpolation of measured placements, the same
barycentric interpolation in the same simplices (the nearest measurement outside their
hull), the same gradient statistics (tests/test_light_job.py checks them against
``AppTrace``).
"""

from __future__ import annotations

import bisect
import json
import logging
import math
import os
import socket
from collections import Counter
from pathlib import Path
from typing import Any

from hpcorch.planner import BatchPlan

MAX_INTERP_NODES = 16
"""As hpcorch/sim/traces.py: nodes beyond this count as this many."""
EPS = 1e-9
"""Barycentric coordinates this far below 0 still count as inside a simplex."""


def normalize_placement(counts: tuple[int, ...]) -> tuple[int, ...]:
    """As hpcorch/sim/traces.py: empty nodes dropped, the smallest rotation."""
    p = tuple(c for c in counts if c)
    if not p:
        raise ValueError("empty placement")
    return min(p[i:] + p[:i] for i in range(len(p)))


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    """numpy.interp of one point: linear between the samples, the end values outside."""
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, x)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    if x1 == x0:
        return y1
    return y0 + (x - x0) * (y1 - y0) / (x1 - x0)


class Profile:
    """What an emulated job needs of its application, read from :func:`make_profile`'s
    JSON: step times, statistical gain per step, epochs' ends (at its time scale)."""

    def __init__(self, doc: dict[str, Any]) -> None:
        self.name: str = doc["name"]
        self.speed = float(doc.get("speed", 1.0))
        self.init_batch = int(doc["init_batch"])
        self.max_batch = int(doc["max_batch"])
        self.min_micro = int(doc["min_micro"])
        self.max_micro = int(doc["max_micro"])
        self.epochs = int(doc["epochs"])
        self.epoch_end: list[float] = [float(x) for x in doc["epoch_end"]]
        self.model_bytes = int(doc["model_bytes"])
        self.progress_per_epoch_hint = float(doc["progress_per_epoch_hint"])
        self.placements = {
            tuple(int(c) for c in key.split(",")): (bs, st, sy)
            for key, (bs, st, sy) in doc["placements"].items()
        }
        self.tri_path: Path | None = None
        """The triangulation's own file, read at the first unmeasured placement."""
        tri = doc.get("tri") or {}
        self.points: list[list[float]] = tri.get("points", [])
        self.values: list[list[float]] = tri.get("values", [])
        self.simplices: list[list[int]] = tri.get("simplices", [])
        self.transform: list[list[list[float]]] = tri.get("transform", [])
        self.batches: list[int] = doc["grad"]["batches"]
        self.grad_sqr: list[list[float]] = doc["grad"]["sqr"]
        self.grad_var: list[list[float]] = doc["grad"]["var"]
        self._cache: dict[tuple[tuple[int, ...], int], tuple[float, float]] = {}

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """The profile at ``path``; its triangulation (``<name>.tri.json`` beside it) is
        read only when a step time needs it."""
        prof = cls(json.loads(Path(path).read_text()))
        if not prof.points:
            prof.tri_path = Path(path).with_suffix(".tri.json")
        return prof

    def _load_tri(self) -> None:
        if self.tri_path is not None and not self.points:
            tri = json.loads(self.tri_path.read_text())
            self.points, self.values = tri["points"], tri["values"]
            self.simplices, self.transform = tri["simplices"], tri["transform"]

    # -- throughput -----------------------------------------------------------------------
    def step_time(self, placement: tuple[int, ...], micro_batch: int) -> tuple[float, float]:
        """(step_time, sync_time) of one micro-step, as ``AppTrace.step_time``."""
        p = normalize_placement(placement)
        key = (p, int(micro_batch))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        meas = self.placements.get(p)
        if meas is not None:
            bs, st, sy = meas
            res = (_interp(micro_batch, bs, st), _interp(micro_batch, bs, sy))
        else:
            q = (float(min(len(p), MAX_INTERP_NODES)), float(sum(p)), float(micro_batch))
            self._load_tri()
            res = self._linear(q) or self._nearest(q)
        if self.speed != 1.0:
            res = (res[1] + (res[0] - res[1]) / self.speed, res[1])
        self._cache[key] = res
        return res

    def _linear(self, q: tuple[float, ...]) -> tuple[float, float] | None:
        """scipy's LinearNDInterpolator at ``q``: barycentric in the simplex holding it."""
        for simplex, t in zip(self.simplices, self.transform, strict=True):
            r = t[3]
            d = [q[k] - r[k] for k in range(3)]
            c = [sum(t[i][k] * d[k] for k in range(3)) for i in range(3)]
            c.append(1.0 - c[0] - c[1] - c[2])
            if not all(math.isfinite(x) and x >= -EPS for x in c):
                continue
            st = sum(w * self.values[v][0] for w, v in zip(c, simplex, strict=True))
            sy = sum(w * self.values[v][1] for w, v in zip(c, simplex, strict=True))
            if math.isfinite(st) and math.isfinite(sy):
                return st, sy
        return None

    def _nearest(self, q: tuple[float, ...]) -> tuple[float, float]:
        best = min(
            range(len(self.points)),
            key=lambda i: sum((self.points[i][k] - q[k]) ** 2 for k in range(3)),
        )
        return self.values[best][0], self.values[best][1]

    def iteration_time(self, placement: tuple[int, ...], micro_batch: int, accum: int) -> float:
        st, sy = self.step_time(placement, micro_batch)
        return st + (accum - 1) * (st - sy)

    # -- statistical efficiency -------------------------------------------------------------
    def grad_stats(self, batch: float, epoch: int) -> tuple[float, float]:
        b = min(max(float(batch), self.init_batch), self.max_batch)
        e = min(epoch, len(self.grad_sqr[0]) - 1)
        i = bisect.bisect_left(self.batches, b)
        i = min(i, len(self.batches) - 1)
        if self.batches[i] == b or i == 0:
            return self.grad_sqr[i][e], self.grad_var[i][e]
        lo, hi = self.batches[i - 1], self.batches[i]
        w = (b - lo) / (hi - lo)
        sqr = (1 - w) * self.grad_sqr[i - 1][e] + w * self.grad_sqr[i][e]
        var = (1 - w) * self.grad_var[i - 1][e] + w * self.grad_var[i][e]
        return sqr, var

    def gain(self, batch: float, epoch: int) -> float:
        """Statistical progress per optimizer step at global batch ``batch``."""
        sqr, var = self.grad_stats(batch, epoch)
        scale = batch / self.init_batch
        return (var + sqr) / (var / scale + sqr)


def placement() -> tuple[int, ...]:
    """GPUs (ranks) on each node of this launch, in the order of the first rank on it, from
    the job wrapper's variables (as emulated_job.py gathers them from its ranks)."""
    hosts = os.environ.get("HPCORCH_RANK_HOSTS", "")
    if hosts:
        return tuple(Counter(h for h in hosts.split(",") if h).values())
    world = int(os.environ.get("WORLD_SIZE") or 1)
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE") or world)
    nodes = max(1, world // max(1, per_node))
    counts = [per_node] * nodes
    counts[-1] += world - per_node * nodes
    return tuple(c for c in counts if c > 0)


class StepTimes:
    """Seconds per optimizer step: the benchmark's AppTrace over its socket, else the
    profile's own interpolation."""

    def __init__(self, profile: Profile, socket_path: str, time_scale: float) -> None:
        self.profile, self.socket_path, self.time_scale = profile, socket_path, time_scale

    def __call__(self, counts: tuple[int, ...], batch: BatchPlan) -> float:
        p = self.profile
        micro = min(max(batch.micro_batch, p.min_micro), p.max_micro)
        if self.socket_path:
            ask = {"app": p.name, "scale": self.time_scale, "counts": list(counts)}
            ask.update(micro=micro, accum=batch.accum_steps)
            try:
                with socket.socket(socket.AF_UNIX) as s:
                    s.settimeout(30)
                    s.connect(self.socket_path)
                    s.sendall(json.dumps(ask).encode() + b"\n")
                    answer = json.loads(s.makefile().readline())
                return float(answer["seconds"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                logging.getLogger("hpcorch").warning(
                    "step times from %s failed (%s): the profile's", self.socket_path, exc
                )
                self.socket_path = ""
        return p.iteration_time(counts, micro, batch.accum_steps)


def make_profile(app: Any) -> dict[str, Any]:
    """The JSON document of an ``AppTrace`` (scaled or on a GPU type as it is)."""
    interp = app._interp
    tri = interp.tri
    return {
        "name": app.name,
        "speed": app.speed,
        "init_batch": app.init_batch,
        "max_batch": app.max_batch,
        "min_micro": app.min_micro,
        "max_micro": app.max_micro,
        "epochs": app.epochs,
        "epoch_end": [float(x) for x in app.epoch_end],
        "model_bytes": app.model_bytes,
        "progress_per_epoch_hint": app.progress_per_epoch_hint,
        "placements": {
            ",".join(map(str, p)): [
                [float(x) for x in bs],
                [float(x) for x in st],
                [float(x) for x in sy],
            ]
            for p, (bs, st, sy) in app._placements.items()
        },
        "tri": {
            "points": tri.points.tolist(),
            "values": interp.values.tolist(),
            "simplices": tri.simplices.tolist(),
            "transform": tri.transform.tolist(),
        },
        "grad": {
            "batches": [int(v.batch) for v in app.validation],
            "sqr": [[float(x) for x in v.grad_sqr] for v in app.validation],
            "var": [[float(x) for x in v.grad_var] for v in app.validation],
        },
    }


def write_profiles(directory: Path, time_scale: float) -> dict[str, Path]:
    """Every bundled application's profile at ``time_scale`` as ``<dir>/<app>.json``, its
    triangulation (the larger part, needed only without a step-time socket) beside it as
    ``<app>.tri.json``."""
    from hpcorch.sim.traces import load_apps

    directory.mkdir(parents=True, exist_ok=True)
    out = {}
    for name, app in load_apps().items():
        doc = make_profile(app.scaled(time_scale))
        path = directory / f"{name}.json"
        path.with_suffix(".tri.json").write_text(json.dumps(doc.pop("tri")))
        path.write_text(json.dumps(doc))
        out[name] = path
    return out
