"""The controller engine against the direct loop (the test oracle), per workload.

    python benchmarks/simulate_engines.py [--policies fifo,tiresias] [--loads 1.0]

Three runs per workload and policy: the direct loop (a round a minute, a flat 30 s
restart cost: Pollux's simulator's model); the controller engine as it ships (10 s cycles,
1 s while a job starts or stops, the real pool's resize cost); and the controller engine
set to model what the direct loop models (a 60 s cycle and a flat 30 s start-up), which
isolates the engine itself from the loop's timing. Prints average JCT and the ratios, per
workload and their means, beside Tiresias's published figures.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from hpcorch.policy import make_policy
from hpcorch.sim.config import SimConfig
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.costs import ResizeCost
from hpcorch.sim.loop import simulate
from hpcorch.sim.report import table
from hpcorch.sim.traces import default_data_dir, load_apps
from hpcorch.sim.workload import load_workload


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="fifo,tiresias")
    ap.add_argument("--loads", default="1.0")
    args = ap.parse_args()
    data = default_data_dir()
    apps = load_apps(data)
    cfg = SimConfig(restart_cost=30.0)
    flat = ResizeCost(0.0, 0.0, 0.0, 30.0)
    for load in args.loads.split(","):
        pub = json.loads((data / "published-results" / f"tiresias-load-{load}.json").read_text())
        paths = sorted(
            (data / "workloads" / f"load-{load}").glob("workload-*.csv"),
            key=lambda p: int(p.stem.split("-")[1]),
        )
        for policy in args.policies.split(","):
            rows: list[list[object]] = []
            for path in paths:
                jobs = load_workload(path, apps)
                t0 = time.process_time()
                d = simulate(jobs, make_policy(policy), apps, cfg).avg_jct
                c = simulate_controlled(jobs, make_policy(policy), apps, cfg).avg_jct
                m = simulate_controlled(
                    jobs,
                    make_policy(policy),
                    apps,
                    cfg,
                    cost=flat,
                    interval_s=60.0,
                    fast_interval_s=60.0,
                ).avg_jct
                published = float(np.mean(list(pub["jcts"][path.stem].values())))
                rows.append([path.stem, d, c, m, c / d - 1, m / d - 1, published])
                print(
                    f"load {load} {path.stem} {policy}: direct {d:.0f} s, controller {c:.0f} s,"
                    f" matched {m:.0f} s ({time.process_time() - t0:.0f} s CPU)",
                    file=sys.stderr,
                    flush=True,
                )
            cols = np.array([r[1:] for r in rows], dtype=float)
            mean = cols.mean(axis=0)
            rows.append(
                [
                    "mean",
                    mean[0],
                    mean[1],
                    mean[2],
                    mean[1] / mean[0] - 1,
                    mean[2] / mean[0] - 1,
                    mean[5],
                ]
            )
            print(f"\n## {policy}, load {load}: average JCT (s)\n")
            print(
                table(
                    [
                        "workload",
                        "direct",
                        "controller",
                        "matched",
                        "ctl/direct",
                        "matched/direct",
                        "tiresias (pub)",
                    ],
                    [[*r[:4], f"{r[4]:+.1%}", f"{r[5]:+.1%}", r[6]] for r in rows],
                )
            )


if __name__ == "__main__":
    main()
