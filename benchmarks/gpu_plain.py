"""Baseline for the runtime's step times: the same GPT trained by a plain PyTorch loop.

No hpcorch: a DataLoader (pinned memory), bf16 autocast, AdamW; once on the bare model and
once wrapped in DDP (an NCCL group of one, from torchrun's variables). For every per-GPU
batch it reports, after warm-up steps:

* ``pipelined``: wall time per step over steps run back to back, one synchronisation at the
  end (what a plain script gets: the host queues the next step while the GPU runs);
* ``synced``: median wall time of one step followed by torch.cuda.synchronize();
* ``host``: median time the host spends queueing one step (a step is host-bound when this
  is as long as ``synced``);
* peak memory allocated.

    python benchmarks/gpu_plain.py --preset gpt2 --batches 1,8,64 --json plain.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from gpt_model import GPT, PRESETS, MarkovText, stacked


def measure(
    model: torch.nn.Module, preset: str, batch: int, steps: int, warmup: int, device: torch.device
) -> dict[str, Any]:
    cfg = PRESETS[preset]
    data = MarkovText(batch * (2 * steps + warmup), cfg.seq_len, cfg.vocab)
    loader = iter(DataLoader(data, batch_size=batch, collate_fn=stacked, pin_memory=True))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95))
    amp = device.type == "cuda"

    def step() -> None:
        tokens = next(loader).to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            logits = model(tokens[:, :-1])
            loss = torch.nn.functional.cross_entropy(
                logits.flatten(0, 1).float(), tokens[:, 1:].flatten().long()
            )
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def sync() -> None:
        if amp:
            torch.cuda.synchronize(device)

    if amp:
        torch.cuda.reset_peak_memory_stats(device)
    for _ in range(warmup):
        step()
    sync()
    host, synced = [], []
    for _ in range(steps):
        t0 = time.perf_counter()
        step()
        host.append(time.perf_counter() - t0)
        sync()
        synced.append(time.perf_counter() - t0)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync()
    pipelined = (time.perf_counter() - t0) / steps
    return {
        "per_gpu_batch": batch,
        "pipelined": pipelined,
        "synced": statistics.median(synced),
        "host": statistics.median(host),
        "max_memory_allocated": torch.cuda.max_memory_allocated(device) if amp else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(PRESETS), default="gpt2")
    ap.add_argument("--batches", default="1,2,4,8,16,32,64,128")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    device = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29517")
    dist.init_process_group(
        "nccl" if cuda else "gloo", rank=0, world_size=1, device_id=device if cuda else None
    )
    out: dict[str, Any] = {"preset": a.preset, "device": str(device)}
    for variant in ("plain", "ddp"):
        torch.manual_seed(0)
        model: torch.nn.Module = GPT(PRESETS[a.preset]).to(device)
        if variant == "ddp":
            model = DistributedDataParallel(model, device_ids=[device] if cuda else None)
        rows = []
        for b in (int(x) for x in a.batches.split(",")):
            try:
                rows.append(measure(model, a.preset, b, a.steps, a.warmup, device))
            except torch.OutOfMemoryError:
                rows.append({"per_gpu_batch": b, "error": "out of memory"})
                break
            r = rows[-1]
            ms = {k: f"{r[k] * 1e3:.1f} ms" for k in ("pipelined", "synced", "host")}
            print(f"{variant} batch {b}: {ms}", flush=True)
        out[variant] = rows
        del model
        if cuda:
            torch.cuda.empty_cache()
    dist.destroy_process_group()
    if a.json:
        a.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
