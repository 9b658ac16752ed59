"""What the scheduler did, as data: per job, the GPUs it held over time, its resizes and
global batch changes, its JCT, GPU-hours and last loss; the pool's utilisation over time.

Read from a controller's store (``from_store``, live or finished) or from a copy of it a
simulation kept. Pure data, no plotting: ``hpcorch.cli.report`` draws it.
"""

from __future__ import annotations

import json
import math
import sqlite3
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hpcorch.errors import HpcorchError


class ReportError(HpcorchError):
    """The report's input cannot be read."""


@dataclass
class Segment:
    start: float
    """Seconds since the report's origin (the first job's submit)."""
    end: float
    gpus: int
    gpu_type: str = ""
    """The GPU type the launch trained on, as its reports say ('': untyped, or unknown)."""


@dataclass
class Mark:
    time: float
    kind: str
    """"grow", "shrink" or "batch"."""
    label: str


@dataclass
class JobReport:
    job_id: int
    name: str
    mode: str
    phase: str
    submit: float
    finish: float | None
    jct_s: float | None
    gpu_hours: float
    resizes: int
    batches: list[int]
    final_loss: float | None
    segments: list[Segment] = field(default_factory=list)
    starting: list[Segment] = field(default_factory=list)
    """Launches decided but not yet training: queued in Slurm, or loading and joining."""
    marks: list[Mark] = field(default_factory=list)
    gpu_types: list[str] = field(default_factory=list)
    """The GPU types it ran on, in the order it first ran on each ("a100+v100": a launch
    across two types)."""


_JOB_KEYS = (
    "job_id", "name", "mode", "phase", "submit", "finish", "jct_s", "gpu_hours", "resizes",
    "batches", "final_loss",
)  # fmt: skip


@dataclass
class WindowSpan:
    """Another reservation that took pool nodes for a while (a maintenance window)."""

    name: str
    nodes: list[str]
    start: float
    end: float
    maintenance: bool


@dataclass
class Report:
    source: str
    total_gpus: int
    origin: float
    """Unix time of the first submit (every time above is relative to it)."""
    end: float
    jobs: list[JobReport]
    utilisation: list[tuple[float, int]]
    """(time, GPUs held by jobs) steps."""
    windows: list[WindowSpan] = field(default_factory=list)
    """Windows the controller saw on the pool's nodes (relative times)."""

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["utilisation"] = [list(p) for p in self.utilisation]
        doc["mean_utilisation"] = self.mean_utilisation()
        return doc

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Report:
        """The report ``to_json`` wrote (KeyError, TypeError or ValueError if not one)."""

        def segments(items: list[dict[str, Any]]) -> list[Segment]:
            return [
                Segment(
                    float(s["start"]), float(s["end"]), int(s["gpus"]), str(s.get("gpu_type", ""))
                )
                for s in items
            ]

        jobs = [
            JobReport(
                **{
                    **{k: j[k] for k in _JOB_KEYS},
                    "segments": segments(j["segments"]),
                    "starting": segments(j["starting"]),
                    "marks": [
                        Mark(float(m["time"]), str(m["kind"]), str(m["label"])) for m in j["marks"]
                    ],
                    "gpu_types": [str(t) for t in j.get("gpu_types", [])],
                }
            )
            for j in doc["jobs"]
        ]
        util = [(float(t), int(g)) for t, g in doc["utilisation"]]
        windows = [
            WindowSpan(
                str(w["name"]),
                [str(n) for n in w["nodes"]],
                float(w["start"]),
                float(w["end"]),
                bool(w["maintenance"]),
            )
            for w in doc.get("windows", [])
        ]
        return cls(
            str(doc["source"]), int(doc["total_gpus"]), float(doc["origin"]),
            float(doc["end"]), jobs, util, windows,
        )  # fmt: skip

    def mean_utilisation(self) -> float:
        if not self.utilisation or self.total_gpus <= 0 or self.end <= 0:
            return 0.0
        area = 0.0
        for (t0, g), (t1, _) in zip(
            self.utilisation, [*self.utilisation[1:], (self.end, 0)], strict=True
        ):
            area += min(g, self.total_gpus) * max(t1 - t0, 0.0)
        return round(area / (self.total_gpus * self.end), 4)


def _r(x: float) -> float:
    return round(x, 2)


def from_store(path: Path, total_gpus: int | None = None) -> Report:
    """The report of the store at ``path`` (a controller's state.db), read-only."""
    if not path.is_file():
        raise ReportError(f"no controller state at {path} (give --state-dir or a state.db)")
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10)
        try:
            return from_connection(db, str(path), total_gpus)
        finally:
            db.close()
    except sqlite3.Error as exc:
        raise ReportError(f"{path} is not a readable controller state: {exc}") from None


def from_connection(db: sqlite3.Connection, source: str, total_gpus: int | None = None) -> Report:
    """The report of an open connection to a controller's store (sqlite3.Error if not one)."""
    db.row_factory = sqlite3.Row
    jobs = [dict(r) for r in db.execute("SELECT * FROM jobs ORDER BY slurm_id")]
    decisions = [dict(r) for r in db.execute("SELECT * FROM decisions ORDER BY time, id")]
    samples = [dict(r) for r in db.execute("SELECT * FROM samples ORDER BY time")]
    meta = {str(k): str(v) for k, v in db.execute("SELECT key, value FROM meta").fetchall()}
    return build(jobs, decisions, samples, meta, source, total_gpus)


def build(
    jobs: list[dict[str, Any]],
    decisions: list[dict[str, Any]],
    samples: list[dict[str, Any]],
    meta: dict[str, str],
    source: str,
    total_gpus: int | None = None,
) -> Report:
    """The report from rows of the store's tables (mappings with the tables' columns)."""
    if not jobs:
        return Report(source, total_gpus or 0, 0.0, 0.0, [], [])
    origin = min(float(j["submit_time"]) for j in jobs)
    last = max(
        [float(j["finished_at"]) for j in jobs]
        + [float(d["done_at"] or d["time"]) for d in decisions]
        + [float(s["time"]) for s in samples]
        + [float(j["phase_since"]) for j in jobs]
    )
    end = last - origin
    out: list[JobReport] = []
    for j in jobs:
        jid = int(j["slurm_id"])
        mine = [d for d in decisions if int(d["slurm_id"]) == jid]
        sams = [s for s in samples if int(s["slurm_id"]) == jid]
        finished = float(j["finished_at"]) or None
        job_end = (finished or last) - origin
        marks: list[Mark] = []
        for d in mine:
            if d["action"] == "signal" and str(d["detail"]).startswith("resize"):
                f, to = int(d["from_gpus"]), int(d["to_gpus"])
                kind = "grow" if to > f else "shrink"
                marks.append(Mark(_r(float(d["time"]) - origin), kind, f"{f}\u2192{to}"))
        segments, starting = _segments(mine, sams, origin, job_end, float(j["started_at"]))
        if not float(j["started_at"]) and not int(j.get("launches") or 0):
            # Slurm never ran it (pending its whole life): started, never training
            starting = sorted([*starting, *segments], key=lambda s: s.start)
            segments = []
        batches: list[int] = []
        prev = 0
        for s in sams:
            b = int(s["global_batch"])
            if b and b != prev:
                if prev:
                    marks.append(Mark(_r(float(s["time"]) - origin), "batch", f"{prev}\u2192{b}"))
                batches.append(b)
                prev = b
        losses = [s["loss"] for s in sams if s["loss"] is not None and math.isfinite(s["loss"])]
        out.append(
            JobReport(
                job_id=jid,
                name=str(j["name"]),
                mode=str(j.get("mode", "managed")),
                phase=str(j["phase"]),
                submit=_r(float(j["submit_time"]) - origin),
                finish=_r(finished - origin) if finished else None,
                jct_s=_r(finished - float(j["submit_time"])) if finished else None,
                gpu_hours=round(float(j["gpu_seconds"]) / 3600.0, 5),
                resizes=int(j["resizes"]),
                batches=batches,
                final_loss=round(float(losses[-1]), 4) if losses else None,
                segments=segments,
                starting=starting,
                marks=sorted(marks, key=lambda m: m.time),
                gpu_types=_types_run(sams, str(j.get("gpu_type") or "")),
            )
        )
    total = total_gpus or int(meta.get("total_gpus", 0) or 0) or _pool_gpus(meta)
    util = _utilisation(out)
    if not total:
        total = max((g for _, g in util), default=0)
    windows = _windows(meta, origin, end)
    return Report(source, total, round(origin, 3), _r(end), out, util, windows)


def _windows(meta: dict[str, str], origin: float, end: float) -> list[WindowSpan]:
    """The windows the controller recorded (meta ``windows``) that overlap the report."""
    try:
        raw = json.loads(meta.get("windows") or "[]")
    except json.JSONDecodeError:
        return []
    out = []
    for w in raw if isinstance(raw, list) else []:
        try:
            start, stop = float(w["start"]) - origin, float(w["end"] or 0) - origin
            nodes = [str(n) for n in w["nodes"]]
            stop = stop if w["end"] else end
            span = WindowSpan(
                str(w["name"]), nodes, _r(start), _r(stop), bool(w.get("maintenance"))
            )
        except (KeyError, TypeError, ValueError):
            continue
        if span.end > 0 and span.start < end:
            out.append(span)
    return out


def _types_run(sams: list[dict[str, Any]], last: str) -> list[str]:
    """The GPU types a job ran on: its samples' (in order), and its last launch's."""
    out: list[str] = []
    for t in [*(str(s.get("gpu_type") or "") for s in sams), last]:
        if t and t not in out:
            out.append(t)
    return out


def _pool_gpus(meta: dict[str, str]) -> int:
    """The GPUs of the pool's usable nodes, as the controller last stored them (0: none)."""
    try:
        nodes = json.loads(meta.get("pool") or "[]")
        return sum(int(n["gpus"]) for n in nodes if n.get("usable", True))
    except (ValueError, TypeError, KeyError, AttributeError):
        return 0


def _segments(
    mine: list[dict[str, Any]],
    sams: list[dict[str, Any]],
    origin: float,
    job_end: float,
    started_at: float,
) -> tuple[list[Segment], list[Segment]]:
    """The GPUs one job held, launch by launch. A launch runs from when it ran: the first
    launch from when the controller saw it running, a relaunch from its first training
    step (the first step it reported, less the steps it had made by then; one that never
    reported one: its start decision) until Slurm released it (the requeue after a stop),
    the next launch, or the job's end. A start decision alone is not holding GPUs: Slurm
    may keep the launch pending until others free them. Second list: from each start
    decision to that launch's training."""
    starts = [d for d in mine if d["action"] == "start" and d["status"] == "done"]
    segments: list[Segment] = []
    starting: list[Segment] = []
    for k, d in enumerate(starts):
        t0 = float(d["done_at"] or d["time"]) - origin
        t_next = float(starts[k + 1]["time"]) - origin if k + 1 < len(starts) else job_end
        end = t_next
        for r in mine:
            t = float(r["done_at"] or r["time"]) - origin
            if r["action"] in ("requeue", "requeue_hold") and t0 < t <= t_next:
                end = t
                break
        before = [s for s in sams if float(s["time"]) - origin <= t0]
        prev_step = int(before[-1]["step"]) if before else 0
        first = next((s for s in sams if t0 < float(s["time"]) - origin <= end), None)
        start = t0
        if k == 0 and started_at > 0 and t0 <= started_at - origin <= end:
            start = started_at - origin
        elif first is not None:
            steps = max(1, int(first["step"]) - prev_step)
            start = max(t0, float(first["time"]) - origin - steps * float(first["step_time"]))
        if start - t0 >= 0.5:
            starting.append(Segment(_r(t0), _r(min(start, end)), int(d["to_gpus"])))
        if end > start:
            kind = str(first.get("gpu_type") or "") if first is not None else ""
            segments.append(Segment(_r(start), _r(end), int(d["to_gpus"]), kind))
    return segments, starting


def _utilisation(jobs: list[JobReport]) -> list[tuple[float, int]]:
    edges: dict[float, int] = {}
    for j in jobs:
        for s in j.segments:
            edges[s.start] = edges.get(s.start, 0) + s.gpus
            edges[s.end] = edges.get(s.end, 0) - s.gpus
    held, steps = 0, []
    for t in sorted(edges):
        held += edges[t]
        steps.append((t, held))
    return steps


def summary_rows(report: Report) -> list[list[str]]:
    """One row per job: the table ``hpcorch report`` prints."""
    rows = []
    for j in report.jobs:
        rows.append(
            [
                str(j.job_id),
                j.name,
                j.mode,
                j.phase,
                f"{j.jct_s:.0f}" if j.jct_s is not None else "-",
                f"{j.gpu_hours:.4f}",
                str(j.resizes),
                ",".join(map(str, j.batches)) or "-",
                f"{j.final_loss:.4f}" if j.final_loss is not None else "-",
            ]
        )
    return rows


SUMMARY_HEADERS = [
    "JOBID",
    "NAME",
    "MODE",
    "PHASE",
    "JCT_S",
    "GPU_HOURS",
    "RESIZES",
    "BATCH_SIZES",
    "FINAL_LOSS",
]


def summary_table(report: Report) -> tuple[list[str], list[list[str]]]:
    """The headers and rows ``hpcorch report`` prints: with a GPU_TYPES column (the types
    each job ran on, in order) when any job ran on a named GPU type."""
    rows = summary_rows(report)
    if not any(j.gpu_types for j in report.jobs):
        return SUMMARY_HEADERS, rows
    return [*SUMMARY_HEADERS, "GPU_TYPES"], [
        [*row, ",".join(j.gpu_types) or "-"] for row, j in zip(rows, report.jobs, strict=True)
    ]
