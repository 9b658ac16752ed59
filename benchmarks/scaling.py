"""Decision time per round: 64 GPUs vs a synthetic 4096-GPU pool with 2000 active jobs.

    python benchmarks/scaling.py [--rounds 5] [--jobs 2000] [--nodes 1024] [--data DIR]
                                 [--gpu-types] [--no-length] [--policies ones,...]

``--gpu-types``: the same pools made of three GPU types (a quarter A100 and V100 nodes,
half T4), each job's measurements on the type it ran on (a running job's, else one drawn
at random), and the policies that plan types (``ones``, ``gavel``) timed on them.
``--no-length``: no job declares how long it trains (the controller's placeholders, one
epoch of one step past the current one, ``JobView.length_known`` False), and the same
policy object plans every round, so that ONES weighs the jobs against the work of those
that left the pool between rounds (each round's snapshot is a new draw: most of the
previous round's jobs have left).

Builds snapshots the way the controller would see them (jobs of the six measured
applications part-way through training, about half of them running, each reporting the
step times of the configurations it ran and its gradient statistics, plus a history of
completed jobs) and times ``schedule`` of every policy on one core: CPU time of the call
(``time.process_time``, the one-core cost whatever else shares the machine) and wall time.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np

from hpcorch.policy import POLICIES, TYPE_AWARE, make_policy
from hpcorch.policy.types import (
    CompletedJob,
    JobView,
    Snapshot,
    StepSample,
    validate_plan,
)
from hpcorch.sim.bound import packed
from hpcorch.sim.report import table
from hpcorch.sim.traces import AppTrace, default_data_dir, load_apps


def _samples(app: AppTrace, rng: np.random.Generator, per_node: int) -> tuple[StepSample, ...]:
    out = []
    for g in rng.choice([1, 2, 4, 8, 16], size=3, replace=False):
        micro = int(rng.integers(app.min_micro, app.max_micro + 1))
        counts = packed(int(g), per_node)
        st, sy = app.step_time(counts, micro)
        out.append(StepSample(len(counts), int(g), micro, st, sy))
    return tuple(out)


def synthetic(
    apps: dict[str, AppTrace], n_jobs: int, nodes: int, per_node: int, seed: int
) -> Snapshot:
    rng = np.random.default_rng(seed)
    names = sorted(apps)
    free = [per_node] * nodes
    node = 0
    jobs = []
    for i in range(n_jobs):
        app = apps[names[int(rng.integers(len(names)))]]
        epoch = int(rng.integers(0, app.epochs))
        progress = float(app.epoch_end[epoch] + rng.random() * np.diff(app.epoch_end)[epoch])
        sqr, var = app.grad_stats(app.init_batch, epoch)
        placement: dict[int, int] = {}
        want = int(rng.choice([1, 1, 2, 4, 8]))
        if rng.random() < 0.5:
            while want and node < nodes:
                take = min(want, free[node])
                if take:
                    placement[node] = take
                    free[node] -= take
                    want -= take
                if free[node] == 0:
                    node += 1
        gpus = sum(placement.values())
        if gpus and gpus * app.min_micro > app.max_batch:
            placement, gpus = {}, 0
        micro = app.min_micro
        jobs.append(
            JobView(
                job_id=f"{app.name}-{i}",
                application=app.name,
                submit_time=float(i),
                requested_gpus=int(rng.choice([1, 2, 4, 8])),
                requested_batch=app.init_batch,
                min_gpus=1,
                max_gpus=min(nodes * per_node, app.max_batch // app.min_micro),
                min_batch=app.init_batch,
                max_batch=app.max_batch,
                min_micro_batch=app.min_micro,
                max_micro_batch=app.max_micro,
                max_epochs=app.epochs,
                progress_per_epoch_hint=app.progress_per_epoch_hint,
                gpus=gpus,
                placement=placement,
                batch=micro * gpus,
                micro_batch=micro if gpus else 0,
                epoch=epoch,
                progress=progress,
                grad_sqr=sqr,
                grad_var=var,
                attained_service=float(rng.random() * 3600 * 32),
                profile=_samples(app, rng, per_node),
            )
        )
    history = []
    for k, name in enumerate(names * 20):
        app = apps[name]
        hist = tuple(app.grad_stats(app.init_batch, e) for e in range(app.epochs))
        history.append(
            CompletedJob(
                f"done-{k}",
                name,
                3600.0,
                3600.0,
                app.total_progress,
                app.epochs,
                _samples(app, rng, per_node),
                hist,
            )
        )
    return Snapshot(
        now=36000.0, node_gpus=(per_node,) * nodes, jobs=tuple(jobs), history=tuple(history)
    )


TYPES = ("a100", "v100", "t4")


def with_types(snap: Snapshot, seed: int) -> Snapshot:
    """``snap`` on a pool of three GPU types (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    n = len(snap.node_gpus)
    kinds = tuple(["a100"] * (n // 4) + ["v100"] * (n // 4) + ["t4"] * (n - n // 2))

    def measured(profile: tuple[StepSample, ...], kind: str) -> tuple[StepSample, ...]:
        return tuple(replace(s, gpu_type=kind or str(rng.choice(TYPES))) for s in profile)

    jobs = []
    for j in snap.jobs:
        kind = kinds[next(iter(j.placement))] if j.placement else ""
        if j.placement and len({kinds[k] for k in j.placement}) > 1:
            j = replace(j, gpus=0, placement={}, batch=0, micro_batch=0)  # no mixed launches
            kind = ""
        jobs.append(replace(j, profile=measured(j.profile, kind), gpu_type=kind))
    history = tuple(replace(h, profile=measured(h.profile, "")) for h in snap.history)
    return replace(snap, jobs=tuple(jobs), history=history, node_types=kinds)


def without_lengths(snap: Snapshot, seed: int) -> Snapshot:
    """``snap`` where no job declares its length, each job's ids new to this round."""
    jobs = tuple(
        replace(
            j,
            job_id=f"{j.job_id}-r{seed}",
            max_epochs=j.epoch + 1,
            progress_per_epoch_hint=1.0,
            length_known=False,
        )
        for j in snap.jobs
    )
    return replace(snap, jobs=jobs, now=snap.now + 60.0 * seed)


def time_policy(name: str, snaps: list[Snapshot]) -> tuple[float, float, float]:
    """(mean CPU ms, max CPU ms, mean wall ms) of ``schedule`` over the snapshots."""
    policy = make_policy(name, 0)
    cpu, wall = [], []
    for snap in snaps:
        t0, w0 = time.process_time(), time.perf_counter()
        plan = policy.schedule(snap)
        cpu.append(time.process_time() - t0)
        wall.append(time.perf_counter() - w0)
        validate_plan(snap, plan)
    return float(np.mean(cpu) * 1000), float(np.max(cpu) * 1000), float(np.mean(wall) * 1000)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--jobs", type=int, default=2000)
    ap.add_argument("--nodes", type=int, default=1024)
    ap.add_argument("--data", type=Path, default=None)
    ap.add_argument("--gpu-types", action="store_true", help="pools of three GPU types")
    ap.add_argument("--no-length", action="store_true", help="no job declares its length")
    ap.add_argument("--policies", default="", help="comma-separated (default: all)")
    args = ap.parse_args()
    apps = load_apps(args.data or default_data_dir())
    cases = [
        ("64 GPUs, 40 jobs", 16, 40),
        (f"{args.nodes * 4} GPUs, {args.jobs} jobs", args.nodes, args.jobs),
    ]
    rows = []
    for label, nodes, n_jobs in cases:
        snaps = [synthetic(apps, n_jobs, nodes, 4, seed) for seed in range(args.rounds)]
        names: list[str] = list(POLICIES)
        if args.gpu_types:
            snaps = [with_types(s, seed) for seed, s in enumerate(snaps)]
            label += ", 3 GPU types"
            names = sorted(TYPE_AWARE)
        if args.no_length:
            snaps = [without_lengths(s, seed) for seed, s in enumerate(snaps)]
            label += ", no lengths"
        if args.policies:
            names = [n for n in names if n in args.policies.split(",")]
        for name in names:
            mean, worst, wall = time_policy(name, snaps)
            rows.append([label, name, mean, worst, wall])
            print(f"{label} {name}: {mean:.1f} ms", file=sys.stderr, flush=True)
    print(table(["pool", "policy", "CPU ms (mean)", "CPU ms (max)", "wall ms (mean)"], rows))


if __name__ == "__main__":
    main()
