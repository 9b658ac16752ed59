"""Replay a workload on the real local pool through the controller that ships, then simulate
the same jobs, and compare.

A bundled Pollux workload is cut to N jobs (every k-th job, so they span the whole trace at
the pool's share of its load) and scaled in time by F: arrivals come F times sooner and
every job does F times its work (benchmarks/emulated_job.py, which sleeps its profile's
step times on the real runtime; `hpcorch simulate --time-scale F`). Start-up, checkpoint
and requeue costs are paid in full on both sides: they are what the comparison is about.

    python benchmarks/replay.py                      # 40 jobs, F = 0.05, Slurm 22.05, ones
    python benchmarks/replay.py --slurm 25.11 --startup-s 8
    python benchmarks/replay.py --resimulate benchmarks/results/replay.json

Both sides are told the same costs: the simulator charges hpcorch/sim/costs.py's parts with
``--startup-s`` for a launch's start-up (released -> first training step), and the real
controller's policy is told the resize cost they add up to. A start-up depends on the
machine and the job (Python and torch in every rank; the emulated jobs load no data and
init no GPU): the replay measures it (``costs.startup`` in replay.json), to give the next
replay on the same pool.

It brings up its own pool (4 nodes x 4 GPUs, slurm/pool), runs `hpcorch controller` on a
reservation of all of it, submits every job with `hpcorch submit` at its scaled arrival
time as one of two Unix users (an application belongs to one user), polls Slurm every 2 s
until every job has ended, then runs `hpcorch simulate` on the same jobs. It writes
``benchmarks/results/replay.json`` (see ``--out``), the `hpcorch report` picture of the
real run (``--picture``), and prints the comparison table. Needs root (users, setpriv).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.replay_measure import launch_costs, real_summary  # noqa: E402
from benchmarks.slurm_backends import pool_env  # noqa: E402
from hpcorch.sim.traces import default_data_dir, load_apps  # noqa: E402
from hpcorch.sim.workload import WorkloadJob, load_workload  # noqa: E402

POOL = REPO / "slurm" / "pool"
JOB = REPO / "benchmarks" / "emulated_job.py"
INSTALL = REPO / "slurm" / "install-site"
SITE = f"/var/cache/hpcorch/test-site-{zlib.crc32(str(REPO).encode()):08x}"
"""The users' installation by default: the one the integration tests use
(tests/integration/users.py), which passes it with --site."""
SITE_OPTIONS = ("--with-torch", "--extras", "prometheus,sim", "--state-dir", "none")
"""As tests/integration/users.py installs it (the same options: no reinstall between them)."""
NODES, GPUS, CPUS = 4, 4, 8
TARGETS = {"avg_jct": 0.15, "restarts_per_job": 0.20}
"""Largest relative difference of real from simulated allowed (issue 24)."""
MAX_WAIT_PLANNED_S = 120.0


@dataclass
class Submitted:
    job: WorkloadJob
    user: str
    slurm_id: int
    at: float


@dataclass
class Watch:
    """What the poller saw of each job: when Slurm first showed each launch running."""

    running: dict[int, list[float]] = field(default_factory=dict)
    states: dict[int, str] = field(default_factory=dict)

    def poll(self, env: dict[str, str], ids: set[int]) -> None:
        out = subprocess.run(
            ["squeue", "-h", "-t", "all", "-o", "%i %T %r"], env=env, capture_output=True,
            text=True, check=False,
        )  # fmt: skip
        now = time.time()
        for line in out.stdout.splitlines():
            parts = line.split()
            if len(parts) < 2 or not parts[0].isdigit() or int(parts[0]) not in ids:
                continue
            jid, state = int(parts[0]), parts[1]
            if state == "RUNNING" and self.states.get(jid) != "RUNNING":
                self.running.setdefault(jid, []).append(now)
            self.states[jid] = state


def cut(
    jobs: list[WorkloadJob], n: int, scale: float, gpus: int, trace_gpus: int
) -> list[WorkloadJob]:
    """Every k-th job (k = trace GPUs / pool GPUs, at least so that n jobs remain), the
    first n of them, arrivals scaled by ``scale``."""
    k = max(1, min(trace_gpus // max(gpus, 1), len(jobs) // max(n, 1)))
    picked = jobs[::k][:n]
    return [
        WorkloadJob(j.name, round(j.time * scale, 1), j.application, j.num_replicas, j.batch_size)
        for j in picked
    ]


def write_workload(jobs: list[WorkloadJob], path: Path) -> None:
    with path.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["name", "time", "application", "num_replicas", "batch_size"])
        for j in jobs:
            w.writerow([j.name, j.time, j.application, j.num_replicas, j.batch_size])


def ensure_user(name: str) -> None:
    if subprocess.run(["id", "-u", name], capture_output=True).returncode != 0:
        subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True
        )


def user_site(prefix: Path, work: Path) -> Path:
    """hpcorch as a site installs it for every user (slurm/install-site PREFIX, with torch for
    the jobs and the simulator's traces they sleep by; quick when it is up to date), and the
    emulated job copied where the users can read it (a checkout in a home directory or CI's
    may not be); the job's path."""
    argv = [str(INSTALL), str(prefix), *SITE_OPTIONS, "--quiet"]
    subprocess.run(argv, check=True)
    job = work / JOB.name
    shutil.copy2(JOB, job)
    job.chmod(0o644)
    return job


def submit(
    env: dict[str, str],
    user: str,
    home: Path,
    spool: Path,
    prefix: Path,
    script: Path,
    res: str,
    job: WorkloadJob,
    scale: float,
) -> int:
    """``hpcorch submit`` of one workload job as ``user``; its Slurm id."""
    apps = load_apps()
    app = apps[job.application].scaled(scale)
    cap = min(NODES * GPUS, app.max_batch // app.min_micro)
    py = str(prefix / "bin" / "python")
    user_env = {
        "PATH": env["PATH"],
        "SLURM_CONF": env["SLURM_CONF"],
        "HOME": str(home),
        "HPCORCH_HOME": str(home),
        "HPCORCH_SPOOL": str(spool),
        "HPCORCH_PYTHON": py,
        "PYTHONUNBUFFERED": "1",
        "LD_LIBRARY_PATH": env.get("LD_LIBRARY_PATH", ""),
    }
    argv = [
        "setpriv", "--reuid", user, "--regid", user, "--init-groups",
        "env", "-i", *(f"{k}={v}" for k, v in user_env.items()),
        py, "-m", "hpcorch", "submit", "--pool", res, "--name", job.name,
        "--min-gpus", "1", "--max-gpus", str(max(cap, min(job.num_replicas, NODES * GPUS))),
        "--batch-size", str(app.init_batch), "--max-batch-size", str(app.max_batch),
        "--max-per-gpu-batch", str(app.max_micro), "--app", job.application,
        "--epochs", str(app.epochs),
        "--dataset-size", str(max(1, round(app.progress_per_epoch_hint * app.init_batch))),
        "--parsable", str(script), "--app", job.application,
        "--time-scale", f"{scale:g}",
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=str(home))
    if out.returncode != 0:
        raise SystemExit(f"replay: submitting {job.name} as {user} failed: {out.stderr.strip()}")
    return int(out.stdout.strip().split(";")[0])


def phases(state_db: Path) -> dict[int, str]:
    if not state_db.exists():
        return {}
    try:
        db = sqlite3.connect(f"file:{state_db}?mode=ro", uri=True, timeout=5)
        try:
            return {int(i): str(p) for i, p in db.execute("SELECT slurm_id, phase FROM jobs")}
        finally:
            db.close()
    except sqlite3.Error:
        return {}


def simulate(workload: Path, args: argparse.Namespace) -> dict[str, Any]:
    argv = [
        sys.executable, "-m", "hpcorch", "simulate", str(workload), "--policy", args.policy,
        "--nodes", str(NODES), "--gpus-per-node", str(GPUS), "--cpus-per-node", str(CPUS),
        "--round", f"{args.round:g}", "--time-scale", f"{args.time_scale:g}", "--json",
        "--startup-s", f"{args.startup_s:g}", "--startup-per-gpu-s", f"{args.startup_per_gpu_s:g}",
        "--finish-s", f"{args.finish_s:g}", "--policy-restart-cost", f"{args.restart_cost:g}",
        *(["--gpu-types", args.gpu_types] if args.gpu_types else []),
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout)["results"][0])


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work).resolve()
    work.mkdir(parents=True, exist_ok=True)
    work.chmod(0o755)
    data = default_data_dir()
    apps = load_apps()
    full = load_workload(data / "workloads" / f"{args.workload}.csv", apps)
    jobs = cut(full, args.jobs, args.time_scale, NODES * GPUS, 64)
    workload = work / "workload.csv"
    write_workload(jobs, workload)
    pool_dir = Path(args.pool_dir).resolve()
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir)}
    up = [str(POOL), "up", "--nodes", str(NODES), "--gpus-per-node", str(GPUS)]
    up += ["--cpus-per-node", str(CPUS), "--port-base", str(args.port_base), "--slurm", args.slurm]
    up += ["--gpu-types", args.gpu_types] if args.gpu_types else []
    subprocess.run(up, env=env, check=True, capture_output=True)
    env = pool_env(pool_dir)
    version = subprocess.run(["sinfo", "-V"], env=env, capture_output=True, text=True).stdout
    users = args.users.split(",")
    homes = {}
    for u in users:
        ensure_user(u)
        homes[u] = work / f"home-{u}"
        subprocess.run(["rm", "-rf", str(homes[u])], check=True)
        homes[u].mkdir(mode=0o700)
        subprocess.run(["chown", f"{u}:{u}", str(homes[u])], check=True)
    prefix = Path(args.site)
    script = user_site(prefix, work)
    spool = work / "spool"
    ctl = work / "controller"
    subprocess.run(["rm", "-rf", str(spool), str(ctl)], check=True)
    res = args.reservation
    ctl.mkdir()
    log = ctl / "controller.log"
    controller = subprocess.Popen(
        [
            sys.executable, "-m", "hpcorch", "controller", "--reservation", res,
            "--nodes", f"n[1-{NODES}]", "--users", ",".join(users), "--policy", args.policy,
            "--state-dir", str(ctl), "--spool", str(spool), "--round", f"{args.round:g}",
            "--restart-cost", f"{args.restart_cost:g}",
        ],
        env=env, stdout=subprocess.DEVNULL, stderr=log.open("w"),
    )  # fmt: skip
    owner = {a: users[i % len(users)] for i, a in enumerate(sorted({j.application for j in jobs}))}
    submitted: list[Submitted] = []
    watch = Watch()
    try:
        deadline = time.time() + 60
        while "reservation" not in log.read_text():
            if controller.poll() is not None or time.time() > deadline:
                raise SystemExit(f"replay: the controller did not start:\n{log.read_text()}")
            time.sleep(0.5)
        t0 = time.time()
        last_said = 0.0
        todo = list(jobs)
        stop_at = t0 + args.timeout
        while True:
            now = time.time()
            while todo and t0 + todo[0].time <= now:
                j = todo.pop(0)
                u = owner[j.application]
                sid = submit(env, u, homes[u], spool, prefix, script, res, j, args.time_scale)
                submitted.append(Submitted(j, u, sid, time.time()))
            ids = {s.slurm_id for s in submitted}
            watch.poll(env, ids)
            ph = phases(ctl / "state.db")
            ended = [i for i in ids if ph.get(i) in ("done", "failed", "cancelled", "lost")]
            if now - last_said >= 30:
                last_said = now
                running = sum(1 for i in ids if watch.states.get(i) == "RUNNING")
                print(
                    f"replay: {now - t0:5.0f} s  submitted {len(submitted)}/{len(jobs)}  "
                    f"running {running}  ended {len(ended)}",
                    file=sys.stderr, flush=True,
                )  # fmt: skip
            if not todo and len(ended) == len(jobs):
                break
            if now > stop_at:
                print(f"replay: timed out after {args.timeout:.0f} s", file=sys.stderr)
                break
            if controller.poll() is not None:
                raise SystemExit(f"replay: the controller exited:\n{log.read_text()[-3000:]}")
            time.sleep(2.0)
    finally:
        controller.send_signal(signal.SIGTERM)
        try:
            controller.wait(60)
        except subprocess.TimeoutExpired:
            controller.kill()
        ids = [str(s.slurm_id) for s in submitted]
        if ids:
            subprocess.run(["scancel", *ids], env=env, capture_output=True, check=False)
        subprocess.run(
            ["scontrol", "delete", f"reservation={res}"], env=env, capture_output=True, check=False
        )
    real = real_summary(ctl / "state.db", t0, [s.slurm_id for s in submitted], watch.running)
    real["jobs_completed"] = sum(
        1 for s in submitted if watch.states.get(s.slurm_id) in ("COMPLETED", None)
        and phases(ctl / "state.db").get(s.slurm_id) == "done"
    )  # fmt: skip
    doc = {
        "workload": args.workload,
        "jobs": len(jobs),
        "time_scale": args.time_scale,
        "slurm_version": version.split()[-1] if version else args.slurm,
        "policy": args.policy,
        "gpu_types": args.gpu_types,
        "round_s": args.round,
        "startup_s": args.startup_s,
        "startup_per_gpu_s": args.startup_per_gpu_s,
        "finish_s": args.finish_s,
        "restart_cost_s": args.restart_cost,
        "users": users,
        "real": real,
        "costs": launch_costs(ctl / "state.db", watch.running),
    }
    compare(doc, workload, args)
    if args.picture:
        subprocess.run(
            [sys.executable, "-m", "hpcorch", "report", str(ctl), "--out", args.picture,
             "--pool-gpus", str(NODES * GPUS)],
            capture_output=True, check=False,
        )  # fmt: skip
    return doc


def compare(doc: dict[str, Any], workload: Path, args: argparse.Namespace) -> None:
    """``hpcorch simulate`` of the replayed jobs into ``doc``, with the targets met."""
    sim = simulate(workload, args)
    doc["commit"] = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    doc["sim"] = {k: sim[k] for k in ("avg_jct", "p99_jct", "makespan", "restarts_per_job")}
    doc["sim"]["gpu_utilisation"] = sim["utilization"]
    doc["sim"]["costs"] = {
        "startup_s": args.startup_s,
        "startup_per_gpu_s": args.startup_per_gpu_s,
        "finish_s": args.finish_s,
    }
    doc["targets"] = check(doc)


def check(doc: dict[str, Any]) -> dict[str, bool]:
    real, sim = doc["real"], doc["sim"]
    out = {"every job completed": real["jobs_completed"] == doc["jobs"]}
    for key, bound in TARGETS.items():
        base = max(abs(sim[key]), 1e-9)
        out[f"{key} within {bound:.0%}"] = abs(real[key] - sim[key]) / base <= bound
    out[f"max_wait_planned_s <= {MAX_WAIT_PLANNED_S:g}"] = (
        real["max_wait_planned_s"] <= MAX_WAIT_PLANNED_S
    )
    return out


def table(doc: dict[str, Any]) -> str:
    rows = [("", "real", "sim", "real/sim")]
    for key in ("avg_jct", "p99_jct", "makespan", "restarts_per_job", "gpu_utilisation"):
        r, s = doc["real"][key], doc["sim"][key]
        rows.append((key, f"{r:.2f}", f"{s:.2f}", f"{r / s:.2f}" if s else "-"))
    for key in ("max_wait_planned_s", "jobs_completed"):
        rows.append((key, f"{doc['real'][key]:g}", "-", "-"))
    width = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = [
        "  ".join(
            c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, width, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in width))
    head = (
        f"{doc['workload']}: {doc['jobs']} jobs, time scale {doc['time_scale']:g}, policy "
        f"{doc['policy']}, Slurm {doc['slurm_version']}, commit {doc['commit']}"
    )
    marks = [f"  [{'x' if ok else ' '}] {name}" for name, ok in doc["targets"].items()]
    return "\n".join([head, *lines, "targets:", *marks])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--workload", default="load-1.0/workload-6")
    p.add_argument("--jobs", type=int, default=40)
    p.add_argument("--time-scale", type=float, default=0.05)
    p.add_argument("--policy", default="ones")
    p.add_argument("--round", type=float, default=60.0, help="scheduling round, both sides")
    p.add_argument(
        "--startup-s",
        type=float,
        default=0.0,
        help="a launch's start-up (released -> first step) on this pool, as a replay measured "
        "it (its costs.startup_fit): the simulator charges it, and the controller's policy "
        "is told the resize cost it makes [default: hpcorch/sim/costs.py's]",
    )
    p.add_argument(
        "--startup-per-gpu-s",
        type=float,
        default=0.0,
        help="what each GPU's rank adds to a start-up on this pool (costs.startup_fit)",
    )
    p.add_argument(
        "--finish-s",
        type=float,
        default=0.0,
        help="a job's last step -> its end in Slurm on this pool (costs.finish.mean)",
    )
    p.add_argument(
        "--gpu-types",
        default="",
        metavar="TYPE:NODES,...",
        help="nodes of several GPU types, e.g. a100:2,v100:2 (the emulated jobs run at each "
        "type's speed factor; the simulator is given the same pool)",
    )
    p.add_argument("--slurm", default="22.05")
    p.add_argument("--pool-dir", default=str(REPO / ".run" / "replay-pool"))
    p.add_argument("--port-base", type=int, default=18900)
    p.add_argument("--work", default=str(REPO / ".run" / "replay"))
    p.add_argument(
        "--site",
        default=SITE,
        help="where slurm/install-site installs hpcorch for the users (every user must "
        "reach it) [%(default)s]",
    )
    p.add_argument("--reservation", default="replay")
    p.add_argument("--users", default="hpcorch-alice,hpcorch-bob")
    p.add_argument("--timeout", type=float, default=3600.0)
    p.add_argument("--out", default=str(REPO / "benchmarks" / "results" / "replay.json"))
    p.add_argument("--picture", default=str(REPO / "benchmarks" / "results" / "replay.png"))
    p.add_argument(
        "--resimulate",
        metavar="JSON",
        help="no real run: simulate the jobs of --work again and compare with this "
        "replay.json's real side (after a change to the simulator)",
    )
    args = p.parse_args()
    from hpcorch.sim.costs import ResizeCost

    cost = ResizeCost()
    given = args.startup_s
    args.startup_s = args.startup_s or cost.startup_s
    args.restart_cost = cost.total - cost.startup_s + args.startup_s
    if os.geteuid() != 0 and not args.resimulate:
        raise SystemExit("replay: needs root (it creates the users and submits as them)")
    if args.resimulate:  # the real run as it was, the simulator as it is now
        doc = json.loads(Path(args.resimulate).read_text())
        for key in ("workload", "time_scale", "policy"):
            setattr(args, key, doc[key])
        args.gpu_types = doc.get("gpu_types", "")
        args.round = doc.get("round_s", args.round)
        args.restart_cost = doc.get("restart_cost_s", args.restart_cost)  # as the real run's
        args.startup_s = given or doc.get("startup_s", args.startup_s)
        for key in ("startup_per_gpu_s", "finish_s"):
            if not getattr(args, key):
                setattr(args, key, doc.get(key, 0.0))
        compare(doc, Path(args.work).resolve() / "workload.csv", args)
    else:
        doc = run(args)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(table(doc))
    drawn = args.picture and not args.resimulate
    print(f"written: {args.out}" + (f", {args.picture}" if drawn else ""))


if __name__ == "__main__":
    main()
