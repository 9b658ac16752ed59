"""A pool of three GPU types: type-aware ONES against type-blind ONES, one pool per type and
a Gavel-style throughput-matrix policy, through the controller that ships.

    python benchmarks/hetero.py [--policies ones,ones-blind,per-type,gavel] [--loads 1.0,0.5]
                                [--regimes known,cold] [--workloads 1,2] [--seeds 0,1,2,3]
                                [--procs 2] [--save benchmarks/results/hetero.json]

The pool: 16 nodes of 4 GPUs, ``POOL`` types (A100, V100 and T4 nodes). Each bundled
application runs on a type at its speed factor (``hpcorch/sim/data/gpu-types``: compute
scaled, all-reduce as measured on the T4s of the traces). Policies:

* ``ones``: hpcorch's ONES deciding type, GPUs and batch per job;
* ``ones-blind``: ONES shown one pool of alike GPUs, its launches free to span types (they
  run at the slowest type's speed);
* ``per-type``: one pool per type, as sites run mixed clusters today, each job assigned a
  type at submission (a weighted round-robin in proportion to the types' GPUs), ONES in
  each pool;
* ``gavel``: heterogeneity-aware LAS with Gavel's throughput matrix and round-based
  mechanism (non-elastic jobs at their requested GPUs and batch).

Every policy runs with each of ``--seeds`` (its search's random numbers; Gavel's are not
random), and a figure is the mean over the workloads and seeds: one seed's run moves the
average JCT by a few percent either way. Prints per load and regime the mean of average
JCT, p99 JCT and makespan, decision times, and the targets (type-aware ONES at least 25%
below ones-blind and per-type, 10% below gavel, in the cold regime). ``--save`` writes the rows (a
``results`` list) as JSON.
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

from hpcorch.policy import make_policy
from hpcorch.policy.ones import OnesPolicy
from hpcorch.policy.types import Policy
from hpcorch.policy.typewrap import PerType, TypeBlind
from hpcorch.sim.config import SimConfig
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.regime import Regime
from hpcorch.sim.report import table
from hpcorch.sim.traces import default_data_dir, load_apps
from hpcorch.sim.workload import load_workload

POOL = (("a100", 4), ("v100", 4), ("t4", 8))
"""(type, nodes of 4 GPUs): 16 A100, 16 V100 and 32 T4 GPUs."""
POLICIES = ("ones", "ones-blind", "per-type", "gavel")
TARGETS = {"ones-blind": 0.75, "per-type": 0.75, "gavel": 0.90}
"""Type-aware ONES's mean average JCT at most this fraction of each baseline's (cold)."""

Task = tuple[str, str, str, str, str, int]


def make(policy: str, seed: int = 0) -> Policy:
    if policy == "ones":
        return OnesPolicy(seed=seed)
    if policy == "ones-blind":
        return TypeBlind(OnesPolicy(seed=seed), name="ones-blind")
    if policy == "per-type":
        return PerType(lambda: OnesPolicy(seed=seed), name="per-type")
    if policy == "gavel":
        return make_policy("gavel", seed)
    raise SystemExit(f"unknown policy {policy!r} (valid: {', '.join(POLICIES)})")


def run_one(task: Task) -> dict[str, object]:
    data, load, workload, policy, regime, seed = task
    apps = load_apps(Path(data))
    jobs = load_workload(Path(data) / "workloads" / f"load-{load}" / f"{workload}.csv", apps)
    cfg = SimConfig(regime=Regime(regime), gpu_types=POOL)
    t0, c0 = time.perf_counter(), time.process_time()
    res = simulate_controlled(jobs, make(policy, seed), apps, cfg, mix_types=policy == "ones-blind")
    return {
        "load": load,
        "workload": workload,
        "policy": policy,
        "regime": regime,
        "seed": seed,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        **res.summary(),
    }


def _mean(rows: list[dict[str, object]], load: str, regime: str, policy: str, key: str) -> float:
    vals = [
        float(r[key])  # type: ignore[arg-type]
        for r in rows
        if (r["load"], r["regime"], r["policy"]) == (load, regime, policy)
    ]
    return float(np.mean(vals)) if vals else float("nan")


def report(rows: list[dict[str, object]]) -> None:
    loads = sorted({str(r["load"]) for r in rows}, reverse=True)
    regimes = [g for g in ("known", "cold") if any(r["regime"] == g for r in rows)]
    policies = [p for p in POLICIES if any(r["policy"] == p for r in rows)]
    workloads = sorted({str(r["workload"]) for r in rows})
    pool = ", ".join(f"{n * 4} {t}" for t, n in POOL)
    seeds = sorted({int(r.get("seed", 0)) for r in rows})  # type: ignore[call-overload]
    print(f"\npool: {pool} GPUs; workloads {', '.join(workloads)}; seeds {seeds}")
    for load in loads:
        for regime in regimes:
            print(f"\n## Load {load}, {regime}: means over the workloads and seeds\n")
            body = []
            for p in policies:
                avg = _mean(rows, load, regime, p, "avg_jct")
                ones = _mean(rows, load, regime, "ones", "avg_jct")
                body.append([
                    p, avg, _mean(rows, load, regime, p, "p99_jct"),
                    _mean(rows, load, regime, p, "makespan"), ones / avg,
                    _mean(rows, load, regime, p, "decision_ms_mean"),
                    _mean(rows, load, regime, p, "decision_ms_max"),
                ])  # fmt: skip
            print(table(["policy", "avg JCT s", "p99 JCT s", "makespan s", "ones / this",
                         "decide ms", "max ms"], body))  # fmt: skip
    print("\n## Targets (cold regime: type-aware ONES's avg JCT / the baseline's)\n")
    for load in loads:
        ones = _mean(rows, load, "cold", "ones", "avg_jct")
        for base, aim in TARGETS.items():
            other = _mean(rows, load, "cold", base, "avg_jct")
            if np.isnan(ones) or np.isnan(other):
                continue
            ok = "met" if ones / other <= aim else "NOT met"
            print(f"load {load}: ones / {base} = {ones / other:.3f} (target <= {aim:.2f}): {ok}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--loads", default="1.0,0.5")
    ap.add_argument("--regimes", default="known,cold")
    ap.add_argument("--workloads", default="1,2", help="numbers, e.g. 1,2")
    ap.add_argument("--seeds", default="0,1,2,3", help="the policies' seeds, e.g. 0,1")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--load-results", type=Path, default=None)
    args = ap.parse_args()
    if args.load_results:
        report(json.loads(args.load_results.read_text())["results"])
        return
    data = args.data or default_data_dir()
    try:
        seeds = [int(x) for x in args.seeds.split(",")]
    except ValueError:
        raise SystemExit(f"--seeds: not a list of integers: {args.seeds!r}") from None
    tasks: list[Task] = [
        (str(data), load, f"workload-{w}", p, g, seed)
        for load in args.loads.split(",")
        for g in args.regimes.split(",")
        for w in args.workloads.split(",")
        for p in args.policies.split(",")
        for seed in seeds
        if seed == seeds[0] or p != "gavel"  # Gavel's rounds draw no random numbers
    ]
    for t in tasks:
        make(t[3])  # a bad name fails before any simulation
    rows: list[dict[str, object]] = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=max(1, args.procs)) as pool:
        for row in pool.map(run_one, tasks):
            rows.append(row)
            print(
                f"[{len(rows)}/{len(tasks)} {time.perf_counter() - t0:.0f} s] load {row['load']} "
                f"{row['workload']} {row['regime']} {row['policy']} seed {row['seed']}: avg JCT "
                f"{float(row['avg_jct']):.0f} s",  # type: ignore[arg-type]
                flush=True,
            )
    report(rows)
    if args.save:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        meta = {"pool": [list(p) for p in POOL], "workloads": args.workloads, "seeds": seeds}
        args.save.write_text(json.dumps({**meta, "results": rows}, indent=1) + "\n")
        print(f"\nsaved {args.save}")


if __name__ == "__main__":
    main()
