"""A Hugging Face ``Trainer`` script made an elastic hpcorch job by one line.

A tiny GPT-2 built from its configuration (nothing downloaded) learns synthetic token
sequences; run it as any Trainer script (torchrun, or srun through hpcorch's job wrapper,
which sets torchrun's variables). Under hpcorch:

    hpcorch submit --min-gpus 1 --max-gpus 4 --batch-size 32 examples/train_transformers.py \\
        --output-dir out --epochs 3

``--plain`` trains with the Trainer alone, the line left out (sidecar mode: submit with
``--mode sidecar --stop-signal TERM --ckpt-dir out``; the Trainer's just-in-time checkpoint
saves on SIGTERM and the relaunch resumes from the newest ``checkpoint-N``).
``--record FILE`` appends the dataset indices each rank trained, per micro-batch, to
``FILE.<rank>.jsonl`` (the tests check them against the resume bound).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import hpcorch.integrations.transformers as hpt  # first: holds the checkpoint signal

# isort: split
import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers.trainer_utils import get_last_checkpoint


class Tokens(torch.utils.data.Dataset[dict[str, Any]]):
    """Sequences of a fixed pattern with noise, the same for every index at every launch."""

    def __init__(self, n: int, seq_len: int, vocab: int) -> None:
        self.n, self.seq_len, self.vocab = n, seq_len, vocab

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        g = torch.Generator().manual_seed(i)
        start = int(torch.randint(self.vocab, (1,), generator=g))
        ids = (start + torch.arange(self.seq_len)) % self.vocab
        noise = torch.rand(self.seq_len, generator=g) < 0.1
        ids = torch.where(noise, torch.randint(self.vocab, (self.seq_len,), generator=g), ids)
        return {"input_ids": ids, "labels": ids.clone(), "idx": i}


def collate(items: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.stack([x["input_ids"] for x in items]),
        "labels": torch.stack([x["labels"] for x in items]),
        "idx": torch.tensor([x["idx"] for x in items]),
    }


def recorder(path: str | None, delay: float) -> Any:
    """A forward pre-hook that takes the indices out of the batch (and records them)."""
    rank = int(os.environ.get("RANK", "0"))
    launch = int(os.environ.get("HPCORCH_LAUNCH", "0") or 0)
    out = open(f"{path}.{rank}.jsonl", "a") if path else None  # noqa: SIM115

    def hook(module: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> Any:
        idx = kwargs.pop("idx", None)
        if module.training and idx is not None:
            if out is not None:
                out.write(json.dumps({"launch": launch, "idx": idx.tolist()}) + "\n")
                out.flush()
            time.sleep(delay * len(idx))
        return args, kwargs

    return hook


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--output-dir", default="hf-out")
    p.add_argument("--epochs", type=float, default=2)
    p.add_argument("--samples", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16, help="per device")
    p.add_argument("--seq-len", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--record", default=None)
    p.add_argument("--sample-delay", type=float, default=0.0, help="seconds per sample")
    p.add_argument("--plain", action="store_true", help="the Trainer alone, without hpcorch")
    a = p.parse_args()

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=64, n_positions=a.seq_len, n_embd=32, n_layer=2, n_head=2,
        bos_token_id=0, eos_token_id=0, loss_type="ForCausalLM",
    )  # fmt: skip
    model = GPT2LMHeadModel(config)
    model.register_forward_pre_hook(recorder(a.record, a.sample_delay), with_kwargs=True)
    args = TrainingArguments(
        output_dir=a.output_dir,
        per_device_train_batch_size=a.batch_size,
        num_train_epochs=a.epochs,
        learning_rate=a.lr,
        logging_steps=10,
        save_strategy="steps" if a.plain else "no",  # sidecar mode: the Trainer's own
        save_steps=25,
        save_total_limit=2,
        report_to=[],
        use_cpu=not torch.cuda.is_available(),
        ddp_backend=None if torch.cuda.is_available() else "gloo",
        remove_unused_columns=False,
        ddp_find_unused_parameters=False,
        disable_tqdm=not a.plain,  # sidecar mode reads the progress bar
        enable_jit_checkpoint=a.plain,
    )
    data = Tokens(a.samples, a.seq_len, config.vocab_size)
    trainer = Trainer(model=model, args=args, train_dataset=data, data_collator=collate)
    if a.plain:
        last = get_last_checkpoint(a.output_dir) if os.path.isdir(a.output_dir) else None
        trainer.train(resume_from_checkpoint=last)
    else:
        hpt.elastic(trainer).train()
    print("training done", file=sys.stderr)


if __name__ == "__main__":
    main()
