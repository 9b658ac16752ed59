"""Every policy on the 16 shared workloads, beside the published figures and the bound.

    python benchmarks/simulate_all.py [--policies fifo,tiresias,ones,aiturbo,sidecar]
                                      [--loads 1.0,0.5] [--procs 1] [--data DIR]
                                      [--engine controller|direct]

Runs the production controller over the simulated Slurm (``hpcorch simulate``'s default
engine: 10 s cycles, 1 s while a job starts or stops, 60 s rounds, the real pool's resize
cost in hpcorch/sim/costs.py). Prints, per load, a table of average JCT per workload and
policy with the lower bound and the published Pollux / Tiresias / Optimus averages, the
mean row, p99 JCT, then the targets (Tiresias fidelity, ONES vs Pollux), the ONES decision
time per round at 64 GPUs and the CPU and wall time of one 160-job ONES simulation. The
4096-GPU scaling run is ``benchmarks/scaling.py``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from hpcorch.policy import POLICIES, make_policy
from hpcorch.sim.config import SimConfig
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.costs import ResizeCost
from hpcorch.sim.loop import simulate
from hpcorch.sim.report import table
from hpcorch.sim.traces import default_data_dir, load_apps
from hpcorch.sim.workload import load_workload

PUBLISHED = ("pollux", "tiresias", "optimus")


def run_one(args: tuple[str, str, str, str, str]) -> dict[str, object]:
    data, load, workload, policy, engine = args
    apps = load_apps(Path(data))
    jobs = load_workload(Path(data) / "workloads" / f"load-{load}" / f"{workload}.csv", apps)
    t0, c0 = time.perf_counter(), time.process_time()
    if engine == "direct":
        res = simulate(jobs, make_policy(policy), apps, SimConfig(restart_cost=30.0))
    else:
        res = simulate_controlled(jobs, make_policy(policy), apps)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "load": load,
        "workload": workload,
        "policy": policy,
        "wall_s": wall,
        "cpu_s": cpu,
        **res.summary(),
    }


def published(data: Path, load: str) -> dict[str, dict[str, tuple[float, float]]]:
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for name in PUBLISHED:
        path = data / "published-results" / f"{name}-load-{load}.json"
        jcts = json.loads(path.read_text())["jcts"]
        out[name] = {
            w: (float(np.mean(list(v.values()))), float(np.percentile(list(v.values()), 99)))
            for w, v in jcts.items()
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--loads", default="1.0,0.5")
    ap.add_argument("--procs", type=int, default=1)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--engine", choices=("controller", "direct"), default="controller")
    args = ap.parse_args()
    data = (args.data or default_data_dir()).resolve()
    policies = [p for p in args.policies.split(",") if p]
    loads = [x for x in args.loads.split(",") if x]
    tasks = []
    for load in loads:
        for path in sorted((data / "workloads" / f"load-{load}").glob("workload-*.csv")):
            for policy in policies:
                tasks.append((str(data), load, path.stem, policy, args.engine))
    # Longest first so the pool stays busy.
    tasks.sort(key=lambda t: (t[3] != "ones", t[1] != "1.0"))
    results: list[dict[str, object]] = []
    t0 = time.perf_counter()
    if args.engine == "controller":
        how = f"controller engine, 10 s cycles, resize cost {ResizeCost().describe()}"
    else:
        how = "direct loop (test oracle), 30 s restart cost"
    print(f"{len(tasks)} simulations: {how}", file=sys.stderr, flush=True)
    with ProcessPoolExecutor(max_workers=args.procs) as pool:
        for i, res in enumerate(pool.map(run_one, tasks), start=1):
            results.append(res)
            print(
                f"[{i}/{len(tasks)} {time.perf_counter() - t0:6.0f} s] {res['load']} "
                f"{res['workload']} {res['policy']}: avg JCT {res['avg_jct']:.0f} s "
                f"({res['cpu_s']:.1f} s CPU)",
                file=sys.stderr,
                flush=True,
            )
    for load in loads:
        report(data, load, policies, [r for r in results if r["load"] == load])


def _get(rows: list[dict[str, object]], w: str, p: str, key: str) -> float:
    for r in rows:
        if r["workload"] == w and r["policy"] == p:
            return float(r[key])  # type: ignore[arg-type]
    return float("nan")


def report(data: Path, load: str, policies: list[str], rows: list[dict[str, object]]) -> None:
    pub = published(data, load)
    workloads = sorted({str(r["workload"]) for r in rows}, key=lambda w: int(w.split("-")[1]))
    print(f"\n## Load {load}: average JCT (s) per workload\n")
    headers = ["workload", "bound", *policies, *(f"{p} (pub)" for p in PUBLISHED)]
    body: list[list[object]] = []
    for w in workloads:
        body.append(
            [
                w,
                _get(rows, w, policies[0], "lower_bound"),
                *(_get(rows, w, p, "avg_jct") for p in policies),
                *(pub[p][w][0] for p in PUBLISHED),
            ]
        )
    mean = ["mean", *np.nanmean(np.array([r[1:] for r in body], dtype=float), axis=0)]
    print(table(headers, [*body, mean]))
    print(f"\n## Load {load}: p99 JCT (s) per workload\n")
    p99 = [
        [
            w,
            *(_get(rows, w, p, "p99_jct") for p in policies),
            *(pub[p][w][1] for p in PUBLISHED),
        ]
        for w in workloads
    ]
    p99_mean = ["mean", *np.nanmean(np.array([r[1:] for r in p99], dtype=float), axis=0)]
    print(table(["workload", *policies, *(f"{p} (pub)" for p in PUBLISHED)], [*p99, p99_mean]))
    print(f"\n## Load {load}: avg JCT / bound, utilization, restarts per job (means)\n")
    summ = []
    for p in policies:
        sel = [r for r in rows if r["policy"] == p]
        summ.append(
            [
                p,
                float(np.mean([float(r["avg_jct"]) / float(r["lower_bound"]) for r in sel])),  # type: ignore[arg-type]
                float(np.mean([float(r["utilization"]) for r in sel])),  # type: ignore[arg-type]
                float(np.mean([float(r["restarts_per_job"]) for r in sel])),  # type: ignore[arg-type]
                float(np.mean([float(r["decision_ms_mean"]) for r in sel])),  # type: ignore[arg-type]
                float(np.max([float(r["decision_ms_max"]) for r in sel])),  # type: ignore[arg-type]
                float(np.max([float(r["wall_s"]) for r in sel])),  # type: ignore[arg-type]
                float(np.max([float(r["cpu_s"]) for r in sel])),  # type: ignore[arg-type]
            ]
        )
    print(
        table(
            [
                "policy",
                "avg/bound",
                "util",
                "restarts/job",
                "decide ms",
                "max ms",
                "max wall s",
                "max CPU s",
            ],
            summ,
        )
    )
    print(f"\n## Load {load}: targets\n")
    pol_mean = float(np.mean([pub["pollux"][w][0] for w in workloads]))
    pol_p99 = float(np.mean([pub["pollux"][w][1] for w in workloads]))
    if "tiresias" in policies:
        ours = [_get(rows, w, "tiresias", "avg_jct") for w in workloads]
        theirs = [pub["tiresias"][w][0] for w in workloads]
        dev = [abs(a / b - 1) for a, b in zip(ours, theirs, strict=True)]
        m = float(np.mean(ours)) / float(np.mean(theirs)) - 1
        print(
            f"tiresias fidelity: mean {np.mean(ours):.0f} s vs published {np.mean(theirs):.0f} s "
            f"({m:+.1%}, target within 5%); worst workload {max(dev):.1%} (target within 10%)"
        )
    if "ones" in policies:
        ours = [_get(rows, w, "ones", "avg_jct") for w in workloads]
        ours_mean = float(np.mean(ours))
        ours_p99 = float(np.mean([_get(rows, w, "ones", "p99_jct") for w in workloads]))
        factor = ONES_TARGET.get(load, 0.85)
        worse = [w for w, x in zip(workloads, ours, strict=True) if x > pub["pollux"][w][0]]
        worst = max(x / pub["pollux"][w][0] for w, x in zip(workloads, ours, strict=True))
        print(
            f"ones: mean avg JCT {ours_mean:.0f} s = {ours_mean / pol_mean:.3f} x Pollux "
            f"{pol_mean:.0f} s (target <= {factor:.2f} x = {factor * pol_mean:.0f} s); worst "
            f"workload {worst:.3f} x"
            f" ({len(worse)} above Pollux); mean p99 {ours_p99:.0f} s vs Pollux {pol_p99:.0f} s"
        )
        sel = [r for r in rows if r["policy"] == "ones"]
        print(
            "ones decision per round at 64 GPUs (CPU time): mean "
            f"{np.mean([float(r['decision_ms_mean']) for r in sel]):.1f} ms, max "  # type: ignore[arg-type]
            f"{np.max([float(r['decision_ms_max']) for r in sel]):.1f} ms (target <= 50 ms); "  # type: ignore[arg-type]
            f"160-job simulation max {np.max([float(r['cpu_s']) for r in sel]):.1f} s CPU, "  # type: ignore[arg-type]
            f"{np.max([float(r['wall_s']) for r in sel]):.1f} s wall (target <= 60 s on one core)"  # type: ignore[arg-type]
        )


ONES_TARGET = {"1.0": 0.85, "0.5": 0.93}
"""ONES through the controller engine: mean avg JCT at most this times Pollux's published."""


if __name__ == "__main__":
    main()
