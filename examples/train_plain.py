"""A plain torchrun-style DDP script with its own checkpoints; it knows nothing of hpcorch.

It checkpoints to --ckpt-dir every --ckpt-every steps, and at the next step after SIGTERM,
then exits; `--resume PATH` continues from a checkpoint at any world size. It prints
`step N/TOTAL loss X` on rank 0. Under hpcorch it runs in sidecar mode:

    hpcorch submit --min-gpus 2 --max-gpus 4 \\
        --ckpt-dir ckpt --resume-arg '--resume {ckpt}' --progress-regex 'step (\\d+)/(\\d+)' \\
        examples/train_plain.py --ckpt-dir ckpt --steps 2000
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
from types import FrameType

stop = False


def on_term(signum: int, frame: FrameType | None) -> None:
    global stop
    stop = True


def main() -> None:
    signal.signal(signal.SIGTERM, on_term)  # first: a stop while torch loads is not lost
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=400)
    p.add_argument("--per-gpu-batch", type=int, default=32)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--samples", type=int, default=8192)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ckpt-dir", default="checkpoints")
    p.add_argument("--ckpt-every", type=int, default=50)
    p.add_argument("--ckpt-until", type=int, default=0, help="no periodic checkpoint after")
    p.add_argument("--resume", default=None, help="checkpoint to continue from")
    p.add_argument("--step-delay", type=float, default=0.0, help="seconds of extra work/step")
    p.add_argument("--ignore-signals", action="store_true", help="ignore SIGTERM (a bad script)")
    args = p.parse_args()
    if args.ignore_signals:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)

    import torch
    from toy_training import finish, save_atomic, setup

    toy = setup(args.per_gpu_batch, args.lr, args.samples, args.seed)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    first = 0
    if args.resume:
        first = toy.load(torch.load(args.resume, weights_only=False))
        if toy.rank == 0:
            print(f"resumed from {args.resume} at step {first}", flush=True)

    def save(step: int) -> None:
        if toy.rank == 0:
            save_atomic(toy.state(step), os.path.join(args.ckpt_dir, f"ckpt-{step:07d}.pt"))
            for old in sorted(glob.glob(os.path.join(args.ckpt_dir, "ckpt-*.pt")))[:-2]:
                os.remove(old)
        toy.barrier()

    for step, loss in toy.steps(first, args.steps, args.step_delay):
        if toy.rank == 0:
            print(f"step {step}/{args.steps} loss {loss:.4f} world {toy.world}", flush=True)
        stopping = toy.any_rank(stop)
        periodic = step % args.ckpt_every == 0 and not 0 < args.ckpt_until < step
        if stopping or periodic or step == args.steps:
            save(step)
        if stopping:
            if toy.rank == 0:
                print(f"SIGTERM: checkpointed at step {step}, exiting", flush=True)
            return
    finish(toy, lambda m: print(m, flush=True) if toy.rank == 0 else None)


if __name__ == "__main__":
    main()
