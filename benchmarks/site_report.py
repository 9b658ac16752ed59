"""The results of benchmarks/site_scale.py: the targets checked, the row kept in
benchmarks/results/site_scale.json, the table printed, and what is read from the
controller's store and the jobs' directories once the run is over."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks import site_measure as sm

TARGETS = {
    "max_wait_planned_s": 120.0,
    "cycle_p99_s": {"commands": 2.0, "pyslurm": 0.5},
    "real_sim_avg_jct": 0.15,
    "active_jobs": 1000,
}


def launches_without_a_start(db: Path) -> int:
    """Launches the controller saw that no start of its own began (or that Slurm made of
    its own, a node failure aside): a launch made twice would show here."""
    starts: dict[int, int] = {}
    for d in sm.read_rows(db, "SELECT slurm_id, status FROM decisions WHERE action = 'start'"):
        if str(d["status"]) == "done" or str(d["status"]).startswith("unknown"):
            starts[int(d["slurm_id"])] = starts.get(int(d["slurm_id"]), 0) + 1
    extra = 0
    for j in sm.read_rows(db, "SELECT slurm_id, launches FROM jobs"):
        extra += max(0, int(j["launches"]) - starts.get(int(j["slurm_id"]), 0))
    return extra


def job_startups(db: Path) -> dict[str, float]:
    """Seconds from a light job's process start to its start report, over its launches."""
    ages = []
    for j in sm.read_rows(db, "SELECT job_dir FROM jobs"):
        path = Path(str(j["job_dir"])) / "metrics.jsonl"
        if not path.is_file():
            continue
        for raw in path.read_text(errors="replace").splitlines():
            if '"event": "start"' in raw:
                try:
                    ages.append(float(json.loads(raw)["since_start_at_init"]))
                except (ValueError, KeyError, TypeError):
                    continue
    return sm.stats(ages)


def check(doc: dict[str, Any]) -> dict[str, bool]:
    backend = doc["backend"]
    out = {
        "every job completed": doc["jobs_completed"] == doc["jobs"],
        "no job lost": doc["jobs_lost"] == 0,
        "no planned launch pending > 120 s (slurmctld's stops not counted)": doc.get(
            "max_wait_planned_outside_stops_s", doc["max_wait_planned_s"]
        )
        <= TARGETS["max_wait_planned_s"],
        "0 GPU-view mismatches": doc["gpu_view_mismatches"] == 0,
        f"{TARGETS['active_jobs']} active jobs reached": doc["max_active_jobs"]
        >= TARGETS["active_jobs"],
        f"full-cycle p99 <= {TARGETS['cycle_p99_s'][backend]:g} s at 1000 active jobs": (
            doc["cycles_at_1000"]["full"].get("n", 0) > 0
            and doc["cycle_p99_s"] <= TARGETS["cycle_p99_s"][backend]
        ),
        "RPCs per cycle within the formula": doc["rpc_formula"]["cycles_over"] == 0,
        "no launch made twice": doc["unplanned_launches"] == 0
        and doc["launches_without_a_start"] == 0,
    }
    if "sim" in doc:
        sim = doc["sim"]["avg_jct"]
        doc["real_sim_avg_jct"] = round(doc["real"]["avg_jct"] / sim, 3) if sim else None
        out["real/sim avg JCT within 15%"] = (
            bool(sim) and abs(doc["real"]["avg_jct"] - sim) / sim <= TARGETS["real_sim_avg_jct"]
        )
    return out


def save(doc: dict[str, Any], path: Path) -> None:
    """``doc`` as the row of its Slurm release and backend in ``path``'s ``runs``."""
    old = json.loads(path.read_text()) if path.exists() else {}
    key = (doc["slurm_version"], doc["backend"])
    runs = [r for r in old.get("runs", []) if (r.get("slurm_version"), r.get("backend")) != key]
    runs.append(doc)
    runs.sort(key=lambda r: (str(r.get("slurm_version")), str(r.get("backend"))))
    text = json.dumps({"benchmark": "benchmarks/site_scale.py", "runs": runs}, indent=1)
    path.write_text(text + "\n")


def _st(st: dict[str, float]) -> str:
    if not st.get("n"):
        return "-".ljust(28)
    return f"{st['p50']:.3f}/{st['p99']:.3f}/{st['max']:.3f} ({st['n']:.0f})".ljust(28)


def table(doc: dict[str, Any]) -> str:
    """The run as a few tables of text."""
    real = doc["real"]
    lines = [
        f"Slurm {doc['slurm_version']} through {doc['backend']}: {doc['nodes']} nodes, "
        f"{doc['gpus']} GPUs, {doc['jobs']} jobs of {doc['users']} users, at most "
        f"{doc['max_active_jobs']} active",
        f"  completed {doc['jobs_completed']}/{doc['jobs']}, lost {doc['jobs_lost']}, "
        f"longest planned wait {doc['max_wait_planned_s']} s "
        f"({doc.get('max_wait_planned_outside_stops_s', '-')} s outside slurmctld's stops), "
        "GPU-view mismatches "
        f"{doc['gpu_view_mismatches']}, unplanned launches {doc['unplanned_launches']}, "
        f"launches without a start {doc['launches_without_a_start']}",
        "cycles (seconds) outside the incidents:",
        "  active jobs   full p50/p99/max (n)        fast p50/p99/max (n)        "
        "decision p50/p99/max (n)",
    ]
    for row in doc["cycles"]:
        cells = "".join(_st(row[k]) for k in ("full", "fast", "decision"))
        lines.append(f"  {row['active_jobs']:<13} {cells}")
    at = doc["cycles_at_1000"]
    lines.append(
        f"  >= 1000 active: full {_st(at['full'])}, less the policy's decision "
        f"{_st(at['full_without_decision'])}"
    )
    lines.append(
        "Slurm RPCs per phase (sdiag): phase, seconds, the controller's cycles, RPCs, "
        "per cycle, per minute, per call; everyone's RPCs; slurmctld CPU s"
    )
    for p in doc["rpc_phases"]:
        lines.append(
            f"  {p['phase'][:44]:<44} {p['seconds']:>6.0f} {p['cycles']:>6} "
            f"{p['controller_rpcs']:>7} {p['rpcs_per_cycle']:>6} {p['rpcs_per_minute']:>6.0f} "
            f"{p['rpcs_per_call'] or 0:>6} {p['all_rpcs']:>8} {p['slurmctld_cpu_s']:>7}"
        )
    cal = doc.get("rpcs_per_command") or {}
    if cal:
        lines.append(
            "  RPCs per command, as the controller's user on the quiet pool: "
            + ", ".join(f"{k} {v['rpcs']:g}" for k, v in cal.items())
        )
    f = doc["rpc_formula"]
    lines.append(
        f"  {f['formula']}: {f['cycles_over']} of {f['cycles']} cycles over; "
        f"max calls - 3 x actions {f['max_calls_minus_3_actions']}"
    )
    if doc["memory"]:
        m = doc["memory"][-1]
        lines.append(
            f"controller: RSS {max(x['rss_mb'] for x in doc['memory']):.0f} MB at most, store "
            f"{m['state_db_mb']} MB with {m['jobs_seen']:.0f} jobs seen"
        )
    if "sim" in doc:
        sim = doc["sim"]
        lines.append(
            f"avg JCT real {real['avg_jct']:.1f} s, simulated {sim['avg_jct']:.1f} s "
            f"(real/sim {doc.get('real_sim_avg_jct')}); makespan {real['makespan']:.0f} / "
            f"{sim['makespan']:.0f} s"
        )
    for inc in doc["incidents"]:
        lines.append(f"incident: {inc['what']}; the controller said:")
        lines += [f"    {ln[24:184]}" for ln in inc["controller_lines"][:6]]
    lines.append("targets:")
    lines += [f"  [{'x' if ok else ' '}] {name}" for name, ok in doc["targets"].items()]
    return "\n".join(lines)
