"""Resize overhead on a real local Slurm pool, and the controller's cycle with many jobs.

    .venv/bin/python benchmarks/resize_overhead.py [--jobs 500]

Brings up its own pool (4 nodes x 4 GPUs, in .run/bench-pool), runs the controller with the
elastic fair-share policy on one node, and resizes a real DDP job (examples/train_elastic.py):
A [1,4] alone runs on 4 GPUs; B [2,2] arrives, A shrinks to 2; B ends, A grows back to 4.
Each resize is split into what the timestamps the parts write allow:

  decide->signal   controller: decision written, scancel --signal sent
  signal->ckpt     runtime: to the next step boundary, all ranks agree, checkpoint written
  ckpt->exit       runtime and wrapper: processes exit, srun and the batch script end
  exit->released   controller: exit seen, requeuehold, reshape, StartTime, release
  released->start  Slurm starts the batch script; Python and torch import; process group
  start->step      first training step at the new size

hpcorch's own part is decide->signal + signal->ckpt + ckpt->exit + exit->released (the
rest is Slurm's launch and process start-up, which any restart pays). Then it submits
--jobs held jobs (a sleeping script) and times two controller cycles over them.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpcorch.controller.store import Store  # noqa: E402


def sh(env: dict[str, str], *argv: str, **kw: Any) -> str:
    return subprocess.run(
        list(argv), env=env, check=True, text=True, capture_output=True, **kw
    ).stdout


def wait(what: str, cond: Any, timeout: float) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def metrics(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=500)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpcorch-bench-"))
    pool_dir = REPO / ".run" / "bench-pool"
    env = {
        **os.environ,
        "HPCORCH_POOL_DIR": str(pool_dir),
        "HPCORCH_HOME": str(work / "home"),
        "HPCORCH_METRICS_INTERVAL": "1",
        "PYTHONUNBUFFERED": "1",
    }
    hp = [sys.executable, "-m", "hpcorch"]
    sh(env, str(REPO / "slurm" / "pool"), "up", "--port-base", "21800")
    env["SLURM_CONF"] = str(pool_dir / "etc" / "slurm.conf")
    state = work / "ctl"
    ctl = subprocess.Popen(
        [
            *hp,
            "controller",
            "--reservation",
            "bench",
            "--nodes",
            "n1",
            "--policy",
            "share",
            "--interval",
            "0.5",
            "--round",
            "1",
            "--min-run",
            "5",
            "--state-dir",
            str(state),
        ],
        env=env,
        stderr=open(work / "controller.log", "w"),  # noqa: SIM115
        text=True,
    )
    try:
        wait("the controller", lambda: "reservation" in (work / "controller.log").read_text(), 60)

        def submit(name: str, lo: int, hi: int, epochs: int) -> int:
            out = sh(
                env,
                *hp,
                "submit",
                "--pool",
                "bench",
                "--name",
                name,
                "--min-gpus",
                str(lo),
                "--max-gpus",
                str(hi),
                "--batch-size",
                "64",
                "--parsable",
                str(REPO / "examples" / "train_elastic.py"),
                "--global-batch",
                "64",
                "--samples",
                "2048",
                "--epochs",
                str(epochs),
                "--sample-delay",
                "0.002",
            )
            return int(out.strip())

        a = submit("A", 1, 4, 40)
        a_dir = next((work / "home" / "jobs").glob("A-*"))
        wait("A training", lambda: any(m.get("event") == "first_step" for m in metrics(a_dir)), 180)
        b = submit("B", 2, 2, 6)
        store_path = state / "state.db"

        def phase(job: int) -> str:
            s = Store(store_path, readonly=True)
            try:
                rec = s.job(job)
                return rec.phase if rec else "?"
            finally:
                s.close()

        wait("B done", lambda: phase(b) == "done", 400)
        wait(
            "A grown back", lambda: sum(m.get("event") == "start" for m in metrics(a_dir)) >= 3, 300
        )
        wait(
            "A trained at 4 again",
            lambda: sum(m.get("event") == "first_step" for m in metrics(a_dir)) >= 3,
            300,
        )
        report(store_path, a, metrics(a_dir))
        many(env, hp, work, args.jobs)
    finally:
        ctl.terminate()
        ctl.wait(30)
        subprocess.run(["scancel", "--reservation=bench"], env=env, capture_output=True)
        subprocess.run([str(REPO / "slurm" / "pool"), "down"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def report(store_path: Path, job: int, lines: list[dict[str, Any]]) -> None:
    s = Store(store_path, readonly=True)
    decisions = s.decisions(job)
    s.close()
    signals = [d for d in decisions if d.action == "signal" and d.detail.startswith("resize")]
    starts = [d for d in decisions if d.action == "start"][1:]
    ckpts = [m for m in lines if m.get("event") == "checkpoint" and m.get("reason") == "signal"]
    if not ckpts:
        ckpts = [m for m in lines if m.get("event") == "checkpoint"]
    exits = [m for m in lines if m.get("event") == "exit"]
    launch = [m for m in lines if m.get("event") == "start"][1:]
    first = [m for m in lines if m.get("event") == "first_step"][1:]
    print("\nresize overhead (seconds), a real DDP job on the local pool, 2 cores")
    cols = [
        "resize",
        "decide->signal",
        "signal->ckpt",
        "ckpt->exit",
        "exit->released",
        "hpcorch own",
        "released->start",
        "start->step",
        "whole",
    ]
    print("  ".join(f"{c:>15}" for c in cols))
    for sig in signals:
        try:
            ck = next(m for m in ckpts if m["written_time"] >= sig.time)
            ex = next(m for m in exits if m["time"] >= ck["written_time"])
            st = next(d for d in starts if d.time >= ex["time"] - 0.5)
            ln = next(m for m in launch if m["time"] >= st.done_at)
            fs = next(m for m in first if m["time"] >= ln["time"])
        except StopIteration:
            continue
        parts = [
            sig.done_at - sig.time,
            ck["written_time"] - sig.done_at,
            ex["time"] - ck["written_time"],
            st.done_at - ex["time"],
        ]
        row = [
            f"{sig.from_gpus}->{sig.to_gpus}",
            *(f"{p:.2f}" for p in parts),
            f"{sum(parts):.2f}",
            f"{ln['time'] - st.done_at:.2f}",
            f"{fs['time'] - ln['time']:.2f}",
            f"{fs['time'] - sig.time:.2f}",
        ]
        print("  ".join(f"{c:>15}" for c in row))


def many(env: dict[str, str], hp: list[str], work: Path, n: int) -> None:
    script = work / "sleeper.sh"
    script.write_text("#!/bin/sh\nsleep 600\n")
    script.chmod(0o755)
    sh(
        env,
        "scontrol",
        "create",
        "reservation",
        "ReservationName=bench-many",
        "Nodes=n2,n3,n4",
        "Users=root",
        "StartTime=now",
        "Duration=infinite",
        "Flags=IGNORE_JOBS",
    )
    try:
        t0 = time.perf_counter()
        sh(env, *hp, "submit", "--pool", "bench-many", "--min-gpus", "1", "--parsable", str(script))
        cli = time.perf_counter() - t0
        text = sh(
            env,
            *hp,
            "submit",
            "--pool",
            "bench-many",
            "--min-gpus",
            "1",
            "--max-gpus",
            "2",
            "--dry-run",
            str(script),
        )
        t0 = time.perf_counter()
        for _ in range(n - 1):
            sh(env, "sbatch", "--parsable", input=text)
        sbatch = (time.perf_counter() - t0) / (n - 1)
        state = work / "ctl-many"
        for _ in range(2):
            sh(
                env,
                *hp,
                "controller",
                "--reservation",
                "bench-many",
                "--state-dir",
                str(state),
                "--once",
            )
        s = Store(state / "state.db", readonly=True)
        cycles = list(reversed(s.recent_cycles(2)))
        s.close()
        print(
            f"\n{n} held jobs in the pool (12 GPUs): submit {cli:.2f} s through the CLI, "
            f"{sbatch * 1000:.0f} ms per sbatch"
        )
        print(f"{'cycle':>6} {'seconds':>8} {'decision ms':>12} {'Slurm calls':>12} {'jobs':>6}")
        for i, c in enumerate(cycles, 1):
            print(
                f"{i:>6} {c['seconds']:>8.2f} {c['decision_s'] * 1000:>12.1f} "
                f"{c['slurm_calls']:>12} {c['jobs']:>6}"
            )
    finally:
        subprocess.run(["scancel", "--reservation=bench-many"], env=env, capture_output=True)
        time.sleep(1)
        subprocess.run(
            ["scontrol", "delete", "reservation", "bench-many"], env=env, capture_output=True
        )


if __name__ == "__main__":
    main()
