"""The same Hugging Face Trainer job in sidecar mode and with hpcorch's integration: what the
controller knows of it and does with it, on a real local Slurm pool.

    .venv/bin/python benchmarks/integration_modes.py [--policy share-batch] [--json out.json]

Brings up its own pool (in $HPCORCH_POOL_DIR, else .run/bench-pool; port base
--port-base, else $HPCORCH_POOL_PORT, else 21800) and runs the controller on one node (4
GPUs) at the demo's settings (1 s cycles, 2 s rounds, 5 s minimum run). For each mode it
submits the tiny GPT-2 of examples/train_transformers.py (1-4 GPUs, global batch 32, at most
16 per GPU): ``sidecar`` is the script without the line (``--plain``: the Trainer alone,
its just-in-time checkpoint on SIGTERM, ``--stop-signal TERM``, its progress bar read by
``--progress-regex``); ``integration`` is the script with ``hpt.elastic(trainer)``. Once
the job trains, a second job (examples/train_elastic.py, 2 GPUs) arrives, so the job
shrinks, then grows back when it ends. Printed per mode: the controller's record of the job
(mode, predictable, throughput samples, noise-scale reports), the batches it planned and
the batches the job trained, resizes, rebatches and restarts, the time from a planned batch
to the first step at it, and the job's completion time.
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

JOB_ARGS = ["--epochs", "3", "--samples", "2048", "--batch-size", "8", "--sample-delay", "0.004"]
SIDECAR = ["--mode", "sidecar", "--stop-signal", "TERM", "--grace", "60"]
TQDM = r"(\d+)/(\d+) \["


def sh(env: dict[str, str], *argv: str) -> str:
    return subprocess.run(list(argv), env=env, check=True, text=True, capture_output=True).stdout


def wait(what: str, cond: Any, timeout: float) -> None:
    deadline = time.time() + timeout
    while not cond():
        if time.time() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.5)


def metrics(job_dir: Path) -> list[dict[str, Any]]:
    path = job_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def run_mode(mode: str, env: dict[str, str], work: Path, policy: str) -> dict[str, Any]:
    hp = [sys.executable, "-m", "hpcorch"]
    res = f"bench-{mode}"
    state = work / mode / "ctl"
    log = work / mode / "controller.log"
    state.mkdir(parents=True)
    ctl = subprocess.Popen(
        [*hp, "controller", "--reservation", res, "--nodes", "n1", "--policy", policy,
         "--interval", "1", "--round", "2", "--min-run", "5", "--grace", "60",
         "--state-dir", str(state)],
        env=env, stderr=open(log, "w"), text=True,  # noqa: SIM115
    )  # fmt: skip
    try:
        wait("the controller", lambda: "reservation" in log.read_text(), 60)
        out = work / mode / "out"
        extra = (
            [*SIDECAR, "--ckpt-dir", str(out), "--progress-regex", TQDM]
            if mode == "sidecar"
            else []
        )
        script_args = ["--plain"] if mode == "sidecar" else []
        t_submit = time.time()
        job = int(sh(env, *hp, "submit", "--pool", res, "--name", mode[:4], "--min-gpus", "1",
                     "--max-gpus", "4", "--batch-size", "32", "--max-batch-size", "256",
                     "--max-per-gpu-batch", "16", "--parsable", *extra,
                     str(REPO / "examples" / "train_transformers.py"), "--output-dir", str(out),
                     *JOB_ARGS, *script_args).strip())  # fmt: skip
        home = Path(env["HPCORCH_HOME"]) / "jobs"
        wait("the job's directory", lambda: any(home.glob(f"{mode[:4]}-*")), 60)
        jd = next(home.glob(f"{mode[:4]}-*"))
        wait("the job training", lambda: any(m.get("event") == "steps" for m in metrics(jd)), 400)
        b_args = ["--global-batch", "64", "--samples", "1024", "--epochs", "2"]
        other = int(sh(env, *hp, "submit", "--pool", res, "--name", "B", "--min-gpus", "2",
                       "--max-gpus", "2", "--batch-size", "64", "--parsable",
                       str(REPO / "examples" / "train_elastic.py"), *b_args).strip())  # fmt: skip
        store_path = state / "state.db"

        def phase(j: int) -> str:
            s = Store(store_path, readonly=True)
            try:
                rec = s.job(j)
                return rec.phase if rec else "?"
            finally:
                s.close()

        wait("B done", lambda: phase(other) == "done", 900)
        wait("the job done", lambda: phase(job) in ("done", "failed"), 1200)
        return summary(mode, store_path, job, other, metrics(jd), t_submit)
    finally:
        ctl.terminate()
        ctl.wait(30)
        subprocess.run(["scancel", f"--reservation={res}"], env=env, capture_output=True)
        time.sleep(1)
        subprocess.run(["scontrol", "delete", "reservation", res], env=env, capture_output=True)


def summary(
    mode: str, store_path: Path, job: int, other: int, lines: list[dict[str, Any]], t_submit: float
) -> dict[str, Any]:
    s = Store(store_path, readonly=True)
    rec, rec_b = s.job(job), s.job(other)
    decisions = s.decisions(job)
    samples = s.samples(job)
    s.close()
    assert rec is not None and rec_b is not None
    steps = [m for m in lines if m.get("event") == "steps"]
    trained: list[int] = []
    for m in steps:
        if not trained or trained[-1] != m["global_batch"]:
            trained.append(m["global_batch"])
    plans = []  # each plan the controller made: GPUs, batch, what the job then trained, when
    for d in decisions:
        if d.action not in ("start", "rebatch") or d.global_batch <= 0:
            continue
        hit = next((m for m in steps if m["time"] >= d.time), None)
        plans.append(
            {
                "action": d.action,
                "gpus": d.to_gpus,
                "planned": d.global_batch,
                "trained": hit["global_batch"] if hit else None,
                "first_step_s": round(hit["time"] - d.time, 1) if hit else None,
            }
        )
    resizes = [d for d in decisions if d.action == "signal" and d.detail.startswith("resize")]
    return {
        "mode": mode,
        "recorded_mode": rec.mode,
        "predictable": bool(rec.predictable),
        "throughput_samples": len(samples),
        "noise_scale_reports": sum(1 for m in steps if m.get("noise_scale") is not None),
        "plans": plans,
        "trained_batches": trained,
        "resizes": [f"{d.from_gpus}->{d.to_gpus}" for d in resizes],
        "rebatches": sum(1 for d in decisions if d.action == "rebatch"),
        "restarts": max(0, rec.launches - 1),
        "lost_steps": rec.lost_steps,
        "jct_s": round(rec.finished_at - t_submit, 1) if rec.finished_at else None,
        "other_jct_s": round(rec_b.finished_at - rec_b.submit_time, 1),
        "phase": rec.phase,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", default="share-batch")
    ap.add_argument("--modes", default="sidecar,integration")
    ap.add_argument(
        "--port-base", type=int, default=int(os.environ.get("HPCORCH_POOL_PORT", 21800))
    )
    ap.add_argument("--json", help="write the rows to this file")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hpcorch-modes-"))
    pool_dir = Path(os.environ.get("HPCORCH_POOL_DIR") or REPO / ".run" / "bench-pool")
    env = {
        **os.environ,
        "HPCORCH_POOL_DIR": str(pool_dir),
        "HPCORCH_HOME": str(work / "home"),
        "HPCORCH_SPOOL": str(work / "spool"),
        "HPCORCH_METRICS_INTERVAL": "1",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }
    sh(env, str(REPO / "slurm" / "pool"), "up", "--port-base", str(args.port_base))
    env["SLURM_CONF"] = str(pool_dir / "etc" / "slurm.conf")
    rows = []
    try:
        for mode in args.modes.split(","):
            print(f"== {mode} (policy {args.policy})", flush=True)
            rows.append(run_mode(mode, env, work, args.policy))
            print(json.dumps(rows[-1]), flush=True)
    finally:
        subprocess.run([str(REPO / "slurm" / "pool"), "down"], env=env, capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
    for r in rows:
        print(f"\n{r['mode']} (policy {args.policy})")
        for k, v in r.items():
            if k == "plans":
                for p in v:
                    print(
                        f"  plan {p['action']:<8} {p['gpus']} GPUs at {p['planned']:>4}: "
                        f"trained {p['trained']}, first step after {p['first_step_s']} s"
                    )
            elif k != "mode":
                print(f"  {k:<20} {v}")
    if args.json:
        Path(args.json).write_text(
            json.dumps({"policy": args.policy, "rows": rows}, indent=1) + "\n"
        )


if __name__ == "__main__":
    main()
