"""Benchmark: signal -> checkpoint written -> processes exited, and cold relaunch -> first step.

For the example model and for a ~100 MB model (3 layers of width 3500: 98 MB of float32
weights; SGD momentum doubles the checkpoint), on local gloo ranks started torchrun-style:

1. start 2 ranks, let them train a few steps, send the checkpoint signal to every rank at
   t0; report t(checkpoint renamed into place) - t0 and t(last process exited) - t0;
2. relaunch the job at a new size (1 rank) from that checkpoint and report process start ->
   first finished step, split into interpreter + torch import, process-group set-up,
   checkpoint load and the rest;
3. baselines measured in this process: torch.save + fsync of the same state (the floor for
   the checkpoint), and a cold `python -c "import torch"` (the floor for a relaunch).

    python benchmarks/runtime_checkpoint.py [--reps 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "train_elastic.py"
MODELS = {
    "example": ["--hidden", "64", "--layers", "1"],
    "100MB": ["--hidden", "3500", "--layers", "3"],  # 24.6 M float32 parameters = 98 MB
}
COMMON = ["--epochs", "50", "--samples", "8192", "--global-batch", "64", "--max-micro-batch", "32"]


def events(job_dir: Path, kind: str) -> list[dict[str, object]]:
    path = job_dir / "metrics.jsonl"
    if not path.exists():
        return []
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if r.get("event") == kind]


def start(world: int, job_dir: Path, model: str) -> list[subprocess.Popen[bytes]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for rank in range(world):
        env = dict(os.environ, PYTHONPATH=str(REPO), HPCORCH_JOB_DIR=str(job_dir),
                   HPCORCH_METRICS_INTERVAL="0", GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1",
                   RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank),
                   LOCAL_WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT=str(port))  # fmt: skip
        cmd = [sys.executable, str(EXAMPLE), *COMMON, *MODELS[model]]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL))
    return procs


def wait_until(cond, timeout: float = 300.0) -> None:  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > end:
            raise TimeoutError
        time.sleep(0.005)


def stop(procs: list[subprocess.Popen[bytes]], job_dir: Path) -> dict[str, float]:
    """Signal every rank; time the checkpoint and the exit of the last process."""
    n_ckpt = len(events(job_dir, "checkpoint"))
    t0 = time.time()
    for p in procs:
        p.send_signal(signal.SIGUSR2)
    codes = [p.wait() for p in procs]
    t_exit = time.time()
    assert codes == [75] * len(procs), codes
    ck = events(job_dir, "checkpoint")[n_ckpt]
    before = [e for e in events(job_dir, "steps") if float(e["time"]) <= t0]  # type: ignore[arg-type]
    return {
        "step_s": float(before[-1]["step_time"]) if before else float("nan"),  # type: ignore[arg-type]
        "written_s": float(ck["written_time"]) - t0,  # type: ignore[arg-type]
        "write_s": float(ck["seconds"]),  # type: ignore[arg-type]
        "exited_s": t_exit - t0,
        "bytes": float(ck["bytes"]),  # type: ignore[arg-type]
    }


def floor_save(nbytes_model: str) -> float:
    """torch.save + fsync of a state of the same shape, best of 3 (the floor for a checkpoint)."""
    import torch

    hidden, layers = int(MODELS[nbytes_model][1]), int(MODELS[nbytes_model][3])
    sys.argv = [str(EXAMPLE)]
    sys.path.insert(0, str(REPO / "examples"))
    from train_elastic import make_model

    model = make_model(20, hidden, layers, 4, 0.1)  # the example's defaults
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(4, 20)).sum().backward()
    opt.step()
    state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
    best = float("inf")
    with tempfile.TemporaryDirectory(prefix="hpcorch-bench-floor-") as d:
        for i in range(3):  # best of 3, next to where the runs wrote their checkpoints
            t0 = time.perf_counter()
            with open(Path(d) / f"x{i}.pt", "wb") as f:
                torch.save(state, f)
                f.flush()
                os.fsync(f.fileno())
            best = min(best, time.perf_counter() - t0)
    return best


def cold_import_torch() -> float:
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import torch"], check=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--models", default="example,100MB")
    ap.add_argument("--report", type=Path, help="only print the tables of a saved --json")
    a = ap.parse_args()
    if a.report:
        report(json.loads(a.report.read_text()))
        return
    results: dict[str, list[dict[str, float]]] = {}
    base = Path(tempfile.mkdtemp(prefix="hpcorch-bench-"))
    for model in a.models.split(","):
        for rep in range(a.reps):
            jd = base / f"{model}-{rep}"
            procs = start(2, jd, model)
            wait_until(lambda jd=jd: len(events(jd, "steps")) >= 3)
            row = stop(procs, jd)
            t_launch = time.time()
            procs = start(1, jd, model)  # relaunch at a new size
            wait_until(lambda jd=jd: len(events(jd, "first_step")) >= 2)
            first = events(jd, "first_step")[-1]
            st = events(jd, "start")[-1]
            row.update(
                relaunch_first_step_s=float(first["since_start"]),  # type: ignore[arg-type]
                relaunch_wall_s=float(first["time"]) - t_launch,  # type: ignore[arg-type]
                # process start -> hpcorch.runtime imported, then its import of torch
                start_s=float(st["since_start_at_import"]),  # type: ignore[arg-type]
                torch_s=float(st["torch_import_seconds"]),  # type: ignore[arg-type]
                pg_init_s=float(st["pg_init_seconds"]),  # type: ignore[arg-type]
                load_s=float(st.get("checkpoint_load_seconds", 0.0)),  # type: ignore[arg-type]
                ddp_s=float(st.get("ddp_wrap_seconds", 0.0)),  # type: ignore[arg-type]
            )
            row.update({f"1rank_{k}": v for k, v in stop(procs, jd).items() if k != "bytes"})
            results.setdefault(model, []).append(row)
            print(f"{model} rep {rep}: " + ", ".join(f"{k}={v:.3f}" for k, v in row.items()
                                                    if k != "bytes"), flush=True)  # fmt: skip
    floors = {m: floor_save(m) for m in results}
    imp = min(cold_import_torch() for _ in range(3))
    data = {"reps": a.reps, "results": results, "save_floor_s": floors, "cold_import_torch_s": imp}
    if a.json:
        a.json.write_text(json.dumps(data, indent=1))
    report(data)


def med(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[len(xs) // 2]


def report(data: dict) -> None:  # type: ignore[type-arg]
    results, floors = data["results"], data["save_floor_s"]
    print(
        f"\nmedian of {data['reps']} runs; 2 gloo ranks on {os.cpu_count()} cores; "
        f"cold `python -c 'import torch'` (best of 3): {data['cold_import_torch_s']:.2f} s\n"
    )
    print(
        "| model | checkpoint | step time | signal->written | signal->exited (2 ranks) "
        "| signal->exited (1 rank) | checkpoint write | torch.save+fsync alone | write / save |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for m, rows in results.items():

        def q(key: str, rows: list[dict[str, float]] = rows) -> float:
            return med([r[key] for r in rows])

        print(
            f"| {m} | {rows[0]['bytes'] / 1e6:.2f} MB | {q('step_s'):.3f} s "
            f"| {q('written_s'):.3f} s | {q('exited_s'):.3f} s | {q('1rank_exited_s'):.3f} s "
            f"| {q('write_s'):.3f} s | {floors[m]:.3f} s | {q('write_s') / floors[m]:.1f}x |"
        )
    print(
        "\n| model | relaunch (1 rank): start -> first step | interpreter start | import torch "
        "| process group | checkpoint load | DDP construction | rest (model, data, step) "
        "| torch import + process group share |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for m, rows in results.items():

        def q(key: str, rows: list[dict[str, float]] = rows) -> float:
            return med([r[key] for r in rows])

        fs, st, im, pg = q("relaunch_first_step_s"), q("start_s"), q("torch_s"), q("pg_init_s")
        ld, dd = q("load_s"), q("ddp_s")
        rest = fs - st - im - pg - ld - dd
        print(
            f"| {m} | {fs:.2f} s | {st:.2f} s | {im:.2f} s | {pg:.3f} s | {ld:.3f} s "
            f"| {dd:.2f} s | {rest:.2f} s | {(im + pg) / fs:.0%} |"
        )


if __name__ == "__main__":
    main()
