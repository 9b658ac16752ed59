"""GPU types for a heterogeneous simulation: per-application speed factors relative to the
GPU the bundled Pollux traces were measured on (an NVIDIA T4), and the applications as they
run on another type (:meth:`hpcorch.sim.traces.AppTrace.on_gpu`). The factors and their
sources: ``data/gpu-types/`` (README.md, speed.csv)."""

from __future__ import annotations

import csv
import math
from collections.abc import Mapping
from pathlib import Path

from hpcorch.sim.traces import AppTrace, TraceError

REFERENCE_TYPE = "t4"
"""The GPU of the bundled traces: its factors are all 1."""
SPEED_FILE = Path(__file__).resolve().parent / "data" / "gpu-types" / "speed.csv"
BASES = frozenset({"reference", "measured", "derived", "proxy"})


def load_speeds(path: Path | None = None) -> dict[str, dict[str, float]]:
    """{GPU type: {application: speed factor}} from ``path`` (default: the bundled table).
    Every type lists the same applications; the reference type's factors are 1."""
    where = path or SPEED_FILE
    try:
        with where.open(newline="") as f:
            rows = list(csv.DictReader(f))
    except OSError as exc:
        raise TraceError(f"cannot read {where}: {exc.strerror or exc}") from None
    speeds: dict[str, dict[str, float]] = {}
    for n, row in enumerate(rows, start=2):
        gpu, app, basis = row.get("type") or "", row.get("app") or "", row.get("basis") or ""
        try:
            factor = float(row.get("speed") or "")
        except ValueError:
            factor = math.nan
        if not (gpu and app and math.isfinite(factor) and 0.01 <= factor <= 100):
            raise TraceError(f"{where}:{n}: need a type, an app and a speed in [0.01, 100]")
        if basis not in BASES:
            raise TraceError(f"{where}:{n}: basis '{basis}' (valid: {', '.join(sorted(BASES))})")
        if app in speeds.setdefault(gpu, {}):
            raise TraceError(f"{where}:{n}: {gpu}/{app} given twice")
        speeds[gpu][app] = factor
    apps = {frozenset(v) for v in speeds.values()}
    if len(apps) != 1:
        raise TraceError(f"{where}: every GPU type must list the same applications")
    if any(f != 1.0 for f in speeds.get(REFERENCE_TYPE, {"": 0.0}).values()):
        raise TraceError(f"{where}: the reference type {REFERENCE_TYPE} must have factor 1")
    return speeds


def apps_on(
    apps: Mapping[str, AppTrace], gpu_type: str, speeds: Mapping[str, Mapping[str, float]]
) -> dict[str, AppTrace]:
    """Every application of ``apps`` as it runs on ``gpu_type``."""
    table = speeds.get(gpu_type)
    if table is None:
        raise TraceError(f"unknown GPU type '{gpu_type}' (valid: {', '.join(sorted(speeds))})")
    missing = sorted(set(apps) - set(table))
    if missing:
        raise TraceError(f"no speed factor of {gpu_type} for {', '.join(missing)}")
    return {name: app.on_gpu(table[name]) for name, app in apps.items()}


class TypedPool:
    """The GPU type of every node of a simulated pool and each application on each type."""

    def __init__(
        self,
        node_types: tuple[str, ...],
        apps: Mapping[str, AppTrace],
        speeds: Mapping[str, Mapping[str, float]] | None = None,
    ) -> None:
        table = speeds if speeds is not None else load_speeds()
        self.node_types = node_types
        self.apps = {t: apps_on(apps, t, table) for t in sorted(set(node_types))}

    def app_on(self, name: str, nodes: tuple[int, ...]) -> AppTrace:
        """Application ``name`` on ``nodes``: on several types, at the slowest one's speed
        (every rank waits for the slowest at each all-reduce)."""
        return min((self.apps[self.node_types[i]][name] for i in nodes), key=lambda a: a.speed)

    def fastest(self) -> dict[str, AppTrace]:
        """Each application on the type it runs fastest on (for a lower bound)."""
        names = next(iter(self.apps.values()))
        return {n: max((a[n] for a in self.apps.values()), key=lambda a: a.speed) for n in names}
