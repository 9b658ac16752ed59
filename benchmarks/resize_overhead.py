"""Resize overhead on a real local Slurm pool, and the controller's cycle with many jobs.

    .venv/bin/python benchmarks/resize_overhead.py [--jobs 500] [--port-base P]

Brings up its own pool (4 nodes x 4 GPUs, in .run/bench-pool; port base --port-base, else
$HPCORCH_POOL_PORT, else 21800), runs the controller with the elastic fair-share policy on
one node at its production cycle (10 s, fast cycles while a job starts or stops), and
resizes a real 4-rank DDP job (examples/train_elastic.py): A [1,4] alone runs on 4 GPUs;
B [2,2] arrives, A shrinks to 2; B ends, A grows back to 4. Each resize is split into
what the timestamps the parts write allow:

  signal           controller: decision written -> scancel --signal sent
  checkpoint       runtime: to the next step boundary, all ranks agree, checkpoint written
  exit             checkpoint written -> the controller sees the job ended: the ranks
                   agree and rank 0 logs its exit (processes), then the processes, srun
                   and the batch script end, Slurm completes the job, the next poll sees
                   it (Slurm+poll)
  requeue          controller: scontrol requeuehold
  relaunch wait    until the second after the end was seen (slurmd's credential revoke)
  reshape+release  controller: scontrol update (shape), StartTime=now, release
  Slurm launch     released -> the new processes start (Slurm starts the batch script,
                   the wrapper, srun)
  python+torch+DDP process start -> first training step (interpreter, torch import,
                   process group, DDP construction, first step)

hpcorch's own part is signal .. reshape+release; the rest is what any restart pays. Then
it submits --jobs held jobs (a sleeping script) and times two controller cycles over them
(benchmarks/controller_cycle.py times the cycle in more detail).
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
    ap.add_argument("--jobs", type=int, default=500, help="held jobs for the cycle timing")
    ap.add_argument(
        "--port-base", type=int, default=int(os.environ.get("HPCORCH_POOL_PORT", 21800))
    )
    ap.add_argument("--resizes", type=int, default=1, help="times to repeat A's shrink and grow")
    ap.add_argument("--json", help="write every resize's parts (seconds) to this file")
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
    sh(env, str(REPO / "slurm" / "pool"), "up", "--port-base", str(args.port_base))
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
            "10",
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

        a = submit("A", 1, 4, 40 * args.resizes)
        a_dir = next((work / "home" / "jobs").glob("A-*"))
        wait("A training", lambda: any(m.get("event") == "first_step" for m in metrics(a_dir)), 180)
        store_path = state / "state.db"

        def phase(job: int) -> str:
            s = Store(store_path, readonly=True)
            try:
                rec = s.job(job)
                return rec.phase if rec else "?"
            finally:
                s.close()

        def count(event: str) -> int:
            return sum(m.get("event") == event for m in metrics(a_dir))

        for i in range(1, args.resizes + 1):
            b = submit(f"B{i}", 2, 2, 6)
            wait(f"B{i} done", lambda b=b: phase(b) == "done", 400)  # type: ignore[misc]
            wait("A grown back", lambda i=i: count("start") >= 1 + 2 * i, 300)  # type: ignore[misc]
            wait("A trained at 4 again", lambda i=i: count("first_step") >= 1 + 2 * i, 300)  # type: ignore[misc]
        rows = report(store_path, a, metrics(a_dir))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
        if args.jobs > 0:
            many(env, hp, work, args.jobs)
    finally:
        ctl.terminate()
        ctl.wait(30)
        subprocess.run(["scancel", "--reservation=bench"], env=env, capture_output=True)
        subprocess.run([str(REPO / "slurm" / "pool"), "down"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


PARTS = (
    "signal",
    "checkpoint",
    "exit",
    " (processes)",
    " (Slurm+poll)",
    "requeue",
    "relaunch wait",
    "reshape+release",
    "hpcorch own",
    "Slurm launch",
    "python+torch+DDP",
    "whole",
)


def report(store_path: Path, job: int, lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Print every resize of ``job`` split into its parts; return them."""
    s = Store(store_path, readonly=True)
    decisions = s.decisions(job)
    s.close()
    signals = [d for d in decisions if d.action == "signal" and d.detail.startswith("resize")]
    requeues = [d for d in decisions if d.action == "requeue_hold"]
    starts = [d for d in decisions if d.action == "start"][1:]
    ckpts = [m for m in lines if m.get("event") == "checkpoint" and m.get("reason") == "signal"]
    launch = [m for m in lines if m.get("event") == "start"][1:]
    exits = [m for m in lines if m.get("event") == "exit"]
    first = [m for m in lines if m.get("event") == "first_step"][1:]
    rows: list[dict[str, Any]] = []
    for sig in signals:
        try:
            ck = next(m for m in ckpts if m["written_time"] >= sig.time)
            rq = next(d for d in requeues if d.time >= ck["written_time"])
            st = next(d for d in starts if d.time >= rq.time)
            fs = next(m for m in first if m["time"] >= st.done_at)
            ln = next(m for m in launch if m["time"] >= st.done_at)
        except StopIteration:
            continue
        ex = next((m for m in exits if ck["written_time"] <= m["time"] <= rq.time), None)
        proc_start = fs["time"] - fs["since_start"]
        part = {
            "resize": f"{sig.from_gpus}->{sig.to_gpus}",
            "signal": sig.done_at - sig.time,
            "checkpoint": ck["written_time"] - sig.done_at,
            "exit": rq.time - ck["written_time"],
            " (processes)": ex["time"] - ck["written_time"] if ex else float("nan"),
            " (Slurm+poll)": rq.time - ex["time"] if ex else float("nan"),
            "requeue": rq.done_at - rq.time,
            "relaunch wait": st.time - rq.done_at,
            "reshape+release": st.done_at - st.time,
            "Slurm launch": proc_start - st.done_at,
            "python+torch+DDP": fs["time"] - proc_start,
        }
        part["hpcorch own"] = st.done_at - sig.time
        part["whole"] = fs["time"] - sig.time
        part["torch_import"] = ln.get("torch_import_seconds")
        part["ddp_wrap"] = ln.get("ddp_wrap_seconds")
        rows.append(part)
    print("\nresize (seconds), a real 4-rank DDP job on the local pool, 2 cores")
    print(f"{'resize':>8}" + "".join(f"{c:>17}" for c in PARTS))
    for r in rows:
        print(f"{r['resize']:>8}" + "".join(f"{r[c]:>17.2f}" for c in PARTS))
    if rows:
        med = {c: sorted(r[c] for r in rows)[len(rows) // 2] for c in PARTS}
        print(f"{'median':>8}" + "".join(f"{med[c]:>17.2f}" for c in PARTS))
    return rows


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
