"""What benchmarks/site_scale.py measures while the controller runs a site's workload:
slurmctld's RPC statistics (``sdiag``, reset between phases), slurmctld's CPU, the
controller's cycles as its store records them, its memory and its store's size, and the
summaries and tables made of them.
"""

from __future__ import annotations

import math
import re
import sqlite3
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchmarks.site_pool import cpu_seconds
from hpcorch.slurm.squeue_cache import SIGNATURE_ARGV

_RPC = re.compile(
    r"^\s+(\S+)\s+\(\s*(\d+)\)\s+count:(\d+)\s+ave_time:(\d+)\s+total_time:(\d+)", re.M
)
BINS = (0, 250, 500, 750, 1000, 1500, 2500)
"""Active jobs: the cycle statistics are given per bin [lo, next lo)."""
ACTION_CALLS = {"start": 3, "signal": 1, "hold": 1, "requeue_hold": 1, "cancel": 1,
                "allow_requeue": 1, "rebatch": 0}  # fmt: skip
"""Slurm calls the controller makes per action (docs/controller.md, "Slurm load"): a start
is three ``scontrol`` (shape, StartTime=now, release), a rebatch none (its plan file)."""


def sdiag(env: dict[str, str]) -> dict[str, Any]:
    """slurmctld's RPC counts since the last reset, by message type and by user."""
    out = subprocess.run(["sdiag"], env=env, capture_output=True, text=True, timeout=120).stdout
    by_type: dict[str, dict[str, int]] = {}
    by_user: dict[str, dict[str, int]] = {}
    section = ""
    for line in out.splitlines():
        if "statistics by message type" in line:
            section = "type"
        elif "statistics by user" in line:
            section = "user"
        elif line and not line[0].isspace():
            section = ""
        m = _RPC.match(line)
        if m and section:
            row = {"count": int(m[3]), "total_time_us": int(m[5])}
            (by_type if section == "type" else by_user)[m[1]] = row
    return {"by_type": by_type, "by_user": by_user}


def sdiag_reset(env: dict[str, str]) -> None:
    subprocess.run(["sdiag", "--reset"], env=env, capture_output=True, timeout=120)


@dataclass
class Phase:
    """A stretch of the run with slurmctld's RPC counts of its own (sdiag reset at its
    start)."""

    name: str
    start: float
    end: float = 0.0
    rpcs: dict[str, Any] = field(default_factory=dict)
    slurmctld_cpu_s: float = 0.0


class Phases:
    """Cut the run into phases: each cut reads sdiag and resets it."""

    def __init__(self, env: dict[str, str], cpu: Callable[[], float]) -> None:
        self.env, self.cpu = env, cpu
        self.done: list[Phase] = []
        self.current: Phase | None = None
        self._cpu0 = 0.0
        self.lock = threading.Lock()

    def cut(self, name: str) -> None:
        """End the current phase (if any) and begin ``name`` ('' to begin none)."""
        with self.lock:
            now, cpu = time.time(), self.cpu()
            if self.current is not None:
                self.current.end = now
                self.current.rpcs = sdiag(self.env)
                self.current.slurmctld_cpu_s = cpu - self._cpu0
                self.done.append(self.current)
            sdiag_reset(self.env)
            self.current = Phase(name, time.time()) if name else None
            self._cpu0 = cpu


def read_rows(db: Path, sql: str, args: Sequence[Any] = ()) -> list[dict[str, Any]]:
    if not db.exists():
        return []
    try:
        con = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=10)
        con.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in con.execute(sql, args)]
        finally:
            con.close()
    except sqlite3.Error:
        return []


def rss_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


class Sampler:
    """Every ``every`` seconds: the controller's new cycles (its store keeps only the last
    10000), its RSS and CPU seconds, the store's size and the jobs it has seen."""

    def __init__(self, state: Path, pid: int, every: float = 15.0) -> None:
        self.db = state / "state.db"
        self.pid, self.every = pid, every
        self.cycles: list[dict[str, Any]] = []
        self.memory: list[dict[str, float]] = []
        self._last_id = 0
        self._stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self.thread.start()

    def sample(self) -> None:
        rows = read_rows(self.db, "SELECT * FROM cycles WHERE id > ? ORDER BY id", (self._last_id,))
        if rows:
            self._last_id = int(rows[-1]["id"])
            self.cycles += rows
        seen = read_rows(self.db, "SELECT COUNT(*) AS n FROM jobs")
        size = sum(p.stat().st_size for p in self.db.parent.glob("state.db*") if p.is_file())
        self.memory.append({
            "time": time.time(), "jobs_seen": float(seen[0]["n"] if seen else 0),
            "rss_mb": round(rss_mb(self.pid), 1), "state_db_mb": round(size / 2**20, 2),
            "cpu_s": round(cpu_seconds(self.pid), 2), "cycles": float(self._last_id),
        })  # fmt: skip

    def _run(self) -> None:
        while not self._stop.wait(self.every):
            self.sample()

    def stop(self) -> None:
        self._stop.set()
        self.thread.join(30)
        self.sample()


def _pct(xs: Sequence[float], q: float) -> float:
    if not xs:
        return 0.0
    s = sorted(xs)
    k = min(len(s) - 1, max(0, math.ceil(q / 100 * len(s)) - 1))
    return round(s[k], 3)


def stats(xs: Sequence[float]) -> dict[str, float]:
    return {"n": len(xs), "p50": _pct(xs, 50), "p99": _pct(xs, 99), "max": _pct(xs, 100)}


def cycle_table(cycles: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Full and fast cycles' seconds, and the policy's decision time, per bin of active
    jobs."""
    out = []
    for lo, hi in zip(BINS, (*BINS[1:], math.inf), strict=True):
        rows = [c for c in cycles if lo <= int(c["jobs"]) < hi]
        if not rows:
            continue
        full = [float(c["seconds"]) for c in rows if int(c.get("full", 1))]
        fast = [float(c["seconds"]) for c in rows if not int(c.get("full", 1))]
        rounds = [float(c["decision_s"]) for c in rows if float(c["decision_s"]) > 0]
        out.append({
            "active_jobs": f"{lo}-{hi - 1:g}" if hi != math.inf else f"{lo}+",
            "full": stats(full), "fast": stats(fast), "decision": stats(rounds),
        })  # fmt: skip
    return out


def cpu_per_cycle(
    memory: Sequence[dict[str, float]], cycles: Sequence[dict[str, Any]], active: int
) -> dict[str, float]:
    """The controller's CPU seconds per cycle between the samples that bracket its cycles
    with at least ``active`` jobs: what a cycle costs it, whatever else the machine runs
    (its cycle seconds also count the waits for a CPU on a loaded machine)."""
    busy = [c for c in cycles if int(c["jobs"]) >= active]
    if not busy or len(memory) < 2:
        return {}
    first, last = int(busy[0]["id"]), int(busy[-1]["id"])
    before = [m for m in memory if m.get("cycles", 0) < first]
    after = [m for m in memory if m.get("cycles", 0) >= last]
    if not before or not after:
        return {}
    a, b = before[-1], after[0]
    n = b["cycles"] - a["cycles"]
    return {"cycles": n, "cpu_s": round(b["cpu_s"] - a["cpu_s"], 1),
            "cpu_s_per_cycle": round((b["cpu_s"] - a["cpu_s"]) / max(1.0, n), 2)}  # fmt: skip


def at_least(
    cycles: Sequence[dict[str, Any]], active: int, full: bool = True, less_decision: bool = False
) -> dict[str, float]:
    """Cycle seconds of the (full or fast) cycles with at least ``active`` jobs
    (``less_decision``: less the policy's decision time of a round's cycle)."""
    xs = [
        float(c["seconds"]) - (float(c["decision_s"]) if less_decision else 0.0)
        for c in cycles
        if int(c["jobs"]) >= active and bool(int(c.get("full", 1))) == full
    ]  # fmt: skip
    return stats(xs)


def rpc_phases(
    phases: Sequence[Phase],
    cycles: Sequence[dict[str, Any]],
    decisions: Sequence[dict[str, Any]],
    controller_user: str,
) -> list[dict[str, Any]]:
    """Per phase: the controller's RPCs as slurmctld counted them (sdiag, by user) against
    the Slurm calls its cycles made and the actions it took; RPCs per cycle, per minute
    and per call; the RPC types of the whole phase (everyone's)."""
    out = []
    for ph in phases:
        mine = [c for c in cycles if ph.start <= float(c["time"]) < ph.end]
        acts = [
            d for d in decisions
            if ph.start <= float(d["time"]) < ph.end and str(d["status"]) == "done"
        ]  # fmt: skip
        kinds: dict[str, int] = {}
        for d in acts:
            kinds[str(d["action"])] = kinds.get(str(d["action"]), 0) + 1
        calls = sum(int(c["slurm_calls"]) for c in mine)
        rpcs = int(ph.rpcs.get("by_user", {}).get(controller_user, {}).get("count", 0))
        minutes = max(1e-9, (ph.end - ph.start) / 60)
        n = max(1, len(mine))
        by_type = sorted(
            ((k, v["count"]) for k, v in ph.rpcs.get("by_type", {}).items()), key=lambda kv: -kv[1]
        )
        users = ph.rpcs.get("by_user", {})
        out.append({
            "phase": ph.name, "seconds": round(ph.end - ph.start, 1), "cycles": len(mine),
            "controller_rpcs": rpcs, "controller_calls": calls,
            "rpcs_per_call": round(rpcs / calls, 3) if calls else None,
            "rpcs_per_cycle": round(rpcs / n, 2), "rpcs_per_minute": round(rpcs / minutes, 1),
            "actions": kinds,
            "action_calls": sum(ACTION_CALLS.get(k, 1) * v for k, v in kinds.items()),
            "all_rpcs": sum(int(v["count"]) for v in users.values()),
            "by_user": {k: int(v["count"]) for k, v in users.items()},
            "by_type": dict(by_type[:25]),
            "slurmctld_cpu_s": round(ph.slurmctld_cpu_s, 1),
        })  # fmt: skip
    return out


def formula_check(cycles: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The bound on a cycle's Slurm calls, checked on every cycle: at most
    ``BASE`` + 3 x its actions (BASE: the four observation calls (the jobs' text
    signature, the JSON of those that changed, the JSON of the lease job, the nodes), the
    reservation and the fair shares read once a minute, the lease renewed every quarter of
    its time to live (its jobs read as the pool's are, in up to three calls, and the
    write), the one call that looks for jobs gone from the pool, and the limits
    (partitions and associations) read once a minute and when a job joins the pool)."""
    base = 4 + 2 + 4 + 1 + 2
    worst = max((int(c["slurm_calls"]) - 3 * int(c["actions"]) for c in cycles), default=0)
    over = [c for c in cycles if int(c["slurm_calls"]) > base + 3 * int(c["actions"])]
    steady = [int(c["slurm_calls"]) for c in cycles if int(c["actions"]) == 0]
    return {
        "formula": f"calls per cycle <= {base} + 3 x actions (RPCs = calls x rpcs_per_call)",
        "cycles": len(cycles),
        "cycles_over": len(over),
        "max_calls_minus_3_actions": worst,
        "calls_per_cycle_without_actions": stats([float(x) for x in steady]),
    }


def lines_about(log: str, words: Sequence[str]) -> list[str]:
    return [ln for ln in log.splitlines() if any(w in ln for w in words)]


CALIBRATED = {
    "squeue --json --states=all": ["squeue", "--json", "--states=all"],
    "squeue (text signature)": SIGNATURE_ARGV,
    "sinfo --json": ["sinfo", "--json"],
    "scontrol show nodes --json": ["scontrol", "show", "nodes", "--json"],
    "scontrol -o show reservation": ["scontrol", "-o", "show", "reservation"],
    "sshare": ["sshare", "-a", "-n", "-P", "-o", "User,FairShare"],
    "scontrol ping": ["scontrol", "ping"],
    "scontrol update (comment)": ["scontrol", "update", "jobid={job}", "Comment=calibration"],
    "scontrol hold": ["scontrol", "hold", "{job}"],
    "scontrol release": ["scontrol", "release", "{job}"],
}
"""The commands whose RPCs :func:`calibrate` counts, as the controller runs them."""


def calibrate(
    env: dict[str, str],
    as_user: Callable[..., list[str]],
    user: str,
    user_env: dict[str, str],
    job: int,
    extra: dict[str, list[str]] | None = None,
    times: int = 3,
) -> dict[str, dict[str, Any]]:
    """What each of the controller's Slurm commands (and ``extra`` ones) costs slurmctld,
    run ``times`` times as ``user`` (with ``user_env``) on a quiet pool (``job``: a held job
    of that user's to update): RPCs per command (sdiag, by user) and their types (by type,
    everyone's: sdiag's own among them)."""
    out: dict[str, dict[str, Any]] = {}
    for name, argv in {**CALIBRATED, **(extra or {})}.items():
        argv = [a.replace("{job}", str(job)) for a in argv]
        sdiag_reset(env)
        for _ in range(times):
            subprocess.run(as_user(user, user_env, *argv), capture_output=True, timeout=120)
        got = sdiag(env)
        mine = got["by_user"].get(user, {}).get("count", 0)
        types = {k: round(v["count"] / times, 2) for k, v in got["by_type"].items()}
        out[name] = {"rpcs": round(mine / times, 2), "types": types}
    sdiag_reset(env)
    return out
