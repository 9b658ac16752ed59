"""A script that follows PyTorch Lightning's Slurm convention, without Lightning.

On SIGUSR1 (Lightning's `--signal=SIGUSR1@90` convention) it saves `hpc_ckpt_N.ckpt` in
--root-dir at the next step, rank 0 asks Slurm to requeue its own job (`scontrol requeue
$SLURM_JOB_ID`), and it exits; at start it resumes from the newest `hpc_ckpt_N.ckpt`, as
Lightning does. It logs progress as JSON lines to ROOT/progress.jsonl, like a logger. Under
hpcorch it runs in sidecar mode with the stop signal USR1:

    hpcorch submit --min-gpus 2 --max-gpus 4 --stop-signal USR1 --ckpt-dir root \\
        --progress-file root/progress.jsonl examples/train_lightning_style.py --root-dir root
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import signal
import subprocess
from types import FrameType

usr1 = False


def on_usr1(signum: int, frame: FrameType | None) -> None:
    global usr1
    usr1 = True


def newest_hpc_ckpt(root: str) -> str | None:
    found = [
        (int(m.group(1)), path)
        for path in glob.glob(os.path.join(root, "hpc_ckpt_*.ckpt"))
        if (m := re.search(r"hpc_ckpt_(\d+)\.ckpt$", path))
    ]
    return max(found)[1] if found else None


def main() -> None:
    signal.signal(signal.SIGUSR1, on_usr1)  # first: a signal while torch loads is not lost
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root-dir", default="lightning_root")
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--per-gpu-batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=5)
    p.add_argument("--step-delay", type=float, default=0.0)
    args = p.parse_args()

    import torch
    from toy_training import finish, save_atomic, setup

    toy = setup(args.per_gpu_batch, args.lr, args.samples, args.seed)
    os.makedirs(args.root_dir, exist_ok=True)
    first = 0
    ckpt = newest_hpc_ckpt(args.root_dir)
    if ckpt:
        first = toy.load(torch.load(ckpt, weights_only=False))
    progress = open(os.path.join(args.root_dir, "progress.jsonl"), "a")  # noqa: SIM115
    for step, loss in toy.steps(first, args.max_steps, args.step_delay):
        if toy.rank == 0 and (step % args.log_every == 0 or step == args.max_steps):
            progress.write(json.dumps({"step": step, "total": args.max_steps, "loss": loss}) + "\n")
            progress.flush()
        if toy.any_rank(usr1):
            if toy.rank == 0:
                n = int(re.findall(r"\d+", ckpt or "hpc_ckpt_0")[-1]) + 1
                save_atomic(toy.state(step), os.path.join(args.root_dir, f"hpc_ckpt_{n}.ckpt"))
                print(f"SIGUSR1: saved hpc_ckpt_{n}.ckpt at step {step}; requeueing", flush=True)
                subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], check=False)
            toy.barrier()
            return
    finish(toy, lambda m: print(m, flush=True) if toy.rank == 0 else None)


if __name__ == "__main__":
    main()
