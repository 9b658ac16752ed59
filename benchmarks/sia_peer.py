"""hpcorch's ONES inside another scheduler's simulator: the Sia (SOSP'23) artifact's.

    SIA_DIR=... SIA_PYTHON=... SIA_ADAPTER=... python benchmarks/sia_peer.py \\
        WORKLOAD.csv [WORKLOAD.csv ...] [--runs sia,ones,ones-no-length] [--seeds 0] \\
        [--name philly/workload-1 ...] [--save benchmarks/results/sia_peer.json] \\
        [--load-results FILE]

Sia's simulator is not part of hpcorch and its repository carries no licence: nothing of
it is here. This script only runs it where it lies and keeps the figures:

* ``SIA_DIR``: the artifact's ``sia-simulator`` directory; ``SIA_PYTHON``: a Python with
  its dependencies;
* ``SIA_ADAPTER``: a directory with ``ones_in_sia.py`` (ONES as the policy of Sia's
  simulator: Sia's cluster, jobs, restart delays and batch tuning, hpcorch's allocation) and
  ``sia_log_stats.py`` (the figures of one of Sia's own runs from its log).

``sia`` runs Sia's own policy as the artifact's scripts run it (p = -0.5, lambda_a 0.01,
lambda_n 1.1, 60 s rounds); ``ones`` runs this checkout's ONES with every job declaring
its length; ``ones-no-length`` with no job declaring it. Each run is one process, one after
the other (nice'd: a full philly workload takes Sia 15-20 minutes). A row per run: the
workload, ``policy`` (sia or ones), ``lengths`` (whether the jobs declared their length),
``avg_jct``, ``p99_jct``, ``makespan``, ``restarts_per_job`` (seconds, with the artifact's
definitions: p99 the sorted JCTs at int(0.99 n), makespan last completion - first
submission), the seed and what else the run reported. ``--save`` merges the rows into the
file (a row replaces one of the same workload, policy, lengths and seed) and the targets
are printed: ONES's average JCT at most 0.85 x Sia's and its p99 and makespan at most
Sia's with lengths declared; its average at most Sia's without.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from hpcorch.sim.report import table  # noqa: E402

SIA_ARGS = [
    "--policy=sia",
    "--policy_p_val=-0.5",
    "--mip_lambda_a=0.01",
    "--mip_lambda_n=1.1",
    "--interval=60",
    "--project_throughput",
    "--share_max_replicas",
]
KEYS = ("workload", "policy", "lengths", "seed")


def _env(name: str) -> Path:
    value = os.environ.get(name)
    if not value:
        raise SystemExit(f"sia_peer.py: set {name} (see the script's docstring)")
    return Path(value)


def _commit() -> str:
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    )
    return out.stdout.strip() or "unknown"


def _quiet_env() -> dict[str, str]:
    return {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}


def run_sia(workload: Path, name: str) -> dict[str, object]:
    """Sia's own policy on ``workload`` (a directory holding only it, as the artifact's
    driver wants), its figures from its log."""
    sia, py, adapter = _env("SIA_DIR"), _env("SIA_PYTHON"), _env("SIA_ADAPTER")
    with tempfile.TemporaryDirectory(prefix="sia-peer-") as tmp:
        wl, out = Path(tmp) / "wl", Path(tmp) / "out"
        wl.mkdir()
        out.mkdir()
        (wl / workload.name).symlink_to(workload.resolve())
        t0 = time.perf_counter()
        with open(Path(tmp) / "stdout", "wb") as log:
            done = subprocess.run(
                ["nice", "-n", "10", str(py), "multi_simulator.py", f"{wl}/", *SIA_ARGS,
                 f"--output={out}"],
                cwd=sia, stdout=log, stderr=subprocess.STDOUT, env=_quiet_env(),
            )  # fmt: skip
        if done.returncode != 0:
            tail = (Path(tmp) / "stdout").read_bytes()[-3000:].decode(errors="replace")
            raise SystemExit(f"Sia's simulator failed ({done.returncode}):\n{tail}")
        wall = time.perf_counter() - t0
        stats = subprocess.run(
            [str(py), str(adapter / "sia_log_stats.py"), str(out / f"{workload.stem}.log"),
             "--interval", "60", "--stdout", str(Path(tmp) / "stdout")],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    got = json.loads(stats.stdout)
    return _row(name, "sia", True, 0, got, wall) | {"policy_ms_mean": got.get("policy_ms_mean")}


def run_ones(workload: Path, name: str, lengths: bool, seed: int) -> dict[str, object]:
    """This checkout's ONES inside Sia's simulator through the adapter."""
    sia, py, adapter = _env("SIA_DIR"), _env("SIA_PYTHON"), _env("SIA_ADAPTER")
    with tempfile.TemporaryDirectory(prefix="sia-peer-") as tmp:
        out = Path(tmp) / "ones.json"
        cmd = ["nice", "-n", "10", str(py), str(adapter / "ones_in_sia.py"), str(workload),
               "--seed", str(seed), "--out", str(out)]  # fmt: skip
        if not lengths:
            cmd.append("--no-length")
        env = _quiet_env() | {"SIA_DIR": str(sia), "HPCORCH_DIR": str(ROOT)}
        t0 = time.perf_counter()
        subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, check=True)
        got = json.loads(out.read_text())
    got.pop("jcts", None)
    row = _row(name, "ones", lengths, seed, got, time.perf_counter() - t0)
    for key in ("type_moves_per_job", "policy_ms_mean", "policy_ms_max", "max_gpus_in_a_round",
                "plan_errors", "overcommitted_nodes", "per_app_restarts"):  # fmt: skip
        row[key] = got.get(key)
    return row


def _row(
    name: str, policy: str, lengths: bool, seed: int, got: dict[str, object], wall: float
) -> dict[str, object]:
    def hours(key: str) -> float:
        return round(float(got[key]) * 3600.0, 1)  # type: ignore[arg-type]

    return {
        "workload": name,
        "policy": policy,
        "lengths": lengths,
        "seed": seed,
        "avg_jct": hours("avg_jct_h"),
        "p99_jct": hours("p99_jct_h"),
        "makespan": hours("makespan_h"),
        "restarts_per_job": round(float(got["restarts_per_job"]), 3),  # type: ignore[arg-type]
        "jobs": got.get("jobs"),
        "completed": got.get("completed"),
        "per_app_mean_jct_h": got.get("per_app_mean_jct_h"),
        "commit": _commit() if policy == "ones" else None,
        "wall_s": round(wall, 1),
    }


def report(rows: list[dict[str, object]]) -> None:
    body = []
    for r in sorted(rows, key=lambda r: (str(r["workload"]), r["policy"] != "sia",
                                         not r["lengths"], r["seed"])):  # fmt: skip
        body.append([r["workload"], r["policy"], "yes" if r["lengths"] else "no", r["seed"],
                     *(round(float(r[k]) / 3600, 3) for k in ("avg_jct", "p99_jct", "makespan")),  # type: ignore[arg-type]
                     r["restarts_per_job"]])  # fmt: skip
    print(
        table(
            ["workload", "policy", "lengths", "seed", "avg JCT (h)", "p99 (h)", "makespan (h)",
             "restarts/job"],
            body,
        )
    )  # fmt: skip
    print("\ntargets (against Sia on the same workload):")
    for w in sorted({str(r["workload"]) for r in rows}):
        sia = [r for r in rows if r["workload"] == w and r["policy"] == "sia"]
        if not sia:
            continue
        ref = sia[0]
        for lengths in (True, False):
            mine = [r for r in rows if r["workload"] == w and r["policy"] == "ones"
                    and r["lengths"] == lengths]  # fmt: skip
            if not mine:
                continue
            avg = sum(float(r["avg_jct"]) for r in mine) / len(mine)  # type: ignore[arg-type]
            p99 = sum(float(r["p99_jct"]) for r in mine) / len(mine)  # type: ignore[arg-type]
            mk = sum(float(r["makespan"]) for r in mine) / len(mine)  # type: ignore[arg-type]
            a = avg / float(ref["avg_jct"])  # type: ignore[arg-type]
            p = p99 / float(ref["p99_jct"])  # type: ignore[arg-type]
            m = mk / float(ref["makespan"])  # type: ignore[arg-type]
            seeds = ", ".join(str(r["seed"]) for r in mine)
            if lengths:
                ok = a <= 0.85 and p <= 1.0 and m <= 1.0
                aim = "avg <= 0.85, p99 <= 1, makespan <= 1"
            else:
                ok = a <= 1.0
                aim = "avg <= 1"
            print(
                f"  [{'x' if ok else ' '}] {w}, lengths {'declared' if lengths else 'not declared'}"
                f" (seeds {seeds}): avg {a:.3f} x, p99 {p:.3f} x, makespan {m:.3f} x ({aim})"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("workloads", nargs="*", type=Path, help="Sia workload CSV files")
    ap.add_argument("--name", action="append", default=[], help="each workload's name")
    ap.add_argument("--runs", default="sia,ones,ones-no-length")
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--save", type=Path, default=None)
    ap.add_argument("--load-results", type=Path, default=None)
    args = ap.parse_args()
    rows: list[dict[str, object]] = []
    if args.load_results is not None:
        rows = json.loads(args.load_results.read_text())["results"]
    names = args.name + [str(w) for w in args.workloads[len(args.name) :]]
    runs = [r for r in args.runs.split(",") if r]
    if bad := set(runs) - {"sia", "ones", "ones-no-length"}:
        raise SystemExit(f"--runs: unknown {', '.join(sorted(bad))} (sia, ones, ones-no-length)")
    seeds = [int(s) for s in args.seeds.split(",") if s]
    saved: list[dict[str, object]] = []
    if args.save is not None and args.save.exists():
        saved = json.loads(args.save.read_text())["results"]
    for workload, name in zip(args.workloads, names, strict=True):
        for run in runs:
            for seed in seeds if run != "sia" else [0]:  # Sia's policy draws no seed
                t0 = time.perf_counter()
                print(f"{name}: {run} seed {seed} ...", file=sys.stderr, flush=True)
                if run == "sia":
                    row = run_sia(workload, name)
                else:
                    row = run_ones(workload, name, run == "ones", seed)
                print(
                    f"{name}: {run} seed {seed}: avg JCT {row['avg_jct']:.0f} s "
                    f"({time.perf_counter() - t0:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
                rows.append(row)
                if args.save is not None:
                    saved = [s for s in saved if tuple(s[k] for k in KEYS)
                             != tuple(row[k] for k in KEYS)] + [row]  # fmt: skip
                    args.save.write_text(json.dumps({"results": saved}, indent=1) + "\n")
    report(rows or saved)


if __name__ == "__main__":
    main()
