"""What a per-user GPU limit costs, through the production controller over the simulated
Slurm (hpcorch/sim/limits.py), which keeps a launch over a limit pending with Slurm's
reason as slurmctld does.

    python benchmarks/limits.py [--workload load-1.0/workload-6] [--policy ones]
                                [--users 8] [--cap 16] [--save FILE.json]

The bundled workload's jobs are given ``--users`` users in turn; a QOS allows each user
``--cap`` GPUs (``MaxTRESPerUser=gres/gpu=CAP``) on the pool of 16 nodes x 4 GPUs. Three
runs: no limit; the limit, which the controller reads (as ``scontrol show assoc_mgr``
shows it); and the limit hidden from it, which it learns only from launches Slurm keeps
pending (``QOSMaxGRESPerUser``). Prints each run's average and p99 JCT, how many launches
Slurm kept pending for the limit and for how long at most, the most GPUs a user held at
once, and the policy's mean decision time (CPU).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from hpcorch.policy import make_policy
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.engine import SimCluster
from hpcorch.sim.limits import SimLimits
from hpcorch.sim.loop import SimConfig
from hpcorch.sim.traces import default_data_dir, load_apps
from hpcorch.sim.workload import load_workload


def run(workload: str, policy: str, limits: SimLimits | None) -> dict[str, float]:
    data = default_data_dir()
    apps = load_apps(data)
    jobs = load_workload(data / "workloads" / f"{workload}.csv", apps)
    peak = [0]
    users = limits or SimLimits()

    def watch(world: SimCluster) -> None:
        held: dict[str, int] = {}
        for i, m in enumerate(world.jobs):
            held[users.user(i)] = held.get(users.user(i), 0) + m.gpus
        peak[0] = max(peak[0], *held.values())

    t0 = time.perf_counter()
    res = simulate_controlled(
        jobs, make_policy(policy, 0), apps, SimConfig(), on_round=watch, limits=limits
    )
    jct = np.array([j.jct for j in res.jobs])
    return {
        "avg_jct_s": float(jct.mean()),
        "p99_jct_s": float(np.percentile(jct, 99)),
        "limit_pending": res.extra["limit_pending"],
        "limit_pending_max_s": res.extra["limit_pending_max_s"],
        "user_gpus_max": float(peak[0]),
        "jobs": float(len(jct)),
        "decide_ms": 1000 * float(np.mean(res.decision_s)) if res.decision_s else 0.0,
        "wall_s": time.perf_counter() - t0,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workload", default="load-1.0/workload-6")
    ap.add_argument("--policy", default="ones")
    ap.add_argument("--users", type=int, default=8)
    ap.add_argument("--cap", type=int, default=16)
    ap.add_argument("--save", type=Path)
    args = ap.parse_args()
    cap = SimLimits(users=args.users, user_gpus=args.cap)
    runs = {
        "no limit": SimLimits(users=args.users),
        f"{args.cap} GPUs a user, read": cap,
        f"{args.cap} GPUs a user, hidden": SimLimits(args.users, args.cap, visible=False),
    }
    print(
        f"{args.workload}, {args.policy}, 16 nodes x 4 GPUs, {args.users} users "
        "(jobs in turn), through the controller over the simulated Slurm"
    )
    head = f"{'run':<28} {'avg JCT':>9} {'p99 JCT':>9} {'pending':>8} {'longest':>8}"
    print(head + f" {'user GPUs':>10} {'decide':>8} {'wall':>6}")
    out: dict[str, dict[str, float]] = {}
    for name, lim in runs.items():
        r = out[name] = run(args.workload, args.policy, lim)
        print(
            f"{name:<28} {r['avg_jct_s']:>8.0f}s {r['p99_jct_s']:>8.0f}s "
            f"{r['limit_pending']:>8.0f} {r['limit_pending_max_s']:>7.1f}s "
            f"{r['user_gpus_max']:>10.0f} {r['decide_ms']:>6.0f}ms {r['wall_s']:>5.0f}s"
        )
    base = out["no limit"]["avg_jct_s"]
    for name, r in out.items():
        if name != "no limit":
            print(f"{name}: avg JCT {r['avg_jct_s'] / base:.3f} x no limit")
    if args.save:
        args.save.write_text(json.dumps({"args": vars(args) | {"save": str(args.save)},
                                         "runs": out}, indent=2) + "\n")  # fmt: skip


if __name__ == "__main__":
    main()
