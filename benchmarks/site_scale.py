"""hpcorch at a site's scale on real Slurm: many virtual nodes, thousands of jobs of many
Unix users, the controller that ships, and what it costs slurmctld.

    python benchmarks/site_scale.py                       # 64 nodes x 8 GPUs, 2000 jobs, 20 users
    python benchmarks/site_scale.py --slurm 25.11 --backend pyslurm
    python benchmarks/site_scale.py --nodes 8 --jobs 100 --users 4     # a small run

The workload: ``--jobs`` jobs drawn (seeded) from the bundled Pollux workloads (their
Philly-derived arrival times, applications, GPU counts and batch sizes; the eight
``load-1.0`` and eight ``load-0.5`` ones, 1920 jobs made for 64 GPUs), each job doing
``--time-scale`` of its measured work, arrivals compressed by ``--arrival-scale``
(default: the time scale; a smaller one loads the pool harder). The compute side (the
slurmd daemons and so every job they start) runs at ``--compute-nice`` (19): at a site those
are other machines, and the login node's slurmctld, controller and users do not wait
behind them for a CPU (0: all share the CPUs alike, as runs before this option did).
Each application's jobs belong to a few of the ``--users`` Unix users (a team trains one
model family), who submit them through hpcorch's Python API as they arrive; the jobs are
benchmarks/light_job.py, the featherweight emulated job, at their profile's speed.

It brings up its own pool (slurm/pool; its SlurmUser is the controller's user
``hpcorch``), runs ``hpcorch controller`` (ONES) as that user through the Slurm backend
asked for, and while the jobs run records: every cycle the controller's store keeps (full
and fast, the policy's decision time, active jobs, Slurm calls, actions), slurmctld's RPC
statistics per phase (``sdiag``, reset between phases: by type, and the controller's own by
its user) and CPU seconds, the controller's RSS and store size against the jobs it has
seen. ``--stall 30,120`` stops slurmctld (SIGSTOP) for 30 s and for 120 s, ``--slow
SECONDS[,ON,OFF]`` lets it run only ON of every ON+OFF seconds for SECONDS (every RPC
waits), at ``--incidents-at`` seconds after the first arrival. Then it simulates the same jobs
(``hpcorch simulate``, told the launch costs this run measured) and writes one row of
``benchmarks/results/site_scale.json`` (its ``runs`` list, one row per Slurm release and
backend), with the targets checked. Needs root.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks import site_measure as sm  # noqa: E402
from benchmarks import site_pool as sp  # noqa: E402
from benchmarks.light_profile import write_profiles  # noqa: E402
from benchmarks.replay import Watch, phases, write_workload  # noqa: E402
from benchmarks.replay_measure import launch_costs, real_summary  # noqa: E402
from benchmarks.site_report import check, job_startups, launches_without_a_start, save, table  # noqa: E402
from hpcorch.sim.traces import default_data_dir, load_apps  # noqa: E402
from hpcorch.sim.workload import WorkloadJob, load_workload  # noqa: E402

RESULTS = REPO / "benchmarks" / "results" / "site_scale.json"
RESERVATION = "site"
ENDED = ("done", "failed", "cancelled", "lost", "left", "refused", "timeout")


def site_workload(n: int, seed: int, arrival_scale: float) -> list[WorkloadJob]:
    """``n`` jobs drawn with replacement from the bundled workloads, in arrival order,
    arrivals scaled by ``arrival_scale``."""
    apps = load_apps()
    pool: list[WorkloadJob] = []
    for load in ("load-1.0", "load-0.5"):
        for i in range(1, 9):
            path = default_data_dir() / "workloads" / load / f"workload-{i}.csv"
            pool += load_workload(path, apps)
    picked = sorted(random.Random(seed).choices(pool, k=n), key=lambda j: j.time)
    return [
        WorkloadJob(
            f"{j.application}-{k}",
            round(j.time * arrival_scale, 1),
            j.application,
            j.num_replicas,
            j.batch_size,
        )
        for k, j in enumerate(picked)
    ]


def owners(jobs: list[WorkloadJob], users: list[str], seed: int) -> dict[str, str]:
    """Job name -> user: each application's jobs spread over its own users (user i
    trains application i mod 6)."""
    apps = sorted({j.application for j in jobs} | set(load_apps()))
    teams: dict[str, list[str]] = {a: [] for a in apps}
    for i, u in enumerate(users):
        teams[apps[i % len(apps)]].append(u)
    rng = random.Random(seed + 1)
    return {j.name: rng.choice(teams[j.application] or users) for j in jobs}


def job_request(j: WorkloadJob, s: sp.Site, args: argparse.Namespace) -> dict[str, Any]:
    """What ``hpcorch submit`` is given for ``j`` (as benchmarks/replay.py submits)."""
    app = load_apps()[j.application].scaled(args.time_scale)
    pool = args.nodes * args.gpus_per_node
    cap = min(pool, app.max_batch // app.min_micro)
    options = {
        "pool": RESERVATION, "name": j.name, "mode": "managed", "min_gpus": 1,
        "max_gpus": max(cap, min(j.num_replicas, pool)), "batch_size": app.init_batch,
        "max_batch_size": app.max_batch, "max_per_gpu_batch": app.max_micro,
        "app": j.application, "epochs": app.epochs,
        "dataset_size": max(1, round(app.progress_per_epoch_hint * app.init_batch)),
    }  # fmt: skip
    argv = ["--profile", str(s.site / "profiles" / f"{j.application}.json")]
    argv += [
        "--step-times",
        str(s.root / "step-times.sock"),
        "--time-scale",
        f"{args.time_scale:g}",
    ]
    return {"options": options, "script": str(s.site / "light_job.py"), "args": argv}


def calibrate_rpcs(s: sp.Site) -> dict[str, Any]:
    """The RPCs each of the controller's Slurm calls makes, measured as its user on the
    quiet pool before the run (a held job of its own to update)."""
    env = s.controller_env()
    held = subprocess.run(
        sp.as_user(sp.CONTROLLER, env, "sbatch", "--parsable", "--hold", "--output=/dev/null",
                   "--job-name=calibration", "--wrap", "true"),
        capture_output=True, text=True, check=True, cwd="/",
    ).stdout.strip().split(";")[0]  # fmt: skip
    extra = {}
    if s.backend == "pyslurm":
        for what in ("Jobs", "Nodes"):
            code = f"import pyslurm; pyslurm.{what}.load()"
            extra[f"pyslurm {what}.load"] = [sp.PYTHON, "-c", code]
    try:
        return sm.calibrate(s.env, sp.as_user, sp.CONTROLLER, env, int(held), extra)
    finally:
        subprocess.run(["scancel", held], env=s.env, capture_output=True, check=False)


def wait_for_line(log: Path, text: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.time() + timeout
    while text not in (log.read_text() if log.exists() else ""):
        if proc.poll() is not None or time.time() > deadline:
            raise SystemExit(f"site_scale: the controller did not start:\n{log.read_text()}")
        time.sleep(0.5)


def say(msg: str) -> None:
    print(f"site_scale: {msg}", file=sys.stderr, flush=True)


class Incidents(threading.Thread):
    """Runs the incidents on slurmctld at their times, each in a phase of its own (the
    incident and the minute after it), and the rest of the run in phases between."""

    def __init__(self, s: sp.Site, incidents: list[sp.Incident], at: list[float],
                 phases_: sm.Phases, recover_s: float = 60.0) -> None:  # fmt: skip
        super().__init__(daemon=True)
        self.s, self.incidents, self.at, self.phases = s, incidents, at, phases_
        self.recover_s = recover_s
        self.stop = threading.Event()
        self.t0 = 0.0

    def run(self) -> None:
        for n, (inc, at) in enumerate(zip(self.incidents, self.at, strict=False)):
            if self.stop.wait(max(0.0, self.t0 + at - time.time())):
                return
            self.phases.cut(f"incident {n + 1}: {inc.describe()}")
            say(f"incident {n + 1}: {inc.describe()}")
            if inc.kind == "stop":
                sp.stop_slurmctld(self.s.pool_dir, inc)
            else:
                sp.slow_slurmctld(self.s.pool_dir, inc, self.stop)
            say(f"incident {n + 1} over; {self.recover_s:.0f} s of recovery in its phase")
            if self.stop.wait(self.recover_s):
                return
            self.phases.cut(f"after incident {n + 1}")


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = Path(args.work).resolve()
    pool_dir = Path(args.pool_dir).resolve()
    pool_gpus = args.nodes * args.gpus_per_node
    jobs = site_workload(args.jobs, args.seed, args.arrival_scale)
    shape = f"{args.nodes} x {args.gpus_per_node} GPUs, Slurm {args.slurm}"
    say(f"{len(jobs)} jobs over {jobs[-1].time:.0f} s; pool up ({shape})")
    env = sp.pool_up(pool_dir, args.nodes, args.gpus_per_node, args.cpus_per_node,
                     args.port_base, args.slurm)  # fmt: skip
    if args.compute_nice:
        reniced = sp.nice_compute_side(pool_dir, args.compute_nice)
        say(f"{reniced} slurmd (and the jobs they start) at nice {args.compute_nice}")
    version = subprocess.run(["sinfo", "-V"], env=env, capture_output=True, text=True).stdout
    wheel = ""
    if args.backend == "pyslurm":
        wheel = subprocess.run(
            [str(REPO / "slurm" / "build"), "--pyslurm", args.slurm, sys.executable],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    s = sp.prepare(work, pool_dir, env, args.users, args.backend, wheel)
    write_workload(jobs, work / "workload.csv")
    write_profiles(s.site / "profiles", args.time_scale)
    subprocess.run(["chmod", "-R", "a+rX", str(s.site)], check=True)
    server = sp.StepTimeServer(work / "step-times.sock")
    calibration = calibrate_rpcs(s)
    ctl_log = work / "controller.log"
    controller = sp.start_controller(
        s, ctl_log, "--reservation", RESERVATION, "--nodes", f"n[1-{args.nodes}]",
        "--users", ",".join([*s.users, sp.CONTROLLER]), "--policy", args.policy,
        "--round", f"{args.round:g}", "--restart-cost", f"{args.restart_cost:g}",
    )  # fmt: skip
    who = owners(jobs, s.users, args.seed)
    watch = Watch()
    ids: dict[str, int] = {}
    incidents = sp.parse_incidents(args.stall, args.slow)
    span = max(1.0, jobs[-1].time)
    at = list(args.incidents_at)[: len(incidents)]
    phases_ = sm.Phases(env, lambda: sp.cpu_seconds(sp.slurmctld_pid(pool_dir)))
    sampler: sm.Sampler | None = None
    inc_thread: Incidents | None = None
    submitters: sp.Submitters | None = None
    t0 = time.time()
    try:
        wait_for_line(ctl_log, "holds the lease", controller, 120)
        submitters = sp.Submitters(s)
        sampler = sm.Sampler(s.state, controller.pid, args.sample_every)
        sampler.start()
        phases_.cut("arrivals")
        inc_thread = Incidents(s, incidents, at, phases_, args.recover)
        t0 = inc_thread.t0 = time.time()
        inc_thread.start()
        todo = list(jobs)
        last_said = last_poll = 0.0
        drained = False
        resumed: list[list[Any]] = []
        while True:
            now = time.time()
            while todo and t0 + todo[0].time <= now:
                j = todo.pop(0)
                submitters.submit(who[j.name], job_request(j, s, args))
            taken = submitters.taken()
            for name, answer in taken.items():
                if name not in ids and answer.isdigit():
                    ids[name] = int(answer)
            if now - last_poll >= args.poll_every:
                last_poll = now
                watch.poll(env, set(ids.values()))
                for node in sp.resume_unkillable(env):
                    resumed.append([round(now - t0, 1), node])
                    say(f"{node} drained by Slurm (Kill task failed): resumed, as an admin would")
            ph = phases(s.state / "state.db")
            ended = sum(1 for i in ids.values() if ph.get(i) in ENDED)
            if not todo and not drained and len(taken) == len(jobs):
                drained = True
                if inc_thread is not None and not inc_thread.is_alive():
                    phases_.cut("drain")
            if now - last_said >= 30:
                last_said = now
                active = len(ids) - ended
                done_n = f"{len(ids)}/{len(jobs)}, active {active}, ended {ended}"
                say(f"{now - t0:5.0f} s: submitted {done_n}")
            incidents_left = inc_thread is not None and inc_thread.is_alive()
            if not todo and len(ids) == len(jobs) and ended == len(jobs) and not incidents_left:
                break
            bad = [n for n, a in taken.items() if not a.isdigit()]
            if bad:
                raise SystemExit(f"site_scale: submitting {bad[0]} failed: {taken[bad[0]]}")
            if now > t0 + args.timeout:
                say(f"timed out after {args.timeout:.0f} s")
                break
            if controller.poll() is not None:
                raise SystemExit(
                    f"site_scale: the controller exited:\n{ctl_log.read_text()[-3000:]}"
                )
            time.sleep(1.0)
        settle(watch, env, set(ids.values()))
    finally:
        if inc_thread is not None:
            inc_thread.stop.set()
            inc_thread.join(300)
        with_phase = phases_.current is not None
        if with_phase:
            phases_.cut("")
        if sampler is not None:
            sampler.stop()
        controller.send_signal(signal.SIGTERM)
        try:
            controller.wait(120)
        except subprocess.TimeoutExpired:
            controller.kill()
        if submitters is not None:
            submitters.close()
        server.close()
        if ids:
            for chunk in range(0, len(ids), 200):
                some = [str(i) for i in list(ids.values())[chunk : chunk + 200]]
                subprocess.run(["scancel", *some], env=env, capture_output=True, check=False)
        subprocess.run(["scontrol", "delete", f"reservation={RESERVATION}"], env=env,
                       capture_output=True, check=False)  # fmt: skip
    db = s.state / "state.db"
    order = list(ids.values())
    stops = [(i.start, i.end) for i in incidents if i.start and i.kind == "stop"]
    real = real_summary(db, t0, order, watch.running, pool_gpus, paused=stops)
    store_phase = phases(db)
    real["jobs_completed"] = sum(
        1
        for i in order
        if store_phase.get(i) == "done" and watch.states.get(i) in ("COMPLETED", None)
    )
    real["jobs_lost"] = sum(1 for i in order if store_phase.get(i) == "lost")
    cycles = sampler.cycles if sampler else []
    windows = [(i.start, i.end + args.recover) for i in incidents if i.start]
    calm = [c for c in cycles if not any(a <= float(c["time"]) <= b for a, b in windows)]
    decisions = sm.read_rows(db, "SELECT * FROM decisions")
    log = ctl_log.read_text() if ctl_log.exists() else ""
    doc: dict[str, Any] = {
        "slurm_version": version.split()[-1] if version else args.slurm,
        "backend": args.backend,
        "nodes": args.nodes,
        "gpus": pool_gpus,
        "jobs": len(jobs),
        "users": len(s.users),
        "time_scale": args.time_scale,
        "compute_nice": args.compute_nice,
        "arrival_scale": args.arrival_scale,
        "arrivals_s": round(span, 1),
        "policy": args.policy,
        "round_s": args.round,
        "restart_cost_s": args.restart_cost,
        "jobs_completed": real["jobs_completed"],
        "jobs_lost": real["jobs_lost"],
        "max_wait_planned_s": real["max_wait_planned_s"],
        "max_wait_planned_outside_stops_s": real["max_wait_planned_outside_stops_s"],
        "gpu_view_mismatches": real["gpu_view_mismatches"],
        "max_active_jobs": max((int(c["jobs"]) for c in cycles), default=0),
        "real": real,
        "costs": launch_costs(db, watch.running),
        "cycles": sm.cycle_table(calm),
        "cycles_in_incidents": sm.cycle_table([c for c in cycles if c not in calm]),
        "cycles_at_1000": {
            "full": sm.at_least(calm, 1000, True),
            "fast": sm.at_least(calm, 1000, False),
            "full_without_decision": sm.at_least(calm, 1000, True, less_decision=True),
            "controller_cpu": sm.cpu_per_cycle(sampler.memory if sampler else [], cycles, 1000),
        },
        "rpc_phases": sm.rpc_phases(phases_.done, cycles, decisions, sp.CONTROLLER),
        "rpc_formula": sm.formula_check(cycles),
        "rpcs_per_command": calibration,
        "memory": sampler.memory[:: max(1, len(sampler.memory) // 40)] if sampler else [],
        "incidents": [
            {
                "kind": i.kind,
                "seconds": i.seconds,
                "start": i.start,
                "end": i.end,
                "what": i.describe(),
                "controller_lines": sm.lines_about(
                    _window(log, i.start, _said_until(i.end + args.recover, cycles)), _WORDS
                ),
            }
            for i in incidents
            if i.start
        ],
        "unplanned_launches": log.count("unplanned:"),
        "nodes_resumed": resumed,
        "launches_without_a_start": launches_without_a_start(db),
        "light_job_startup_s": job_startups(db),
    }
    doc["cycle_p99_s"] = doc["cycles_at_1000"]["full"].get("p99", 0.0)
    return doc


_WORDS = ("Slurm", "slurm", "cycle failed", "retry")


def settle(watch: Watch, env: dict[str, str], ids: set[int], within_s: float = 60.0) -> None:
    """Slurm's state of every job once the controller has seen them all end: looked at
    again until Slurm shows none still running or completing (the last look, up to
    ``--poll-every`` old, can show the last job still running)."""
    deadline = time.monotonic() + within_s
    while True:
        watch.poll(env, ids)
        if time.monotonic() > deadline or not any(
            watch.states.get(i) in ("RUNNING", "COMPLETING") for i in ids
        ):
            return
        time.sleep(1.0)


def _said_until(end: float, cycles: list[dict[str, Any]]) -> float:
    """Where an incident's window of the controller's lines ends: ``end``, or later, when a
    cycle under way then ended later (a cycle of slow answers says so when it ends)."""
    ends = [float(c["time"]) + float(c["seconds"]) for c in cycles if float(c["time"]) <= end]
    return max([end, *ends]) + 1.0


def _window(log: str, start: float, end: float) -> str:
    """The controller's log lines between two Unix times (its lines begin with ISO time)."""
    out = []
    for line in log.splitlines():
        try:
            t = time.mktime(time.strptime(line[:19], "%Y-%m-%dT%H:%M:%S"))
        except ValueError:
            continue
        if start - 1 <= t <= end:
            out.append(line)
    return "\n".join(out)


def simulate(workload: Path, doc: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    fit = doc["costs"].get("startup_fit", {})
    finish = doc["costs"].get("finish", {}).get("mean", 0.0)
    argv = [
        sys.executable, "-m", "hpcorch", "simulate", str(workload), "--policy", args.policy,
        "--nodes", str(args.nodes), "--gpus-per-node", str(args.gpus_per_node),
        "--cpus-per-node", str(args.cpus_per_node), "--round", f"{args.round:g}",
        "--time-scale", f"{args.time_scale:g}", "--json",
        "--startup-s", f"{fit.get('startup_s') or args.startup_s:g}",
        "--startup-per-gpu-s", f"{fit.get('startup_per_gpu_s', 0.0):g}",
        "--finish-s", f"{finish:g}", "--policy-restart-cost", f"{args.restart_cost:g}",
    ]  # fmt: skip
    out = subprocess.run(argv, capture_output=True, text=True, check=True)
    res = json.loads(out.stdout)["results"][0]
    return {k: res[k] for k in ("avg_jct", "p99_jct", "makespan", "restarts_per_job")} | {
        "costs": {"startup_s": argv[argv.index("--startup-s") + 1], "finish_s": finish}
    }


def _terminated(signum: int, frame: Any) -> None:
    raise SystemExit(f"site_scale: terminated (signal {signum})")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, default=64)
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--cpus-per-node", type=int, default=16)
    p.add_argument("--jobs", type=int, default=2000)
    p.add_argument("--users", type=int, default=20)
    p.add_argument("--time-scale", type=float, default=0.02)
    p.add_argument("--arrival-scale", type=float, default=0.005, help="0: --time-scale")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--policy", default="ones")
    p.add_argument("--round", type=float, default=60.0)
    p.add_argument("--startup-s", type=float, default=3.0,
                   help="a launch's start-up, for the policy's restart cost")  # fmt: skip
    p.add_argument("--slurm", default="22.05")
    p.add_argument("--backend", choices=("commands", "pyslurm"), default="commands")
    p.add_argument(
        "--compute-nice",
        type=int,
        default=19,
        choices=range(20),
        metavar="0-19",
        help="nice of the slurmd daemons and so of the jobs (0: as the rest)",
    )
    p.add_argument("--stall", type=lambda v: [float(x) for x in v.split(",") if x], default=[])
    p.add_argument("--slow", type=lambda v: [float(x) for x in v.split(",") if x], default=[])
    p.add_argument("--incidents-at", type=lambda v: [float(x) for x in v.split(",")],
                   default=[420.0, 600.0, 900.0],
                   help="seconds after the first arrival at which the incidents begin "
                   "(each waits for the one before and its recovery)")  # fmt: skip
    p.add_argument("--port-base", type=int, default=int(os.environ.get("HPCORCH_POOL_PORT", 27000)))
    p.add_argument("--pool-dir", default=str(REPO / ".run" / "site-scale-pool"))
    p.add_argument("--work", default=str(REPO / ".run" / "site-scale"))
    p.add_argument(
        "--recover", type=float, default=60.0, help="seconds after an incident in its phase"
    )
    p.add_argument("--poll-every", type=float, default=5.0)
    p.add_argument("--sample-every", type=float, default=15.0)
    p.add_argument("--timeout", type=float, default=4 * 3600.0)
    p.add_argument("--no-sim", action="store_true", help="skip the simulation")
    p.add_argument("--keep-pool", action="store_true", help="leave the pool up")
    p.add_argument("--out", default=str(RESULTS))
    args = p.parse_args()
    args.arrival_scale = args.arrival_scale or args.time_scale
    from hpcorch.sim.costs import ResizeCost

    cost = ResizeCost()
    args.restart_cost = cost.total - cost.startup_s + args.startup_s
    if os.geteuid() != 0:
        raise SystemExit("site_scale: needs root (it creates users and runs jobs as them)")
    signal.signal(signal.SIGTERM, _terminated)  # the controller and the pool are stopped
    try:
        doc = run(args)
    finally:
        if not args.keep_pool:
            sp.pool_down(Path(args.pool_dir).resolve())
    if not args.no_sim:
        say("simulating the same jobs")
        doc["sim"] = simulate(Path(args.work).resolve() / "workload.csv", doc, args)
    doc["targets"] = check(doc)
    doc["commit"] = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                                   capture_output=True, text=True).stdout.strip()  # fmt: skip
    save(doc, Path(args.out))
    print(table(doc))
    print(f"written: {args.out}")


if __name__ == "__main__":
    main()
