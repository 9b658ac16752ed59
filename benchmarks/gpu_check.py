"""GPU check of the runtime: NCCL, exact resume, step time and memory, checkpoints, sidecar.

Runs on one CUDA GPU without Slurm: every training process is started torchrun-style
(RANK=0, WORLD_SIZE=1, MASTER_ADDR/PORT), so the runtime forms an NCCL group of one. The
phases (each its own processes, results written to --json after every phase):

* env        the device, driver, torch, CUDA and NCCL versions;
* resume     examples/train_gpt.py with --deterministic (small preset, bf16 AMP, dropout):
             an uninterrupted run against one stopped by SIGUSR2 (safe-point checkpoint,
             exit 75) and relaunched; parameters and AdamW state compared bit for bit;
             once more without the determinism settings (how close the default kernels are);
* sweep      the gpt2 preset (92 M parameters) at per-GPU batch 1..128: the step time the
             runtime reports, the wall time per step, peak memory; then what
             hpcorch/model/throughput.py predicts from the first 2 or 3 measurements;
* checkpoint gpt2 preset: signal -> checkpoint written -> exited, twice, and each relaunch's
             restore time and start -> first step, against torch.save+fsync / torch.load;
* old_timing the same sweep points with the runtime of --old-runtime (a checkout without
             the step-time fix) to show what it reported;
* sidecar    python -m hpcorch.sidecar around examples/train_lightning.py (real Lightning,
             unmodified): stop on the controller's signal, resume from Lightning's hpc ckpt.

    python benchmarks/gpu_check.py --json benchmarks/results/gpu_h100.json
    python benchmarks/gpu_check.py --cpu --json /tmp/check.json   # tiny sizes, gloo, no GPU
    python benchmarks/gpu_check.py --report benchmarks/results/gpu_h100.json

Without CUDA (and without --cpu) it says so and exits 0.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import platform
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gpu_report import DETERMINISM, _fmt_point, compare_states, model_fit, report

REPO = Path(__file__).resolve().parents[1]
GPT = REPO / "examples" / "train_gpt.py"
LIGHTNING = REPO / "examples" / "train_lightning.py"
PLAIN = REPO / "benchmarks" / "gpu_plain.py"
PHASES = ("env", "resume", "sweep", "plain", "checkpoint", "old_timing", "sidecar")

# fmt: off
GPU = {
    "resume": ["--preset", "small", "--samples", "4096", "--global-batch", "32",
               "--max-micro-batch", "32", "--max-steps", "60"],
    "resume_stop_at": 20,
    "sweep": ["--preset", "gpt2"],
    "sweep_batches": [1, 2, 4, 8, 16, 32, 64, 128],
    "sweep_steps": 25,
    "warmup_steps": 5,
    "checkpoint": ["--preset", "gpt2", "--samples", "2048", "--global-batch", "32",
                   "--max-micro-batch", "32"],
    "old_batches": [8, 64],
    "lightning": ["--preset", "small", "--max-steps", "300", "--batch-size", "32"],
    "lightning_stop_at": 60,
    "timeout": 300,
}
CPU = {
    "resume": ["--preset", "tiny", "--samples", "512", "--global-batch", "16",
               "--max-micro-batch", "8", "--max-steps", "24"],
    "resume_stop_at": 8,
    "sweep": ["--preset", "tiny"],
    "sweep_batches": [1, 2, 4, 8],
    "sweep_steps": 8,
    "warmup_steps": 2,
    "checkpoint": ["--preset", "tiny", "--samples", "512", "--global-batch", "16",
                   "--max-micro-batch", "16"],
    "old_batches": [4],
    "lightning": ["--preset", "tiny", "--max-steps", "60", "--samples", "512",
                  "--log-every", "2"],
    "lightning_stop_at": 10,
    "timeout": 600,
}
# fmt: on


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Runner:
    """Starts training processes torchrun-style (one rank) with their own job directories."""

    def __init__(self, work: Path, cfg: dict[str, Any]) -> None:
        self.work, self.cfg = work, cfg
        (work / "logs").mkdir(parents=True, exist_ok=True)

    def env(self, job_dir: Path, pythonpath: Path = REPO, **extra: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "HPCORCH_"))}
        env.update(
            PYTHONPATH=str(pythonpath),
            HPCORCH_JOB_DIR=str(job_dir),
            HPCORCH_METRICS_INTERVAL="0",
            RANK="0",
            WORLD_SIZE="1",
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(free_port()),
            CUBLAS_WORKSPACE_CONFIG=":4096:8",
            PYTHONUNBUFFERED="1",
        )
        env.update(extra)
        return env

    def start(self, name: str, cmd: list[str], env: dict[str, str]) -> subprocess.Popen[bytes]:
        log = open(self.work / "logs" / f"{name}.log", "ab")  # noqa: SIM115
        log.write(f"$ {' '.join(cmd)}\n".encode())
        log.flush()
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT)

    def gpt(self, name: str, job: Path, args: list[str], pythonpath: Path = REPO) -> Any:
        return self.start(name, [sys.executable, str(GPT), *args], self.env(job, pythonpath))

    def wait(self, name: str, proc: subprocess.Popen[bytes], expect: int | None = 0) -> int:
        try:
            code = proc.wait(timeout=self.cfg["timeout"])
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            code = -9
        if expect is not None and code != expect:
            tail = (self.work / "logs" / f"{name}.log").read_text(errors="replace")[-3000:]
            raise RuntimeError(f"{name}: exit code {code}, expected {expect}; log tail:\n{tail}")
        return code


def events(job: Path, kind: str | None = None) -> list[dict[str, Any]]:
    path = job / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):  # a line being written
            rows.append(json.loads(line))
    return [r for r in rows if kind is None or r.get("event") == kind]


def wait_for(cond: Callable[[], bool], proc: subprocess.Popen[bytes], timeout: float) -> None:
    end = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            raise RuntimeError(f"the process ended (exit {proc.returncode}) before the signal")
        if time.monotonic() > end:
            raise TimeoutError("waited too long")
        time.sleep(0.02)


def last_step(job: Path) -> int:
    steps = events(job, "steps")
    return int(steps[-1]["step"]) if steps else -1


def signal_at(r: Runner, name: str, proc: Any, job: Path, step: int) -> dict[str, float]:
    """SIGUSR2 once the job has reached ``step``; time the checkpoint and the exit."""
    wait_for(lambda: last_step(job) >= step, proc, r.cfg["timeout"])
    n = len(events(job, "checkpoint"))
    t0 = time.time()
    proc.send_signal(signal.SIGUSR2)
    r.wait(name, proc, expect=75)
    t_exit = time.time()
    ck = events(job, "checkpoint")[n]
    return {
        "step": ck["step"],
        "bytes": ck["bytes"],
        "write_seconds": ck["seconds"],
        "signal_to_written": ck["written_time"] - t0,
        "signal_to_exited": t_exit - t0,
    }


# --- phases -------------------------------------------------------------------------------
def phase_env(r: Runner, cpu: bool) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
    }
    if torch.cuda.is_available() and not cpu:
        props = torch.cuda.get_device_properties(0)
        out.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            multiprocessors=props.multi_processor_count,
            capability=f"{props.major}.{props.minor}",
            nccl=_version(torch.cuda.nccl.version()),
        )
        try:
            query = ["--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]
            smi = subprocess.run(
                ["nvidia-smi", *query], capture_output=True, text=True, timeout=30, check=True
            ).stdout.strip()
            out["nvidia_smi"] = smi
        except (OSError, subprocess.SubprocessError):
            pass
    try:
        import lightning

        out["lightning"] = lightning.__version__
    except ImportError:
        out["lightning"] = None
    return out


def _version(v: Any) -> str:
    return ".".join(map(str, v)) if isinstance(v, tuple | list) else str(v)


def phase_resume(r: Runner, deterministic: bool) -> dict[str, Any]:
    tag = "det" if deterministic else "default"
    args = [*r.cfg["resume"], *(["--deterministic"] if deterministic else [])]
    ja, jb = r.work / f"resume-{tag}-a", r.work / f"resume-{tag}-b"
    sa, sb = r.work / f"resume-{tag}-a.pt", r.work / f"resume-{tag}-b.pt"
    t0 = time.time()
    r.wait(f"resume-{tag}-a", r.gpt(f"resume-{tag}-a", ja, [*args, "--save-state", str(sa)]))
    proc = r.gpt(f"resume-{tag}-b", jb, [*args, "--save-state", str(sb)])
    stop = signal_at(r, f"resume-{tag}-b", proc, jb, r.cfg["resume_stop_at"])
    r.wait(f"resume-{tag}-b2", r.gpt(f"resume-{tag}-b2", jb, [*args, "--save-state", str(sb)]))
    start = events(ja, "start")[0]
    resumed = [e for e in events(jb, "start") if e["resumed"]]
    out = {
        "args": args,
        "deterministic": deterministic,
        "settings": DETERMINISM if deterministic else "PyTorch's defaults",
        "backend": start["backend"],
        "launcher": start["launcher"],
        "pg_init_seconds": start.get("pg_init_seconds"),
        "stopped_at_step": stop["step"],
        "resumed_at_step": resumed[0]["step"] if resumed else None,
        "final_step": events(jb, "done")[-1]["step"],
        "losses_equal": [e["loss"] for e in events(ja, "steps")][-5:]
        == [e["loss"] for e in events(jb, "steps")][-5:],
        "seconds": round(time.time() - t0, 1),
        **compare_states(sa, sb),
    }
    return out


def steady(job: Path, warmup: int) -> dict[str, Any]:
    """Median runtime step time and wall time per step after the warm-up steps."""
    rows = [e for e in events(job, "steps") if e["step"] > warmup]
    wall = [b["time"] - a["time"] for a, b in itertools.pairwise(rows)]
    return {
        "step_time": statistics.median(e["step_time"] for e in rows),
        "wall_per_step": statistics.median(wall) if wall else None,
        "samples_per_s": statistics.median(e["samples_per_s"] for e in rows),
        "data_wait": statistics.median(e.get("data_wait", 0.0) for e in rows),
        "max_memory_allocated": rows[-1].get("max_memory_allocated"),
        "max_memory_reserved": rows[-1].get("max_memory_reserved"),
        "steps_measured": len(rows),
    }


def sweep_point(r: Runner, b: int, pythonpath: Path, tag: str) -> dict[str, Any]:
    steps = r.cfg["sweep_steps"]
    job = r.work / f"{tag}-{b}"
    args = [
        *r.cfg["sweep"],
        "--global-batch",
        str(b),
        "--max-micro-batch",
        str(b),
        "--samples",
        str(max(b * (steps + 1), 64)),
        "--max-steps",
        str(steps),
        "--log-every",
        "0",
    ]
    proc = r.gpt(f"{tag}-{b}", job, args, pythonpath)
    code = r.wait(f"{tag}-{b}", proc, expect=None)
    if code != 0:
        log = (r.work / "logs" / f"{tag}-{b}.log").read_text(errors="replace")
        return {"per_gpu_batch": b, "error": "out of memory" if "OutOfMemory" in log else code}
    return {"per_gpu_batch": b, **steady(job, r.cfg["warmup_steps"])}


def phase_sweep(r: Runner) -> dict[str, Any]:
    points = []
    for b in r.cfg["sweep_batches"]:
        p = sweep_point(r, b, REPO, "sweep")
        say(f"  per-GPU batch {b}: {_fmt_point(p)}")
        points.append(p)
        if "error" in p:
            break
    return {"args": r.cfg["sweep"], "points": points, "model_fit": model_fit(points)}


def phase_plain(r: Runner) -> dict[str, Any]:
    """The same model in a plain PyTorch loop, bare and in DDP (benchmarks/gpu_plain.py)."""
    out = r.work / "plain.json"
    preset = r.cfg["sweep"][1]
    batches = ",".join(map(str, r.cfg["sweep_batches"]))
    cmd = [sys.executable, str(PLAIN), "--preset", preset, "--batches", batches, "--json", str(out)]
    r.wait("plain", r.start("plain", cmd, r.env(r.work / "plain-job")))
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def phase_old_timing(r: Runner, old: Path) -> dict[str, Any]:
    points = [sweep_point(r, b, old, "old") for b in r.cfg["old_batches"]]
    for p in points:
        say(f"  old runtime, per-GPU batch {p['per_gpu_batch']}: {_fmt_point(p)}")
    return {"runtime": str(old), "points": points}


def phase_checkpoint(r: Runner) -> dict[str, Any]:
    import torch

    job = r.work / "ckpt"
    args = [*r.cfg["checkpoint"], "--log-every", "0"]
    stops = []
    proc = r.gpt("ckpt-0", job, args)
    stops.append(signal_at(r, "ckpt-0", proc, job, 10))
    proc = r.gpt("ckpt-1", job, args)
    stops.append(signal_at(r, "ckpt-1", proc, job, stops[-1]["step"] + 5))
    final = stops[-1]["step"] + 5
    r.wait("ckpt-2", r.gpt("ckpt-2", job, [*args, "--max-steps", str(final)]))
    starts = events(job, "start")
    firsts = events(job, "first_step")
    relaunches = []
    for s, f in zip(starts[1:], firsts[1:], strict=True):
        relaunches.append(
            {
                k: s.get(k)
                for k in (
                    "step",
                    "checkpoint_load_seconds",
                    "torch_import_seconds",
                    "pg_init_seconds",
                    "ddp_wrap_seconds",
                    "since_start_at_init",
                )
            }
            | {"start_to_first_step": f["since_start"]}
        )
    # baselines in this process: torch.save + fsync and torch.load of the same file
    newest = sorted((job / "checkpoints").glob("ckpt-*.pt"))[-1]
    t0 = time.perf_counter()
    state = torch.load(newest, map_location="cpu", weights_only=True)
    load_s = time.perf_counter() - t0
    copy = r.work / "baseline.pt"
    t0 = time.perf_counter()
    with open(copy, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    save_s = time.perf_counter() - t0
    copy.unlink()
    return {
        "args": args,
        "stops": stops,
        "relaunches": relaunches,
        "baseline_save_fsync_seconds": save_s,
        "baseline_load_seconds": load_s,
    }


def phase_sidecar(r: Runner) -> dict[str, Any]:
    try:
        import lightning  # noqa: F401
    except ImportError:
        return {"skipped": "lightning is not installed"}
    job, root = r.work / "sidecar-job", r.work / "sidecar-root"
    root.mkdir(parents=True, exist_ok=True)
    # what srun gives a task; `env` stands in for srun (there is no Slurm here)
    task = [
        "env",
        "SLURM_JOB_ID=4242",
        "SLURM_NTASKS=1",
        "SLURM_PROCID=0",
        "SLURM_LOCALID=0",
        "SLURM_NODEID=0",
        "SLURM_JOB_NAME=train",
    ]
    script = [str(LIGHTNING), "--root-dir", str(root), *r.cfg["lightning"]]
    out: dict[str, Any] = {"script": script}
    for launch in (0, 1):
        env = r.env(
            job,
            HPCORCH_LAUNCH=str(launch),
            HPCORCH_STOP_SIGNAL="USR1",
            HPCORCH_STOP_GRACE="60",
            HPCORCH_SCRIPT_CKPT_DIR=str(root),
            HPCORCH_PROGRESS_REGEX=r"step (\d+)/(\d+)",
            HPCORCH_METRICS_INTERVAL="1",
            HPCORCH_CONTROLLED="1",
            HPCORCH_PYTHON=sys.executable,
        )
        cmd = [sys.executable, "-m", "hpcorch.sidecar", str(len(task)), *task, sys.executable]
        t0 = time.time()
        proc = r.start(f"sidecar-{launch}", [*cmd, *script], env)
        if launch == 0:

            def progressed() -> bool:
                rows = events(job, "steps")
                return bool(rows) and rows[-1].get("step", 0) >= r.cfg["lightning_stop_at"]

            wait_for(progressed, proc, r.cfg["timeout"])
            t_sig = time.time()
            proc.send_signal(signal.SIGUSR2)  # the controller's resize
            r.wait("sidecar-0", proc, expect=75)
            out["signal_to_exit"] = time.time() - t_sig
        else:
            r.wait("sidecar-1", proc, expect=0)
        out[f"launch{launch}_seconds"] = time.time() - t0
    ev = events(job)
    stop = [e for e in ev if e["event"] == "stop"]
    out["stop"] = stop[0] if stop else None
    out["resumed"] = next((e for e in ev if e["event"] == "resumed"), None)
    out["step_lines"] = [
        {k: e.get(k) for k in ("launch", "step", "step_time", "gpus")}
        for e in ev
        if e["event"] == "steps"
    ][-3:]
    out["hpc_checkpoints"] = sorted(p.name for p in root.glob("hpc_ckpt_*.ckpt"))
    log = "".join((r.work / "logs" / f"sidecar-{i}.log").read_text() for i in (0, 1))
    out["log_lines"] = [x for x in log.splitlines() if "hpcorch-sidecar" in x or "requeu" in x]
    out["finished"] = f"step {r.cfg['lightning'][3]}/" in log
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, help="write the results here (after every phase)")
    ap.add_argument("--cpu", action="store_true", help="tiny sizes on CPUs (gloo): for testing")
    ap.add_argument("--phases", default=",".join(PHASES), help=f"of {', '.join(PHASES)}")
    ap.add_argument("--old-runtime", type=Path, help="a checkout whose hpcorch/ old_timing uses")
    ap.add_argument("--sweep-batches", help="per-GPU batches of sweep and plain, e.g. 1,8,64")
    ap.add_argument("--old-batches", help="per-GPU batches of old_timing")
    ap.add_argument("--work", type=Path, help="scratch directory (default: a temporary one)")
    ap.add_argument("--report", type=Path, help="print the tables of a results file and exit")
    a = ap.parse_args()
    if a.report:
        print(report(json.loads(a.report.read_text())))
        return 0
    import torch

    if not a.cpu and not torch.cuda.is_available():
        print("gpu_check: no CUDA device: skipped (use --cpu for a tiny run on CPUs)")
        return 0
    phases = [p.strip() for p in a.phases.split(",") if p.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        print(
            f"gpu_check: unknown phase(s) {sorted(unknown)}; valid: {', '.join(PHASES)}",
            file=sys.stderr,
        )
        return 2
    work = a.work or Path(tempfile.mkdtemp(prefix="gpu-check-"))
    cfg = dict(CPU if a.cpu else GPU)
    for key, value in (("sweep_batches", a.sweep_batches), ("old_batches", a.old_batches)):
        if value:
            cfg[key] = [int(x) for x in value.split(",")]
    r = Runner(work, cfg)
    res: dict[str, Any] = {"config": "cpu" if a.cpu else "gpu", "work": str(work)}
    t_all = time.time()
    failed = 0
    for name in phases:
        if name == "old_timing" and a.old_runtime is None:
            continue
        say(f"phase {name}")
        t0 = time.time()
        try:
            if name == "env":
                res[name] = phase_env(r, a.cpu)
            elif name == "resume":
                res["resume"] = phase_resume(r, deterministic=True)
                keys = ("backend", "stopped_at_step", "identical", "bitwise_equal", "tensors")
                say(f"  deterministic: {json.dumps({k: res['resume'][k] for k in keys})}")
                res["resume_default_kernels"] = phase_resume(r, deterministic=False)
                d = res["resume_default_kernels"]
                diff = d["max_abs_diff"]
                say(f"  default kernels: identical {d['identical']}, max diff {diff:.3g}")
            elif name == "sweep":
                res[name] = phase_sweep(r)
            elif name == "checkpoint":
                res[name] = phase_checkpoint(r)
                say(f"  {json.dumps(res[name]['stops'])}")
            elif name == "plain":
                res[name] = phase_plain(r)
            elif name == "old_timing":
                res[name] = phase_old_timing(r, a.old_runtime)
            elif name == "sidecar":
                res[name] = phase_sidecar(r)
                s = res[name]
                say(f"  stop {json.dumps(s.get('stop'))}; resumed {json.dumps(s.get('resumed'))}")
        except Exception as e:
            failed += 1
            res[name] = {"error": f"{type(e).__name__}: {e}"}
            say(f"  FAILED: {e}")
        res.setdefault("phase_seconds", {})[name] = round(time.time() - t0, 1)
        res["total_seconds"] = round(time.time() - t_all, 1)
        if a.json:
            a.json.parent.mkdir(parents=True, exist_ok=True)
            a.json.write_text(json.dumps(res, indent=1) + "\n")
    print(report(res))
    say(f"done in {time.time() - t_all:.0f} s; {failed} phase(s) failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
