"""Elastic training of a GPT-style transformer on generated text, with bf16 AMP on GPUs.

A real model (examples/gpt_model.py: up to GPT-2 small's shape) on data generated at start,
so nothing is downloaded. It uses hpcorch.runtime: on SIGUSR2 it checkpoints at the next
step boundary and exits 75; started again, at any number of GPUs, it continues with exactly
the samples it had not yet seen.

    torchrun --nproc-per-node 4 examples/train_gpt.py --preset gpt2 --max-steps 2000
    hpcorch submit examples/train_gpt.py --min-gpus 1 --max-gpus 8 -- --preset gpt2

``--deterministic`` makes a run on one GPU repeatable bit for bit (and so a resumed run
identical to an uninterrupted one): deterministic kernels, cuBLAS's fixed workspace, no
TF32, and the math attention kernel (the fused ones have non-deterministic backwards).
"""

from __future__ import annotations

import argparse
import os
from dataclasses import replace
from pathlib import Path

import hpcorch.runtime as hr  # first: it holds the checkpoint signal while torch loads

# isort: split
import torch
from gpt_model import GPT, PRESETS, MarkovText, parameter_count, stacked


def make_deterministic() -> None:
    """Every setting a bitwise-repeatable run needs (call before the first CUDA kernel)."""
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


def attention_context(deterministic: bool):  # type: ignore[no-untyped-def]
    """The math SDPA kernel when deterministic (flash / memory-efficient backwards use atomic
    adds), else PyTorch's choice."""
    import contextlib

    if not deterministic:
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.MATH)


def state_for_comparison(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, object]:
    """Model and optimizer state on the CPU (to compare runs bit for bit)."""

    def cpu(x: object) -> object:
        if isinstance(x, torch.Tensor):
            return x.detach().cpu()
        if isinstance(x, dict):
            return {k: cpu(v) for k, v in x.items()}
        if isinstance(x, list | tuple):
            return type(x)(cpu(v) for v in x)
        return x

    return {"model": cpu(model.state_dict()), "optimizer": cpu(opt.state_dict())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(PRESETS), default="small")
    p.add_argument("--layers", type=int)
    p.add_argument("--d-model", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--dropout", type=float)
    p.add_argument("--samples", type=int, default=16384, help="generated sequences per epoch")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--max-steps", type=int, help="stop at this global step")
    p.add_argument("--global-batch", type=int, default=64, help="sequences per optimizer step")
    p.add_argument("--max-micro-batch", type=int, default=32, help="memory bound per GPU")
    p.add_argument("--lr", type=float, default=6e-4, help="AdamW LR at --global-batch")
    p.add_argument("--lr-scaling", default="sqrt", choices=["none", "linear", "sqrt", "adascale"])
    p.add_argument("--warmup-steps", type=int, default=20)
    p.add_argument("--amp", choices=["auto", "bf16", "off"], default="auto",
                   help="bf16 autocast (auto: on GPUs only)")  # fmt: skip
    p.add_argument("--deterministic", action="store_true", help="bitwise-repeatable kernels")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=50, help="print the loss every N steps")
    p.add_argument("--save-state", type=Path, help="rank 0 writes model + optimizer state here")
    a = p.parse_args()

    if a.deterministic:
        make_deterministic()
    overrides = {k: getattr(a, k) for k in ("layers", "d_model", "heads", "seq_len", "vocab",
                                            "dropout") if getattr(a, k) is not None}  # fmt: skip
    config = replace(PRESETS[a.preset], **overrides)
    torch.manual_seed(a.seed)
    job = hr.init(
        global_batch=a.global_batch,
        max_micro_batch=a.max_micro_batch,
        lr_scaling=a.lr_scaling,
        warmup_steps=a.warmup_steps,
        seed=a.seed,
    )
    model = job.wrap(GPT(config))
    opt = torch.optim.AdamW(model.parameters(), lr=a.lr, betas=(0.9, 0.95), weight_decay=0.1)
    total = a.max_steps or a.epochs * a.samples // a.global_batch
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=max(total, 1))
    job.track(model, opt, sched)
    data = MarkovText(a.samples, config.seq_len, config.vocab, seed=a.seed)
    cuda = job.device.type == "cuda"
    amp = a.amp == "bf16" or (a.amp == "auto" and cuda)
    job.log(
        f"rank {job.rank}/{job.world_size} on {job.device}: GPT "
        f"{parameter_count(model) / 1e6:.1f} M parameters, global batch {job.batch.describe()}, "
        f"amp {'bf16' if amp else 'off'}, "
        f"target loss {data.entropy:.3f}"
    )
    with attention_context(a.deterministic):
        for step in job.steps(
            data, epochs=a.epochs, collate_fn=stacked, pin_memory=cuda, max_steps=a.max_steps
        ):
            for tokens in step:
                tokens = tokens.to(job.device, non_blocking=True)
                with torch.autocast(job.device.type, dtype=torch.bfloat16, enabled=amp):
                    step.backward(_loss(model, tokens))
            opt.step()
            opt.zero_grad(set_to_none=True)
            sched.step()
            if a.log_every and (step.index + 1) % a.log_every == 0:
                job.log(f"step {step.index + 1}/{total}")
    if a.save_state and job.is_main:
        torch.save(state_for_comparison(model.module, opt), a.save_state)


def _loss(model: torch.nn.Module, tokens: torch.Tensor) -> torch.Tensor:
    """Next-token loss through the DDP wrapper (its forward does the gradient bookkeeping)."""
    logits = model(tokens[:, :-1])
    return torch.nn.functional.cross_entropy(
        logits.flatten(0, 1).float(), tokens[:, 1:].flatten().long()
    )


if __name__ == "__main__":
    main()
