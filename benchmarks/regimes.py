"""Every policy in the information regimes, beside Pollux's published figures.

    python benchmarks/regimes.py [--policies ones,tiresias,fifo] [--loads 1.0,0.5]
                                 [--regimes known,cold,no-length,half-length]
                                 [--workloads 1,3,6] [--seeds 0,1] [--procs 2]
                                 [--engine direct|controller] [--robustness]
                                 [--save FILE.json] [--load-results FILE.json]

``known``: jobs of one application share what was learned of them (the bundled workloads
run one model per application). ``cold``: every job is new: its own application, no
completed-job history (``hpcorch simulate --regime cold``). ``no-length``: cold, and no
job declares how long it trains (no epochs, no dataset size: the controller shows its
placeholders); ``half-length``: cold, and every other job (by arrival) declares it. With
``--robustness`` ONES also runs with every job declaring half and twice the epochs it
needs (known and cold) and with every other job new (``mixed``). Prints, per load, average
and p99 JCT per workload, the means and their ratio to Pollux, and the issue's targets for
ONES; with several ``--seeds`` a figure is the mean over the seeds, and the targets' lines
give each seed's mean beside it. ``--save`` keeps the raw figures; ``--load-results``
prints the tables of a saved run again. The policy ``ones+truth`` is ONES shown every
job's true step times from its start: it separates learning a job's scaling from scoring
schedules.
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
from hpcorch.sim.config import SimConfig
from hpcorch.sim.controlled import simulate_controlled
from hpcorch.sim.loop import simulate
from hpcorch.sim.regime import Regime
from hpcorch.sim.report import table
from hpcorch.sim.traces import AppTrace, default_data_dir, load_apps
from hpcorch.sim.workload import load_workload

# (regime, declared epochs factor): the main regimes, then the robustness variants
REGIMES = [("known", 1.0), ("cold", 1.0), ("no-length", 1.0), ("half-length", 1.0)]
MAIN = tuple(r for r, _ in REGIMES)
ROBUST = [("known", 0.5), ("known", 2.0), ("cold", 0.5), ("cold", 2.0), ("mixed", 1.0)]
# the targets for ONES: mean avg JCT / Pollux's published, per regime and load
TARGETS = {("cold", "1.0"): 0.85, ("cold", "0.5"): 0.92, ("known", "1.0"): 0.78,
           ("known", "0.5"): 0.88, ("no-length", "1.0"): 0.90,
           ("no-length", "0.5"): 0.90}  # fmt: skip

Task = tuple[str, str, str, str, str, float, str, int, bool]
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


def variant(policy: str, seed: int) -> Policy:
    """``name`` or ``name:field=value:...``: a policy with some of its settings changed
    (``ones:restarts_per_hour=1``), for measuring a setting before it becomes a default."""
    name, *settings = policy.split(":")
    pol = make_policy(name, seed)
    for item in settings:
        key, _, raw = item.partition("=")
        if not hasattr(pol, key):
            raise SystemExit(f"{name} has no setting {key!r}")
        kind = type(getattr(pol, key))
        if kind is bool:
            setattr(pol, key, raw.lower() in ("1", "true", "yes"))
        else:
            setattr(pol, key, kind(float(raw)) if kind in (int, float) else kind(raw))
    return pol


def run_one(task: Task) -> dict[str, object]:
    data, load, workload, policy, regime, epochs, engine, seed, per_job = task
    apps = load_apps(Path(data))
    jobs = load_workload(Path(data) / "workloads" / f"load-{load}" / f"{workload}.csv", apps)
    cfg = SimConfig(regime=Regime.named(regime, epochs))
    t0, c0 = time.perf_counter(), time.process_time()
    if policy == TRUTH:
        pol: Policy = WithTruth(make_policy("ones", seed), apps)
    else:
        pol = variant(policy, seed)
    ignored: list[str] = []

    def log(msg: str) -> None:
        if "plan ignored" in msg:
            ignored.append(msg)

    if engine == "direct":
        res = simulate(jobs, pol, apps, cfg)
    else:
        res = simulate_controlled(jobs, pol, apps, cfg, log=log)
    return {
        "load": load,
        "workload": workload,
        "policy": policy,
        "regime": regime,
        "epochs": epochs,
        "seed": seed,
        "engine": engine,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": time.process_time() - c0,
        **res.summary(),
        "plans_ignored": len(ignored),
        **({"jobs": {j.name: [round(j.jct, 1), j.restarts] for j in res.jobs}} if per_job else {}),
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
    """The mean over the seeds of ``key`` of workload ``w`` in column ``col``."""
    vals = [
        float(r[key])  # type: ignore[arg-type]
        for r in rows
        if (r["workload"], r["policy"], r["regime"], r["epochs"]) == (w, *col)
    ]
    return float(np.mean(vals)) if vals else float("nan")


def _seeds(rows: list[dict[str, object]]) -> list[int]:
    return sorted({int(r.get("seed", 0)) for r in rows})  # type: ignore[call-overload]


def report(data: Path, load: str, rows: list[dict[str, object]]) -> None:
    pub = published(data, load)
    workloads = sorted({str(r["workload"]) for r in rows}, key=lambda w: int(w.split("-")[1]))
    cols = sorted(
        {(str(r["policy"]), str(r["regime"]), float(r["epochs"])) for r in rows},  # type: ignore[arg-type]
        key=lambda c: (c[0] != "ones", c[0], c[2] != 1.0, c[1] not in MAIN,
                       MAIN.index(c[1]) if c[1] in MAIN else 0, c[1], c[2]),
    )  # fmt: skip
    main = [c for c in cols if c[2] == 1.0 and c[1] in MAIN]
    extra = [c for c in cols if c not in main]
    pol_mean = float(np.mean([pub[w][0] for w in workloads]))
    pol_p99 = float(np.mean([pub[w][1] for w in workloads]))
    engine = {str(r["engine"]) for r in rows}
    seeds = _seeds(rows)
    over = f", mean over seeds {', '.join(map(str, seeds))}" if len(seeds) > 1 else ""
    for title, key, idx, sel in (
        ("average JCT", "avg_jct", 0, main),
        ("p99 JCT", "p99_jct", 1, main),
        ("robustness: average JCT", "avg_jct", 0, extra),
    ):
        if not sel:
            continue
        print(
            f"\n## Load {load}: {title} (s) per workload, engine {', '.join(sorted(engine))}"
            f"{over}\n"
        )
        body: list[list[object]] = [
            [w, *(_pick(rows, w, c, key) for c in sel), pub[w][idx]] for w in workloads
        ]
        vals = np.array([b[1:] for b in body], dtype=float)
        mean = np.nanmean(vals, axis=0)
        ref = pol_mean if idx == 0 else pol_p99
        worst = np.nanmax(vals[:, :-1] / vals[:, -1:], axis=0)
        above = np.sum(vals[:, :-1] > vals[:, -1:], axis=0)
        print(
            table(
                ["workload", *(_label(*c) for c in sel), "pollux (pub)"],
                [*body, ["mean", *mean], ["mean / pollux", *(mean / ref)],
                 ["worst workload / pollux", *worst, 1.0],
                 ["workloads above pollux", *above, 0]],
            )
        )  # fmt: skip
    print(f"\n## Load {load}: ONES against the targets\n")
    for regime in MAIN:
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
            f"{np.mean(p99):.0f} s = {np.mean(p99) / pol_p99:.3f} x Pollux {pol_p99:.0f} s"
        )
        sel_rows = [r for r in rows if (r["policy"], r["regime"], r["epochs"]) == col]
        if len(seeds) > 1:
            per_seed = []
            for seed in seeds:
                mine = [r for r in sel_rows if int(r.get("seed", 0)) == seed]  # type: ignore[call-overload]
                if len(mine) == len(workloads):
                    a = np.mean([float(r["avg_jct"]) for r in mine])  # type: ignore[arg-type]
                    q = np.mean([float(r["p99_jct"]) for r in mine])  # type: ignore[arg-type]
                    per_seed.append(f"seed {seed}: {a / pol_mean:.3f} x / p99 {q / pol_p99:.3f} x")
            print("  per seed (avg / p99 against Pollux): " + "; ".join(per_seed))
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
    ap.add_argument(
        "--regimes", default=",".join(MAIN), help=f"of the main ones ({', '.join(MAIN)})"
    )
    ap.add_argument("--seeds", default="0", help="the policies' seeds, e.g. 0,1")
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--per-job", action="store_true", help="keep each job's JCT and restarts")
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
    try:
        seeds = [int(x) for x in args.seeds.split(",") if x]
    except ValueError:
        raise SystemExit(f"--seeds: not a list of integers: {args.seeds!r}") from None
    wanted = [r for r in args.regimes.split(",") if r]
    if unknown := set(wanted) - set(MAIN):
        raise SystemExit(
            f"--regimes: unknown {', '.join(sorted(unknown))} (valid: {', '.join(MAIN)})"
        )
    tasks: list[Task] = []
    for load in loads:
        for path in sorted((data / "workloads" / f"load-{load}").glob("workload-*.csv")):
            if only and path.stem not in only:
                continue
            for policy in policies:
                main = [r for r in REGIMES if r[0] in wanted]
                variants = main + (ROBUST if args.robustness and policy == "ones" else [])
                for regime, epochs in variants:
                    for seed in seeds:
                        task = (str(data), load, path.stem, policy, regime, epochs, args.engine)
                        tasks.append((*task, seed, args.per_job))
    tasks.sort(key=lambda t: (t[3] != "ones", t[1] != "1.0"))  # longest first
    results: list[dict[str, object]] = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.procs) as pool:
        for i, res in enumerate(pool.map(run_one, tasks), start=1):
            results.append(res)
            name = _label(str(res["policy"]), str(res["regime"]), float(str(res["epochs"])))
            print(
                f"[{i}/{len(tasks)} {time.perf_counter() - t0:6.0f} s] {res['load']} "
                f"{res['workload']} {name} seed {res['seed']}: avg JCT {res['avg_jct']:.0f} s, "
                f"p99 {res['p99_jct']:.0f} s",
                file=sys.stderr,
                flush=True,
            )
            if args.save is not None:
                args.save.write_text(json.dumps(results, indent=1))
    return results


if __name__ == "__main__":
    main()
