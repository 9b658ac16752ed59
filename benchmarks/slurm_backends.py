"""The Slurm part of a controller cycle through each backend: Slurm's commands or pyslurm.

    .venv/bin/python benchmarks/slurm_backends.py [--jobs 500] [--rounds 7] [--per-round 3]
        [--port-base 21700] [--pyslurm-site .run/pyslurm-site]

Brings up its own pool on Slurm 25.11 (slurm/pool, 4 nodes x 4 GPUs, in
.run/bench-backends-pool, port base --port-base), makes a reservation of the whole pool,
and submits --jobs held jobs into it (``--wrap 'sleep 1000'``, each with an hpcorch
comment so the controller maps it: held, they never run). Then, in ONE child process,
times ``SlurmCluster.observe()`` (hpcorch/slurm/cluster.py: the jobs and the nodes, two
Slurm calls a cycle) with ``SlurmCLI`` (A) and ``PySlurmBackend`` (B), alternating
A B A B for --rounds rounds of --per-round observes each, after one untimed observe per
backend (it reads the reservation and fair shares, which a cycle does once a minute).
Prints a table (median seconds per observe, Slurm calls per observe, pyslurm/commands)
and saves the raw figures to benchmarks/results/slurm_backends.json. Cleans up at the
end: scancel, the reservation, pool down. Progress goes to stderr.

pyslurm is not installed in the project's venv: it is taken from --pyslurm-site (a
``pip install --target`` of the pyslurm 25.11 wheel slurm/build makes), with the pool's
Slurm library on LD_LIBRARY_PATH.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
RES = "bench-backends"
RESULTS = REPO / "benchmarks" / "results" / "slurm_backends.json"


def log(msg: str) -> None:
    print(f"[slurm_backends] {msg}", file=sys.stderr, flush=True)


def sh(env: dict[str, str], *argv: str, check: bool = True) -> str:
    proc = subprocess.run(list(argv), env=env, text=True, capture_output=True, check=False)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:4])} failed: {proc.stderr.strip()}")
    return proc.stdout


def pool_env(pool_dir: Path) -> dict[str, str]:
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir)}
    for line in sh(env, str(REPO / "slurm" / "pool"), "env").splitlines():
        # export NAME=value, where value may use "$PATH" and the like: let bash expand it
        if line.startswith("export "):
            name = line[len("export ") :].split("=", 1)[0]
            env[name] = sh(env, "bash", "-c", f'{line}; printf %s "${name}"')
    return env


def submit_jobs(env: dict[str, str], count: int) -> list[int]:
    ids: list[int] = []
    t0 = time.monotonic()
    for i in range(count):
        out = sh(
            env,
            "sbatch",
            "--parsable",
            "--hold",
            f"--reservation={RES}",
            f"--job-name=bench-{i}",
            "--gres=gpu:1",
            f"--comment=hpcorch:id=bench-{i},min=1,max=4",
            "--output=/dev/null",
            "--wrap",
            "sleep 1000",
        )
        ids.append(int(out.strip().split(";")[0]))
        if (i + 1) % 100 == 0:
            log(f"submitted {i + 1}/{count} held jobs ({time.monotonic() - t0:.0f} s)")
    return ids


def measure(args: argparse.Namespace) -> dict[str, Any]:
    """The child: both backends in this one process, A B A B."""
    sys.path.insert(0, str(REPO))
    import pyslurm

    from hpcorch.slurm.backend import SlurmCLI
    from hpcorch.slurm.cluster import SlurmCluster
    from hpcorch.slurm.pyslurm_backend import PySlurmBackend

    clusters = {
        "commands": SlurmCluster(RES, SlurmCLI(), reservation_ttl=1e9),
        "pyslurm": SlurmCluster(RES, PySlurmBackend(pyslurm), reservation_ttl=1e9),
    }
    first: dict[str, dict[str, Any]] = {}
    for name, cluster in clusters.items():  # reservation, fair shares: once a minute
        t0, c0 = time.perf_counter(), cluster.calls
        obs = cluster.observe()
        first[name] = {
            "seconds": time.perf_counter() - t0,
            "calls": cluster.calls - c0,
            "jobs": len(obs.jobs),
            "nodes": len(obs.nodes),
        }
        log(f"{name}: first observe {first[name]['seconds']:.3f} s, {len(obs.jobs)} jobs")
    if first["commands"]["jobs"] != first["pyslurm"]["jobs"]:
        log(f"WARNING: the backends see different job counts: {first}")
    times: dict[str, list[float]] = {name: [] for name in clusters}
    calls: dict[str, list[int]] = {name: [] for name in clusters}
    for rnd in range(args.rounds):
        for name, cluster in clusters.items():
            for _ in range(args.per_round):
                t0, c0 = time.perf_counter(), cluster.calls
                cluster.observe()
                times[name].append(time.perf_counter() - t0)
                calls[name].append(cluster.calls - c0)
        last = {n: statistics.median(t[-args.per_round :]) for n, t in times.items()}
        log(
            f"round {rnd + 1}/{args.rounds}: "
            + ", ".join(f"{n} {s:.3f} s" for n, s in last.items())
        )
    return {"first_observe": first, "seconds": times, "calls": calls}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--per-round", type=int, default=3)
    ap.add_argument("--port-base", type=int, default=21700)
    ap.add_argument("--pyslurm-site", default=str(REPO / ".run" / "pyslurm-site"))
    ap.add_argument("--measure", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        Path(args.out).write_text(json.dumps(measure(args)))
        return 0

    pool_dir = REPO / ".run" / "bench-backends-pool"
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir)}
    pool = str(REPO / "slurm" / "pool")
    log(f"pool up (Slurm 25.11, {pool_dir}, port base {args.port_base})")
    sh(env, pool, "up", "--slurm", "25.11", "--port-base", str(args.port_base))
    ids: list[int] = []
    try:
        env = pool_env(pool_dir)
        version = sh(env, "scontrol", "--version").strip()
        user = sh(env, "id", "-un").strip()
        sh(env, "scontrol", "delete", f"ReservationName={RES}", check=False)
        sh(
            env,
            "scontrol",
            "create",
            "reservation",
            f"ReservationName={RES}",
            "Nodes=ALL",
            f"Users={user}",
            "StartTime=now",
            "Duration=1-00:00:00",
            "Flags=IGNORE_JOBS",
        )
        log(f"{version}: reservation {RES}; submitting {args.jobs} held jobs")
        ids = submit_jobs(env, args.jobs)
        out = pool_dir / "bench-backends.json"
        child_env = {
            **env,
            "PYTHONPATH": os.pathsep.join(
                p for p in (args.pyslurm_site, env.get("PYTHONPATH", "")) if p
            ),
        }
        log("measuring (one process, A B A B)")
        subprocess.run(
            [
                sys.executable,
                __file__,
                "--measure",
                "--out",
                str(out),
                "--rounds",
                str(args.rounds),
                "--per-round",
                str(args.per_round),
            ],
            env=child_env,
            check=True,
        )
        raw = json.loads(out.read_text())
    finally:
        if ids:
            log(f"scancel {len(ids)} jobs")
            for i in range(0, len(ids), 200):
                sh(env, "scancel", *map(str, ids[i : i + 200]), check=False)
        sh(env, "scontrol", "delete", f"ReservationName={RES}", check=False)
        log("pool down")
        subprocess.run([pool, "down"], env=env, capture_output=True, check=False)

    med = {n: statistics.median(v) for n, v in raw["seconds"].items()}
    per = {n: statistics.mean(v) for n, v in raw["calls"].items()}
    ratio = med["pyslurm"] / med["commands"]
    print(
        f"\nSlurmCluster.observe() with {args.jobs} held jobs in the reservation "
        f"({version}; {args.rounds} rounds x {args.per_round} observes, A B A B)"
    )
    print(f"{'backend':<10} {'median s/observe':>17} {'Slurm calls/observe':>20} {'ratio':>7}")
    for name in ("commands", "pyslurm"):
        r = f"{med[name] / med['commands']:.2f}"
        print(f"{name:<10} {med[name]:>17.4f} {per[name]:>20.1f} {r:>7}")
    print(f"pyslurm/commands: {ratio:.2f} (median observe time)")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {
                "benchmark": "benchmarks/slurm_backends.py",
                "slurm": version,
                "jobs": args.jobs,
                "rounds": args.rounds,
                "per_round": args.per_round,
                "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
                "when": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "median_seconds": med,
                "calls_per_observe": per,
                "ratio_pyslurm_over_commands": ratio,
                **raw,
            },
            indent=1,
        )
        + "\n"
    )
    log(f"raw figures: {RESULTS.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
