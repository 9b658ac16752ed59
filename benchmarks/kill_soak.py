"""Kill the controller and slurmd while jobs are resized; count what was lost.

    HPCORCH_POOL_PORT=P .venv/bin/python benchmarks/kill_soak.py [--controller-kills 20]
        [--slurmd-kills 3] [--jobs 3] [--json FILE]

Brings up its own pool (4 nodes x 4 GPUs, in $HPCORCH_POOL_DIR or .run/soak-pool, port base
$HPCORCH_POOL_PORT), runs the production controller on it, and submits real DDP jobs
(examples/train_elastic.py, periodic checkpoints every 4 s). It keeps the jobs resizing
(pins alternating between GPU counts with `hpcorch resize`) and meanwhile:

  - kills the controller with SIGKILL --controller-kills times, each while a resize is in
    flight where it can (a job starting or stopping), and starts a new one on the same state;
  - kills the slurmd under a running job --slurmd-kills times and keeps it down until Slurm
    has requeued the job (past SlurmdTimeout), then brings the node back.

Then it lets every job finish and reports, from the jobs' own metrics (every line carries
its launch generation):

  jobs lost           jobs that did not finish (lost, failed, or still not done)
  double launches     lines of an older launch written after a newer launch started
  steps lost          per relaunch, the steps between the newest checkpoint written before
                      the relaunch and the step it resumed from (resuming from an older
                      checkpoint than the newest loses them): target 0
  steps redone        per relaunch, the steps the previous launch ran past its last
                      checkpoint (the work a kill or a node failure costs; not a loss of
                      state, reported for scale)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from hpcorch.controller.store import Store  # noqa: E402

ELASTIC = REPO / "examples" / "train_elastic.py"
RES = "soak"


def sh(env: dict[str, str], *argv: str, check: bool = True) -> str:
    res = subprocess.run(list(argv), env=env, text=True, capture_output=True)
    if check and res.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed: {res.stderr.strip()[-500:]}")
    return res.stdout


def wait(what: str, cond: Any, timeout: float) -> bool:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            print(f"  (timed out after {timeout:.0f} s waiting for {what})", flush=True)
            return False
        time.sleep(0.5)
    return True


class Ctl:
    def __init__(self, env: dict[str, str], state: Path) -> None:
        self.env, self.state = env, state
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = state / "controller.log"

    def start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "hpcorch", "controller", "--reservation", RES]
        argv += ["--nodes", "n[1-4]", "--policy", "share", "--state-dir", str(self.state)]
        argv += ["--interval", "1", "--round", "2", "--min-run", "4", "--grace", "60"]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, env=self.env, stdout=log, stderr=log)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            self.proc.wait(60)

    def phases(self) -> dict[int, str]:
        if not (self.state / "state.db").exists():
            return {}
        try:
            store = Store(self.state / "state.db", readonly=True)
        except Exception:
            return {}
        try:
            return {r.slurm_id: r.phase for r in store.jobs()}
        finally:
            store.close()


def squeue(env: dict[str, str]) -> dict[int, dict[str, Any]]:
    doc = json.loads(sh(env, "squeue", "--json"))
    return {int(j["job_id"]): j for j in doc["jobs"]}


def job_dirs(home: Path) -> dict[int, Path]:
    out = {}
    for spec in home.glob("jobs/*/job.json"):
        sid = json.loads(spec.read_text()).get("slurm_id")
        if sid:
            out[int(sid)] = spec.parent
    return out


def lines(d: Path) -> list[dict[str, Any]]:
    p = d / "metrics.jsonl"
    if not p.exists():
        return []
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()]


def analyse(ms: list[dict[str, Any]]) -> dict[str, int]:
    """Double launches, steps lost beyond the newest checkpoint, steps redone, launches."""
    newest_gen = -1
    late = 0
    last_ckpt = 0
    last_step = 0
    lost = redone = launches = 0
    for m in ms:
        gen = int(m.get("launch", 0))
        if gen < newest_gen:
            late += 1  # an older launch wrote after a newer one began
            continue
        ev = m.get("event")
        if ev == "start":
            launches += 1
            if gen > newest_gen and launches > 1:
                lost += max(0, last_ckpt - int(m["step"]))
                redone += max(0, last_step - int(m["step"]))
            newest_gen = max(newest_gen, gen)
        elif ev == "checkpoint":
            last_ckpt = max(last_ckpt, int(m["step"]))
        if m.get("step") is not None:
            last_step = int(m["step"])
    return {"double": late, "lost": lost, "redone": redone, "launches": launches}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--controller-kills", type=int, default=20)
    ap.add_argument("--slurmd-kills", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    rng = random.Random(a.seed)
    pool_dir = Path(os.environ.get("HPCORCH_POOL_DIR", REPO / ".run" / "soak-pool"))
    work = pool_dir.parent / (pool_dir.name + "-work")
    env = {**os.environ, "HPCORCH_POOL_DIR": str(pool_dir), "PYTHONUNBUFFERED": "1"}
    sh(env, str(REPO / "slurm" / "pool"), "up", "--nodes", "4", "--gpus-per-node", "4")
    env.update(
        SLURM_CONF=str(pool_dir / "etc" / "slurm.conf"),
        HPCORCH_HOME=str(work / "home"),
        HPCORCH_METRICS_INTERVAL="1",
        HPCORCH_CKPT_INTERVAL="4",
    )
    sh(env, "scancel", f"--reservation={RES}", check=False)
    sh(env, "scontrol", "delete", "reservation", RES, check=False)
    ctl = Ctl(env, work / f"ctl-{int(time.time())}")
    ctl.start()
    wait("the controller to hold the pool", lambda: "reservation" in ctl.log.read_text(), 120)
    t0 = time.time()
    jobs = []
    for i in range(a.jobs):
        out = sh(
            env,
            sys.executable,
            "-m",
            "hpcorch",
            "submit",
            str(ELASTIC),
            "--pool",
            RES,
            "--name",
            f"soak{i}",
            "--min-gpus",
            "1",
            "--max-gpus",
            "4",
            "--batch-size",
            "64",
            "--max-per-gpu-batch",
            "64",
            "--parsable",
            "--",
            "--global-batch",
            "64",
            "--samples",
            "2048",
            "--epochs",
            str(a.epochs),
            "--sample-delay",
            "0.002",
        )
        jobs.append(int(out.strip()))
    print(f"jobs {jobs}; controller state {ctl.state}", flush=True)
    ckills = skills = 0
    pins = 0
    plan = ["c"] * a.controller_kills + ["s"] * a.slurmd_kills
    rng.shuffle(plan)
    for what in plan:
        # keep the jobs resizing: pin one to another GPU count
        job = rng.choice(jobs)
        gpus = rng.choice([1, 2, 4])
        if sh(
            env,
            sys.executable,
            "-m",
            "hpcorch",
            "resize",
            str(job),
            "--gpus",
            str(gpus),
            check=False,
        ):
            pins += 1
        if what == "c":
            wait(
                "a resize in flight",
                lambda: any(p in ("starting", "stopping") for p in ctl.phases().values()),
                40,
            )
            time.sleep(rng.uniform(0, 2))
            ctl.kill9()
            ckills += 1
            print(f"[{time.time() - t0:6.0f} s] controller killed ({ckills})", flush=True)
            time.sleep(rng.uniform(0.5, 3))
            ctl.start()
        else:
            running = [
                j
                for j, q in squeue(env).items()
                if j in jobs and q["job_state"] in ("RUNNING", ["RUNNING"]) and q.get("nodes")
            ]
            if not running:
                wait(
                    "a running job",
                    lambda: any(
                        q["job_state"] in ("RUNNING", ["RUNNING"])
                        for j, q in squeue(env).items()
                        if j in jobs
                    ),
                    120,
                )
                running = [
                    j
                    for j, q in squeue(env).items()
                    if j in jobs and q["job_state"] in ("RUNNING", ["RUNNING"]) and q.get("nodes")
                ]
            if not running:
                continue
            job = rng.choice(running)
            node = sh(env, "scontrol", "show", "hostnames", squeue(env)[job]["nodes"]).split()[0]
            before = int(squeue(env)[job].get("restart_cnt", 0))
            pid = int((pool_dir / "run" / f"slurmd-{node}.pid").read_text())
            os.kill(pid, signal.SIGKILL)
            skills += 1
            print(
                f"[{time.time() - t0:6.0f} s] slurmd of {node} under job {job} killed ({skills})",
                flush=True,
            )
            wait(
                "Slurm to requeue the job",
                lambda j=job, b=before: int(squeue(env)[j].get("restart_cnt", 0)) > b,
                180,
            )
            time.sleep(5)
            sh(env, str(REPO / "slurm" / "pool"), "up", check=False)  # the node comes back
        time.sleep(rng.uniform(2, 6))
    for job in jobs:  # unpin: let them finish
        sh(env, sys.executable, "-m", "hpcorch", "resize", str(job), "--auto", check=False)
    wait(
        "every job to end",
        lambda: all(ctl.phases().get(j) in ("done", "failed", "lost", "cancelled") for j in jobs),
        1800,
    )
    phases = ctl.phases()
    ctl.stop()
    dirs = job_dirs(work / "home")
    rows = []
    for job in jobs:
        r = analyse(lines(dirs[job]))
        done = [m for m in lines(dirs[job]) if m.get("event") == "done"]
        rows.append({"job": job, "phase": phases.get(job, "?"), "done_events": len(done), **r})
    lost_jobs = sum(1 for r in rows if r["phase"] != "done")
    summary = {
        "controller_kills": ckills,
        "slurmd_kills": skills,
        "pins": pins,
        "jobs": len(jobs),
        "jobs_lost": lost_jobs,
        "double_launches": sum(r["double"] for r in rows),
        "steps_lost_beyond_checkpoint": sum(r["lost"] for r in rows),
        "steps_redone": sum(r["redone"] for r in rows),
        "launches": sum(r["launches"] for r in rows),
        "wall_s": round(time.time() - t0),
        "per_job": rows,
    }
    print("\n| job | final phase | launches | double launches | steps lost | steps redone |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['job']} | {r['phase']} | {r['launches']} | {r['double']} | {r['lost']} "
            f"| {r['redone']} |"
        )
    print(
        f"\ncontroller kill -9 x {ckills}, slurmd kill x {skills}, {pins} pins, "
        f"{summary['launches']} launches in {summary['wall_s']} s: jobs lost "
        f"{lost_jobs}, double launches {summary['double_launches']}, steps lost beyond the "
        f"last checkpoint {summary['steps_lost_beyond_checkpoint']} "
        f"(steps redone after a kill: {summary['steps_redone']})"
    )
    if a.json:
        a.json.write_text(json.dumps(summary, indent=2) + "\n")
    sh(env, "scancel", f"--reservation={RES}", check=False)


if __name__ == "__main__":
    main()
