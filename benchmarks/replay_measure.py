"""What a replay on the real pool measured (benchmarks/replay.py): the run's figures, as
`hpcorch simulate` computes them for its own run, and the cost of each part of a launch.

Read from the controller's store (its jobs and decisions), the jobs' own metrics lines and
the times the replay's poller first saw each launch RUNNING in Slurm.
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

POOL_GPUS = 16


def _rows(state_db: Path, sql: str) -> list[dict[str, Any]]:
    db = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True, timeout=10)
    db.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in db.execute(sql)]
    finally:
        db.close()


def _starts(decisions: list[dict[str, Any]], jid: int) -> list[float]:
    return sorted(
        float(d["done_at"] or d["time"])
        for d in decisions
        if int(d["slurm_id"]) == jid and d["action"] == "start" and d["status"] == "done"
    )


def overlap(a: float, b: float, windows: Sequence[tuple[float, float]]) -> float:
    """Seconds of ``[a, b]`` inside ``windows`` (disjoint)."""
    return sum(max(0.0, min(b, hi) - max(a, lo)) for lo, hi in windows)


def planned_waits(
    decisions: list[dict[str, Any]],
    running: dict[int, list[float]],
    end: float,
    paused: Sequence[tuple[float, float]] = (),
) -> list[tuple[float, int]]:
    """(seconds, job) for each launch the controller released: how long it stayed pending
    in Slurm, to the first time it was seen running after the release (``running``), else
    to the controller's next decision on the job (a launch held again and planned afresh).
    A launch seen running after its decision but before the decision was stored (the end
    of a cycle whose many Slurm calls took seconds: a short job can start and end
    meanwhile) waited 0 s, not until the next decision. The seconds inside ``paused``
    (slurmctld stopped: nothing can start) are not counted."""
    waits = []
    for jid in {int(d["slurm_id"]) for d in decisions}:
        mine = sorted(
            (float(d["done_at"] or d["time"]), str(d["action"]), float(d["time"]))
            for d in decisions
            if int(d["slurm_id"]) == jid and d["status"] == "done"
        )
        seen = sorted(running.get(jid, []))
        for k, (t, action, decided) in enumerate(mine):
            if action != "start":
                continue
            nxt = mine[k + 1][0] if k + 1 < len(mine) else end
            ran = next((r for r in seen if r >= min(t, decided) - 1.0), None)
            until = min(ran, nxt) if ran is not None else nxt
            waits.append((max(0.0, until - t - overlap(t, until, paused)), jid))
    return waits


def real_summary(
    state_db: Path,
    t0: float,
    ids: list[int],
    running: dict[int, list[float]],
    pool_gpus: int = POOL_GPUS,
    paused: Sequence[tuple[float, float]] = (),
) -> dict[str, Any]:
    """avg and p99 JCT, makespan (from the replay's start), restarts per job (launches - 1),
    GPU utilisation (GPU-seconds held over the pool's ``pool_gpus`` from the first arrival
    to the last completion) and the longest planned launch's wait in Slurm, as the
    simulator's; with ``paused`` (the windows slurmctld was stopped), also the longest
    wait outside them."""
    jobs = [j for j in _rows(state_db, "SELECT * FROM jobs") if int(j["slurm_id"]) in ids]
    names = {int(j["slurm_id"]): str(j["name"]) for j in jobs}
    decisions = _rows(state_db, "SELECT * FROM decisions")
    done = [j for j in jobs if j["phase"] == "done" and float(j["finished_at"]) > 0]
    jcts = np.array([float(j["finished_at"]) - float(j["submit_time"]) for j in done] or [0.0])
    ends = [float(j["finished_at"]) for j in done] or [t0]
    makespan = max(ends) - t0
    first = min((float(j["submit_time"]) for j in jobs), default=t0) - t0
    used = sum(float(j["gpu_seconds"]) for j in jobs)
    span = max(makespan - first, 1e-9)
    # a launch ran when the poller saw it RUNNING, or (a job shorter than the poll) when
    # its processes reported their start, or it ended
    ran: dict[int, list[float]] = {i: list(v) for i, v in running.items()}
    for j in jobs:
        jid = int(j["slurm_id"])
        seen = ran.setdefault(jid, [])
        seen += [float(x["time"]) for x in _lines(str(j["job_dir"])) if x.get("event") == "start"]
        if float(j["finished_at"]) > 0:
            seen.append(float(j["finished_at"]))
    waits = planned_waits(decisions, ran, max(ends))
    outside = planned_waits(decisions, ran, max(ends), paused) if paused else waits
    longest = sorted(((w, names.get(i, str(i))) for w, i in waits), key=lambda x: -x[0])[:3]
    meta = {r["key"]: r["value"] for r in _rows(state_db, "SELECT key, value FROM meta")}
    return {
        "avg_jct": float(jcts.mean()),
        "p99_jct": float(np.percentile(jcts, 99)),
        "makespan": float(makespan),
        "restarts_per_job": float(np.mean([max(int(j["launches"]) - 1, 0) for j in jobs] or [0])),
        "gpu_utilisation": float(used / (span * pool_gpus)),
        "max_wait_planned_s": round(max((w for w, _ in waits), default=0.0), 1),
        "longest_planned_waits": [[name, round(w, 1)] for w, name in longest],
        "max_wait_planned_outside_stops_s": round(max((w for w, _ in outside), default=0.0), 1),
        "launches": int(sum(int(j["launches"]) for j in jobs)),
        "resizes": int(sum(int(j["resizes"]) for j in jobs)),
        # cycles in which the controller's view of a node's GPUs was not Slurm's
        "gpu_view_mismatches": int(meta.get("gpu_view_mismatches", "0") or 0),
    }


def _lines(job_dir: str) -> list[dict[str, Any]]:
    out = []
    for name in ("metrics.jsonl.1", "metrics.jsonl"):
        path = Path(job_dir) / name
        if not path.is_file():
            continue
        for raw in path.read_text(errors="replace").splitlines():
            try:
                line = json.loads(raw)
            except ValueError:
                continue
            if isinstance(line, dict):
                out.append(line)
    return out


def _stats(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    a = np.array(xs)
    return {
        "n": len(xs),
        "median": round(float(np.median(a)), 2),
        "mean": round(float(a.mean()), 2),
        "min": round(float(a.min()), 2),
        "max": round(float(a.max()), 2),
    }


def fit_startup(pairs: list[tuple[int, float]]) -> tuple[float, float]:
    """(a, b) of start-up = a + b x GPUs, least squares over the launches (GPUs, seconds):
    the mean line, since the average JCT is what real and simulated compare (a median line
    leaves out the slow starts that every average pays). b >= 0, a >= 0."""
    if not pairs:
        return 0.0, 0.0
    x = np.array([float(g) for g, _ in pairs])
    y = np.array([t for _, t in pairs])
    if len(set(x)) < 2:
        return round(float(y.mean()), 2), 0.0
    b, a = np.polyfit(x, y, 1)
    b = max(float(b), 0.0)
    a = max(float(np.mean(y - b * x)), 0.0)
    return round(a, 2), round(b, 2)


def launch_costs(state_db: Path, running: dict[int, list[float]]) -> dict[str, Any]:
    """Each part of a launch and of a resize, in seconds, over every launch of the run:

    * checkpoint: the job's signal received -> its checkpoint written (its own clock);
    * exit_to_requeue: checkpoint written -> the controller's requeue (the exit seen);
    * requeue_to_release: requeue -> the relaunch released (the relaunch delay; for a job
      stopped to give its GPUs to others, its wait in the queue as well);
    * release_to_running: release -> Slurm shows it RUNNING (the poller, 2 s);
    * running_to_first_step: RUNNING -> the first training step (batch script, Python,
      torch, process group, checkpoint read);
    * startup: release -> first step, what the simulator's ``startup_s`` stands for, and
      ``startup_fit``: a + b x GPUs fitted to it (``startup_s``, ``startup_per_gpu_s``);
    * finish: a completed job's last step ("done") -> its end in Slurm (its mean is the
      simulator's ``finish_s``).

    A launch held again before it ran (Slurm kept it pending) has no parts after release.
    """
    jobs = _rows(state_db, "SELECT slurm_id, job_dir, finished_at, phase FROM jobs")
    decisions = _rows(state_db, "SELECT * FROM decisions WHERE status = 'done'")
    parts: dict[str, list[float]] = {
        k: []
        for k in (
            "checkpoint", "exit_to_requeue", "requeue_to_release", "release_to_running",
            "running_to_first_step", "startup", "finish",
        )
    }  # fmt: skip
    by_gpus: list[tuple[int, float]] = []
    for j in jobs:
        jid = int(j["slurm_id"])
        lines = _lines(str(j["job_dir"]))
        firsts = sorted(float(x["time"]) for x in lines if x.get("event") == "first_step")
        ckpts = [x for x in lines if x.get("event") == "checkpoint" and x.get("reason") == "signal"]
        mine = [d for d in decisions if int(d["slurm_id"]) == jid]
        requeues = sorted(
            float(d["done_at"] or d["time"]) for d in mine if d["action"] == "requeue_hold"
        )
        seen = sorted(running.get(jid, []))
        acts = sorted(float(d["done_at"] or d["time"]) for d in mine)
        for t in _starts(decisions, jid):
            nxt = next((a for a in acts if a > t), math.inf)  # held again: another launch
            step = next((f for f in firsts if t < f < nxt), None)
            ran = next((r for r in seen if t - 1.0 <= r < nxt), None)
            if step is not None:
                parts["startup"].append(step - t)
                gpus = next(
                    (int(d["to_gpus"]) for d in mine if float(d["done_at"] or d["time"]) == t), 0
                )
                if gpus:
                    by_gpus.append((gpus, step - t))
            if ran is not None:
                parts["release_to_running"].append(max(0.0, ran - t))
                if step is not None and step >= ran:
                    parts["running_to_first_step"].append(step - ran)
        for c in ckpts:
            sig, written = c.get("signal_time"), c.get("written_time")
            if isinstance(sig, int | float) and isinstance(written, int | float):
                parts["checkpoint"].append(max(0.0, written - sig))
            if isinstance(written, int | float):
                rq = next((r for r in requeues if r >= written), None)
                if rq is not None:
                    parts["exit_to_requeue"].append(rq - written)
                    rel = next((t for t in _starts(decisions, jid) if t >= rq), None)
                    if rel is not None:
                        parts["requeue_to_release"].append(rel - rq)
        done = [float(x["time"]) for x in lines if x.get("event") == "done"]
        if j["phase"] == "done" and done and float(j["finished_at"]) > 0:
            parts["finish"].append(max(0.0, float(j["finished_at"]) - done[-1]))
    out: dict[str, Any] = {k: _stats(v) for k, v in parts.items()}
    a, b = fit_startup(by_gpus)
    out["startup_fit"] = {"startup_s": a, "startup_per_gpu_s": b, "launches": len(by_gpus)}
    return out
