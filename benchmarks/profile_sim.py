"""Where the time of one controller-engine simulation goes, by part (CPU time).

    python benchmarks/profile_sim.py [load-1.0/workload-6] [--policy ones] [--top 15]

Runs the simulation once under cProfile (timer: the process's CPU time, so other work on
the machine does not count) and prints the CPU seconds of each part of hpcorch, and the
functions that cost most by their own time. A part's share counts the time spent in its
own modules' functions (numpy and sqlite calls are charged to the caller that made them).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpcorch.policy import make_policy
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.report import table
from hpcorch.sim.traces import default_data_dir, load_apps
from hpcorch.sim.workload import load_workload

ENTRIES = (
    # (part, file, function): the part's CPU time is the function's cumulative time
    ("whole run", "sim/controlled.py", "simulate_controlled"),
    ("  controller cycles", "controller/loop.py", "_cycle"),
    ("    policy decision (split + policy)", "policy/split.py", "split_schedule"),
    ("      ONES estimates (models, remaining times)", "policy/estimate.py", "estimate"),
    ("      ONES placement", "policy/placement.py", "place_schedule"),
    ("      CPUs per GPU", "policy/cpus.py", "fit_cpus"),
    ("    snapshot for the policy", "controller/snapshot.py", "build_snapshot"),
    ("    store: records, samples", "controller/memory.py", "write"),
    ("    store: intents", "controller/loop.py", "_intent"),
    ("    observation (simulated squeue/sinfo)", "sim/slurm_side.py", "observe"),
    ("    state machine", "controller/reconcile.py", "observe"),
    ("    metrics lines", "controller/loop.py", "_read_metrics"),
    ("    actions (simulated scontrol)", "controller/loop.py", "_execute"),
    ("  simulated world between cycles", "sim/slurm_side.py", "advance_to"),
    ("  lower bound", "sim/bound.py", "lower_bound"),
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workload", nargs="?", default="load-1.0/workload-6")
    ap.add_argument("--policy", default="ones")
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args()
    apps = load_apps()
    jobs = load_workload(default_data_dir() / "workloads" / f"{args.workload}.csv", apps)
    prof = cProfile.Profile(time.process_time)
    c0 = time.process_time()
    prof.enable()
    res = simulate_controlled(jobs, make_policy(args.policy), apps)
    prof.disable()
    cpu = time.process_time() - c0
    stats = pstats.Stats(prof)
    table_rows = []
    whole = 0.0
    for part, file, func in ENTRIES:
        cum = sum(
            v[3]
            for (path, _, name), v in stats.stats.items()  # type: ignore[attr-defined]
            if path.endswith(file) and name == func
        )
        whole = whole or cum
        table_rows.append([part, cum, f"{cum / whole:.0%}"])
    rows = [
        (v[2], f"{Path(path).name}:{line}({name})")
        for (path, line, name), v in stats.stats.items()  # type: ignore[attr-defined]
    ]
    print(
        f"{args.workload} {args.policy}: {len(res.jobs)} jobs, avg JCT {res.avg_jct:.0f} s, "
        f"{res.extra['cycles']:.0f} cycles, {len(res.decision_s)} rounds; "
        f"{cpu:.1f} s CPU under the profiler\n"
    )
    print(table(["part (cumulative)", "CPU s", "share"], table_rows))
    print()
    rows.sort(reverse=True)
    print(table(["function (own time)", "CPU s"], [[n, t] for t, n in rows[: args.top]]))


if __name__ == "__main__":
    main()
