"""Every policy in both information regimes, beside Pollux's published figures.

    python benchmarks/regimes.py [--policies ones,tiresias,fifo] [--loads 1.0,0.5]
                                 [--workloads 1,3,6] [--procs 2] [--engine direct|controller]
                                 [--robustness] [--save FILE.json] [--load-results FILE.json]

``known``: jobs of one application share what was learned of them (the bundled workloads
run one model per application). ``cold``: every job is new: its own application, no
completed-job history (``hpcorch simulate --regime cold``). With ``--robustness`` ONES also
runs with every job declaring half and twice the epochs it needs (in both regimes) and
with every other job new (``mixed``). Prints, per load, average and p99 JCT per workload,
the means and their ratio to Pollux, and the issue's targets for ONES. ``--save`` keeps the
raw figures; ``--load-results`` prints the tables of a saved run again. The policy
``ones+truth`` is ONES shown every job's true step times from its start: it separates
learning a job's scaling from scoring schedules.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from hpcorch.policy import make_policy
from hpcorch.policy.types import Plan, Policy, Snapshot, StepSample
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.loop import SimConfig, simulate
from hpcorch.sim.regime import Regime
from hpcorch.sim.report import table
from hpcorch.sim.traces import AppTrace, default_data_dir, load_apps
from hpcorch.sim.workload import load_workload

# (regime, declared epochs factor): the two regimes, then the robustness variants
REGIMES = [("known", 1.0), ("cold", 1.0)]
ROBUST = [("known", 0.5), ("known", 2.0), ("cold", 0.5), ("cold", 2.0), ("mixed", 1.0)]
# the targets for ONES: mean avg JCT / Pollux's published, per regime and load
TARGETS = {("cold", "1.0"): 0.85, ("cold", "0.5"): 0.92, ("known", "1.0"): 0.78,
           ("known", "0.5"): 0.88}  # fmt: skip

Task = tuple[str, str, str, str, str, float, str]
TRUTH = "ones+truth"
"""ONES shown every job's true step time at every configuration from its start (not a
schedule that can ship: it separates learning a job's scaling from scoring schedules)."""


class WithTruth:
    """``inner`` with each job's true step times added to what it measured; the job's
    model is recognised by the size it reports (each bundled model has its own)."""

    def __init__(self, inner: Policy, apps: dict[str, AppTrace]) -> None:
        self.inner, self.name = inner, TRUTH
        self.by_size = {a.model_bytes: a for a in apps.values()}
        self.memo: dict[str, tuple[StepSample, ...]] = {}

    def truth(self, app: AppTrace) -> tuple[StepSample, ...]:
        if app.name not in self.memo:
            out = []
            micros = sorted(set(np.geomspace(app.min_micro, app.max_micro, 6).round()))
            for nodes, per in [(1, g) for g in (1, 2, 3, 4)] + [(n, 4) for n in range(2, 17)]:
                for m in micros:
                    st, sy = app.step_time((per,) * nodes, int(m))
                    out.append(StepSample(nodes, nodes * per, int(m), st, sy))
            self.memo[app.name] = tuple(out)
        return self.memo[app.name]

    def schedule(self, snapshot: Snapshot) -> Plan:
        jobs = tuple(
            replace(j, profile=self.truth(self.by_size[j.model_bytes]) + j.profile)
            if j.model_bytes in self.by_size
            else j
            for j in snapshot.jobs
        )
        return self.inner.schedule(replace(snapshot, jobs=jobs))


def run_one(task: Task) -> dict[str, object]:
    data, load, workload, policy, regime, epochs, engine = task
    apps = load_apps(Path(data))
    jobs = load_workload(Path(data) / "workloads" / f"load-{load}" / f"{workload}.csv", apps)
    cfg = SimConfig(regime=Regime(regime, epochs))
    run = simulate if engine == "direct" else simulate_controlled
    t0, c0 = time.perf_counter(), time.process_time()
    pol = WithTruth(make_policy("ones"), apps) if policy == TRUTH else make_policy(policy)
    res = run(jobs, pol, apps, cfg)
    return {
        "load": load,
        "workload": workload,
        "policy": policy,
        "regime": regime,
        "epochs": epochs,
        "engine": engine,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        **res.summary(),
    }


def published(data: Path, load: str) -> dict[str, tuple[float, float]]:
    path = data / "published-results" / f"pollux-load-{load}.json"
    jcts = json.loads(path.read_text())["jcts"]
    return {
        w: (float(np.mean(list(v.values()))), float(np.percentile(list(v.values()), 99)))
        for w, v in jcts.items()
    }


def _label(policy: str, regime: str, epochs: float) -> str:
    tail = "" if epochs == 1.0 else f", {epochs:g}x epochs"
    return f"{policy} {regime}{tail}"


def _pick(rows: list[dict[str, object]], w: str, col: tuple[str, str, float], key: str) -> float:
    for r in rows:
        if (r["workload"], r["policy"], r["regime"], r["epochs"]) == (w, *col):
            return float(r[key])  # type: ignore[arg-type]
    return float("nan")


def report(data: Path, load: str, rows: list[dict[str, object]]) -> None:
    pub = published(data, load)
    workloads = sorted({str(r["workload"]) for r in rows}, key=lambda w: int(w.split("-")[1]))
    cols = sorted(
        {(str(r["policy"]), str(r["regime"]), float(r["epochs"])) for r in rows},  # type: ignore[arg-type]
        key=lambda c: (c[0] != "ones", c[0], c[2] != 1.0, c[1], c[2]),
    )
    main = [c for c in cols if c[2] == 1.0 and c[1] in ("known", "cold")]
    extra = [c for c in cols if c not in main]
    pol_mean = float(np.mean([pub[w][0] for w in workloads]))
    pol_p99 = float(np.mean([pub[w][1] for w in workloads]))
    engine = {str(r["engine"]) for r in rows}
    for title, key, idx, sel in (
        ("average JCT", "avg_jct", 0, main),
        ("p99 JCT", "p99_jct", 1, main),
        ("robustness: average JCT", "avg_jct", 0, extra),
    ):
        if not sel:
            continue
        print(f"\n## Load {load}: {title} (s) per workload, engine {', '.join(sorted(engine))}\n")
        body: list[list[object]] = [
            [w, *(_pick(rows, w, c, key) for c in sel), pub[w][idx]] for w in workloads
        ]
        vals = np.array([b[1:] for b in body], dtype=float)
        mean = np.nanmean(vals, axis=0)
        ref = pol_mean if idx == 0 else pol_p99
        worst = np.nanmax(vals[:, :-1] / vals[:, -1:], axis=0)
        print(
            table(
                ["workload", *(_label(*c) for c in sel), "pollux (pub)"],
                [*body, ["mean", *mean], ["mean / pollux", *(mean / ref)],
                 ["worst workload / pollux", *worst, 1.0]],
            )
        )  # fmt: skip
    print(f"\n## Load {load}: ONES against the targets\n")
    for regime in ("known", "cold"):
        col = ("ones", regime, 1.0)
        if col not in main:
            continue
        avg = [_pick(rows, w, col, "avg_jct") for w in workloads]
        p99 = [_pick(rows, w, col, "p99_jct") for w in workloads]
        worst = max(a / pub[w][0] for a, w in zip(avg, workloads, strict=True))
        target = TARGETS.get((regime, load))
        aim = f" (target <= {target:.2f} x = {target * pol_mean:.0f} s)" if target else ""
        print(
            f"ones {regime}: mean avg JCT {np.mean(avg):.0f} s = {np.mean(avg) / pol_mean:.3f} x "
            f"Pollux {pol_mean:.0f} s{aim}; worst workload {worst:.3f} x; mean p99 "
            f"{np.mean(p99):.0f} s vs Pollux {pol_p99:.0f} s"
        )
        sel_rows = [r for r in rows if (r["policy"], r["regime"], r["epochs"]) == col]
        dec = [float(r["decision_ms_mean"]) for r in sel_rows]  # type: ignore[arg-type]
        mx = [float(r["decision_ms_max"]) for r in sel_rows]  # type: ignore[arg-type]
        cpu = [float(r["cpu_s"]) for r in sel_rows]  # type: ignore[arg-type]
        res = [float(r["restarts_per_job"]) for r in sel_rows]  # type: ignore[arg-type]
        print(
            f"  decision per round (CPU): mean {np.mean(dec):.1f} ms, max {np.max(mx):.1f} ms; "
            f"restarts per job {np.mean(res):.2f}; simulation CPU max {np.max(cpu):.0f} s"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="ones,tiresias,fifo,aiturbo,sidecar")
    ap.add_argument("--loads", default="1.0,0.5")
    ap.add_argument("--workloads", default="", help="numbers, e.g. 1,3,6 (default: all)")
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument("--engine", choices=["direct", "controller"], default="controller")
    ap.add_argument("--robustness", action="store_true")
    ap.add_argument("--regimes", default="known,cold", help="of the main two, e.g. cold")
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--load-results", type=Path, default=None)
    args = ap.parse_args()
    data = (args.data or default_data_dir()).resolve()
    loads = [x for x in args.loads.split(",") if x]
    if args.load_results is not None:
        results = json.loads(args.load_results.read_text())
    else:
        results = sweep(args, data, loads)
    for load in loads:
        report(data, load, [r for r in results if r["load"] == load])


def sweep(args: argparse.Namespace, data: Path, loads: list[str]) -> list[dict[str, object]]:
    policies = [p for p in args.policies.split(",") if p]
    only = {f"workload-{w}" for w in args.workloads.split(",") if w}
    tasks: list[Task] = []
    for load in loads:
        for path in sorted((data / "workloads" / f"load-{load}").glob("workload-*.csv")):
            if only and path.stem not in only:
                continue
            for policy in policies:
                main = [r for r in REGIMES if r[0] in args.regimes.split(",")]
                variants = main + (ROBUST if args.robustness and policy == "ones" else [])
                for regime, epochs in variants:
                    tasks.append((str(data), load, path.stem, policy, regime, epochs, args.engine))
    tasks.sort(key=lambda t: (t[3] != "ones", t[1] != "1.0"))  # longest first
    results: list[dict[str, object]] = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.procs) as pool:
        for i, res in enumerate(pool.map(run_one, tasks), start=1):
            results.append(res)
            name = _label(str(res["policy"]), str(res["regime"]), float(str(res["epochs"])))
            print(
                f"[{i}/{len(tasks)} {time.perf_counter() - t0:6.0f} s] {res['load']} "
                f"{res['workload']} {name}: avg JCT {res['avg_jct']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            if args.save is not None:
                args.save.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
