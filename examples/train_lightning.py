"""A plain PyTorch Lightning script (the GPT of examples/gpt_model.py); it knows nothing of
hpcorch and needs `pip install lightning`.

It follows Lightning's own Slurm convention: on SIGUSR1 Lightning saves
``hpc_ckpt_N.ckpt`` in --root-dir and asks Slurm to requeue the job, and at start it resumes
from the newest one. It prints ``step N/TOTAL loss X`` every --log-every steps. Under hpcorch
it runs in sidecar mode:

    hpcorch submit examples/train_lightning.py --min-gpus 1 --max-gpus 4 --stop-signal USR1 \\
        --ckpt-dir root --progress-regex 'step (\\d+)/(\\d+)' -- --root-dir root
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import lightning as L
import torch
from gpt_model import GPT, PRESETS, MarkovText, stacked
from torch.utils.data import DataLoader


class LitGPT(L.LightningModule):
    def __init__(self, preset: str, lr: float, log_every: int, max_steps: int) -> None:
        super().__init__()
        self.model = GPT(PRESETS[preset])
        self.lr, self.log_every, self.max_steps = lr, log_every, max_steps

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = self.model.loss(batch)
        step = self.global_step + 1  # the optimizer step this batch makes
        if self.trainer.is_global_zero and (step % self.log_every == 0 or step == self.max_steps):
            print(f"step {step}/{self.max_steps} loss {loss.item():.4f}", flush=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.lr, betas=(0.9, 0.95))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root-dir", default="lightning_root")
    p.add_argument("--preset", choices=sorted(PRESETS), default="small")
    p.add_argument("--max-steps", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=16, help="per GPU")
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--lr", type=float, default=6e-4)
    p.add_argument("--log-every", type=int, default=10)
    a = p.parse_args()

    L.seed_everything(0, verbose=False)
    cfg = PRESETS[a.preset]
    data = MarkovText(a.samples, cfg.seq_len, cfg.vocab)
    loader = DataLoader(data, batch_size=a.batch_size, shuffle=True, collate_fn=stacked)
    cuda = torch.cuda.is_available()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    trainer = L.Trainer(
        default_root_dir=a.root_dir,
        max_steps=a.max_steps,
        accelerator="gpu" if cuda else "cpu",
        devices=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        num_nodes=max(1, world // int(os.environ.get("LOCAL_WORLD_SIZE", "1"))),
        strategy="ddp" if world > 1 else "auto",
        precision="bf16-mixed" if cuda else "32-true",
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer.fit(LitGPT(a.preset, a.lr, a.log_every, a.max_steps), loader)


if __name__ == "__main__":
    main()
