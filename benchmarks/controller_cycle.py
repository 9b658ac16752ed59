"""The controller's cycle with many jobs in a real local Slurm pool.

    .venv/bin/python benchmarks/controller_cycle.py [--jobs 500] [--port-base P] [--profile]

Brings up its own pool (4 nodes x 4 GPUs, in .run/bench-cycle-pool; port base --port-base,
else $HPCORCH_POOL_PORT + 100, else 21900), submits --jobs held hpcorch jobs (a sleeping
script, through `hpcorch submit --dry-run` and sbatch) into a reservation of the whole
pool, and runs the production controller (SlurmCluster, SQLite store, ONES) in this
process: the first cycle (adopts every job, plans, starts what fits), then full and fast
cycles in the steady state. Each cycle is split into its parts (Slurm queries and their
parsing, the state machines, the store, metrics, the policy, the actions), in wall and CPU
seconds; --profile adds the top functions of one steady full cycle.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpcorch.controller import loop as loop_mod  # noqa: E402
from hpcorch.controller.execute import Executor  # noqa: E402
from hpcorch.controller.loop import Controller, LoopConfig  # noqa: E402
from hpcorch.controller.rounds import Rounds  # noqa: E402
from hpcorch.controller.store import Store  # noqa: E402
from hpcorch.policy import make_policy  # noqa: E402
from hpcorch.slurm import backend as backend_mod  # noqa: E402
from hpcorch.slurm.backend import SlurmCLI  # noqa: E402
from hpcorch.slurm.cluster import SlurmCluster  # noqa: E402

RES = "bench-cycle"


class Timer:
    """Wall and CPU seconds spent in wrapped functions, per label, for one cycle."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = defaultdict(float)
        self.cpu: dict[str, float] = defaultdict(float)
        self._depth = 0

    @contextmanager
    def part(self, label: str) -> Iterator[None]:
        w, c = time.perf_counter(), time.process_time()
        try:
            yield
        finally:
            self.wall[label] += time.perf_counter() - w
            self.cpu[label] += time.process_time() - c

    def wrap(self, owner: Any, name: str, label: str) -> None:
        fn = getattr(owner, name)

        def wrapped(*a: Any, **kw: Any) -> Any:
            with self.part(label):
                return fn(*a, **kw)

        setattr(owner, name, wrapped)

    def reset(self) -> None:
        self.wall.clear()
        self.cpu.clear()


def sh(env: dict[str, str], *argv: str, **kw: Any) -> str:
    return subprocess.run(
        list(argv), env=env, check=True, text=True, capture_output=True, **kw
    ).stdout


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=500)
    base = os.environ.get("HPCORCH_POOL_PORT")
    ap.add_argument("--port-base", type=int, default=int(base) + 100 if base else 21900)
    ap.add_argument("--cycles", type=int, default=5, help="steady cycles of each kind")
    ap.add_argument("--policy", default="ones")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpcorch-cycle-"))
    pool_dir = REPO / ".run" / "bench-cycle-pool"
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir), "HPCORCH_HOME": str(work / "home")}
    sh(env, str(REPO / "slurm" / "pool"), "up", "--port-base", str(args.port_base))
    env["SLURM_CONF"] = str(pool_dir / "etc" / "slurm.conf")
    try:
        run(env, work, args)
    finally:
        subprocess.run(["scancel", f"--reservation={RES}"], env=env, capture_output=True)
        time.sleep(1)
        subprocess.run(["scontrol", "delete", "reservation", RES], env=env, capture_output=True)
        subprocess.run([str(REPO / "slurm" / "pool"), "down"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def run(env: dict[str, str], work: Path, args: argparse.Namespace) -> None:
    cluster = SlurmCluster(RES, SlurmCLI(env=env), spool=work / "spool")
    cluster.ensure_reservation("n[1-4]", os.environ.get("USER", "root"), None)
    script = work / "sleeper.sh"
    script.write_text("#!/bin/sh\nsleep 3600\n")
    script.chmod(0o755)
    text = sh(
        env,
        sys.executable,
        "-m",
        "hpcorch",
        "submit",
        "--pool",
        RES,
        "--min-gpus",
        "1",
        "--max-gpus",
        "2",
        "--mode",
        "managed",  # predictable jobs: the policy plans every one
        "--dry-run",
        str(script),  # hpcorch's options go before the script
    )
    t0 = time.perf_counter()
    for _ in range(args.jobs):
        sh(env, "sbatch", "--parsable", input=text)
    print(
        f"{args.jobs} held jobs submitted in {time.perf_counter() - t0:.1f} s "
        f"({(time.perf_counter() - t0) / max(1, args.jobs) * 1000:.0f} ms per sbatch)"
    )
    timer = Timer()
    timer.wrap(cluster, "observe", "observe")
    timer.wrap(cluster.backend, "run", "Slurm commands")
    timer.wrap(cluster.backend, "_json", "commands+JSON")
    timer.wrap(backend_mod, "parse_squeue", "parse jobs")
    for name, label in (("_adopt_new", "adopt new jobs"), ("_read_metrics", "metrics")):
        timer.wrap(Controller, name, label)
    timer.wrap(Rounds, "schedule", "schedule (snapshot+policy)")
    timer.wrap(Executor, "execute", "actions")
    timer.wrap(loop_mod.reconcile, "observe", "state machines")
    store = Store(work / "state.db")
    for name in ("put_job", "jobs", "job", "add_decision", "finish_decision", "add_cycle"):
        timer.wrap(store, name, "store")
    ctl = Controller(cluster, store, make_policy(args.policy, 0), LoopConfig(), log=lambda m: None)
    rows: list[tuple[str, Any, Timer]] = []

    def one(kind: str, full: bool) -> None:
        timer.reset()
        w, c = time.perf_counter(), time.process_time()
        stats = ctl.cycle(full=full)
        timer.wall["total"] = time.perf_counter() - w
        timer.cpu["total"] = time.process_time() - c
        snap = Timer()
        snap.wall.update(timer.wall)
        snap.cpu.update(timer.cpu)
        rows.append((kind, stats, snap))

    one("first (adopts all)", True)
    time.sleep(2)
    for _ in range(args.cycles):
        one("full", True)
    for _ in range(args.cycles):
        one("fast", False)
    labels = [
        "total",
        "observe",
        "Slurm commands",
        "commands+JSON",
        "parse jobs",
        "adopt new jobs",
        "state machines",
        "store",
        "metrics",
        "schedule (snapshot+policy)",
        "actions",
    ]
    print(f"\ncontroller cycle with {args.jobs} jobs in the pool (wall / CPU seconds)")
    head = f"{'cycle':<20}{'calls':>6}{'decision':>9}" + "".join(f"{lb[:16]:>18}" for lb in labels)
    print(head)
    for kind, stats, t in rows:
        cells = "".join(f"{t.wall.get(lb, 0):>9.3f}/{t.cpu.get(lb, 0):<8.3f}" for lb in labels)
        print(f"{kind:<20}{stats.slurm_calls:>6}{stats.decision_s:>9.3f}{cells}")
    for kind in ("full", "fast"):
        totals = sorted(t.wall["total"] for k, _, t in rows if k == kind)
        if totals:
            print(f"median {kind} cycle: {totals[len(totals) // 2]:.3f} s wall")
    if args.profile:
        prof = cProfile.Profile()
        prof.enable()
        ctl.cycle(full=True)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(25)
        print(out.getvalue())


if __name__ == "__main__":
    main()
