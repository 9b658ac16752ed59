"""A Lightning script made an elastic hpcorch job by one line (``callbacks=[hpl.Elastic()]``).

A tiny GPT (examples/gpt_model.py, its ``tiny`` preset, built from its configuration)
learns a generated Markov language. Under hpcorch:

    hpcorch submit --min-gpus 1 --max-gpus 4 --batch-size 32 \\
        examples/train_lightning_elastic.py --root-dir root --epochs 3

``--plain`` leaves the callback out: a plain Lightning script following Lightning's Slurm
convention (sidecar mode: ``--mode sidecar --stop-signal USR1 --ckpt-dir root``).
``--record FILE`` appends the dataset indices each rank trained, per micro-batch, to
``FILE.<rank>.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import hpcorch.integrations.lightning as hpl  # first: holds the checkpoint signal

# isort: split
import lightning as L
import torch
from gpt_model import GPT, PRESETS, MarkovText
from torch.utils.data import DataLoader, Dataset


class Indexed(Dataset[dict[str, Any]]):
    """The sequences of a MarkovText with their indices."""

    def __init__(self, text: MarkovText) -> None:
        self.text = text

    def __len__(self) -> int:
        return len(self.text)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"idx": i, "seq": self.text[i]}


class LitGPT(L.LightningModule):
    def __init__(self, lr: float, record: str | None, delay: float) -> None:
        super().__init__()
        self.model = GPT(PRESETS["tiny"])
        self.lr, self.delay = lr, delay
        rank, launch = os.environ.get("RANK", "0"), os.environ.get("HPCORCH_LAUNCH", "0")
        self.launch = int(launch or 0)
        self.out = open(f"{record}.{rank}.jsonl", "a") if record else None  # noqa: SIM115

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        idx = batch["idx"]
        if self.out is not None:
            line = {"launch": self.launch, "epoch": self.current_epoch, "idx": idx.tolist()}
            self.out.write(json.dumps(line) + "\n")
            self.out.flush()
        time.sleep(self.delay * len(idx))
        return self.model.loss(batch["seq"])

    def configure_optimizers(self) -> Any:
        return torch.optim.AdamW(self.parameters(), lr=self.lr)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root-dir", default="lightning-root")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16, help="per device")
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--record", default=None)
    p.add_argument("--sample-delay", type=float, default=0.0, help="seconds per sample")
    p.add_argument("--plain", action="store_true", help="Lightning alone, without hpcorch")
    a = p.parse_args()

    L.seed_everything(0, verbose=False)
    cfg = PRESETS["tiny"]
    data = Indexed(MarkovText(a.samples, cfg.seq_len, cfg.vocab))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    cuda = torch.cuda.is_available()
    trainer = L.Trainer(
        default_root_dir=a.root_dir,
        max_epochs=a.epochs,
        accelerator="gpu" if cuda else "cpu",
        devices=local,
        num_nodes=max(1, world // local),
        strategy="ddp" if world > 1 else "auto",
        callbacks=[] if a.plain else [hpl.Elastic()],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    loader = DataLoader(data, batch_size=a.batch_size, shuffle=True)
    trainer.fit(LitGPT(a.lr, a.record, a.sample_delay), loader)


if __name__ == "__main__":
    main()
