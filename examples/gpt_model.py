"""A small GPT-style transformer and a generated language for it, in plain PyTorch.

Shared by examples/train_gpt.py (elastic, with hpcorch.runtime) and
examples/train_lightning.py (a Lightning script that knows nothing of hpcorch). Nothing is
downloaded: the text is drawn from a fixed random Markov chain over ``vocab`` tokens in
which every token has ``branching`` possible successors, so a model that learns the chain
reaches a loss of about ln(branching), down from ln(vocab) at the start.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class GPTConfig:
    layers: int = 6
    d_model: int = 384
    heads: int = 6
    seq_len: int = 256
    vocab: int = 4096
    dropout: float = 0.1


PRESETS = {
    # a few seconds on a CPU: for tests
    "tiny": GPTConfig(layers=2, d_model=64, heads=4, seq_len=32, vocab=128),
    # 11 M parameters
    "small": GPTConfig(layers=6, d_model=384, heads=6, seq_len=256, vocab=4096),
    # GPT-2 small's shape with a smaller vocabulary: 92 M parameters
    "gpt2": GPTConfig(layers=12, d_model=768, heads=12, seq_len=512, vocab=8192),
}


class Block(nn.Module):
    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.heads = c.heads
        self.ln1 = nn.LayerNorm(c.d_model)
        self.qkv = nn.Linear(c.d_model, 3 * c.d_model)
        self.proj = nn.Linear(c.d_model, c.d_model)
        self.ln2 = nn.LayerNorm(c.d_model)
        self.fc = nn.Linear(c.d_model, 4 * c.d_model)
        self.out = nn.Linear(4 * c.d_model, c.d_model)
        self.drop = nn.Dropout(c.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.drop(self.proj(y.transpose(1, 2).reshape(b, t, d)))
        return x + self.drop(self.out(F.gelu(self.fc(self.ln2(x)))))


class GPT(nn.Module):
    """Decoder-only transformer: token and position embeddings, pre-norm blocks, tied head."""

    def __init__(self, c: GPTConfig) -> None:
        super().__init__()
        self.config = c
        self.tok = nn.Embedding(c.vocab, c.d_model)
        self.pos = nn.Embedding(c.seq_len, c.d_model)
        self.drop = nn.Dropout(c.dropout)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.ln_f = nn.LayerNorm(c.d_model)
        self.apply(self._init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual outputs
            if name.endswith(("proj.weight", "out.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * c.layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, nn.Linear | nn.Embedding):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits (batch, time, vocab) for token ids (batch, time)."""
        t = tokens.shape[1]
        pos = torch.arange(t, device=tokens.device)
        x = self.drop(self.tok(tokens) + self.pos(pos))
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.tok.weight)

    def loss(self, batch: torch.Tensor) -> torch.Tensor:
        """Mean next-token cross-entropy of a batch of sequences (batch, seq_len + 1)."""
        logits = self(batch[:, :-1])
        return F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten().long())


def parameter_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class MarkovText(torch.utils.data.Dataset[torch.Tensor]):
    """``samples`` sequences of ``seq_len + 1`` tokens from a seeded random Markov chain."""

    def __init__(
        self, samples: int, seq_len: int, vocab: int, seed: int = 0, branching: int = 4
    ) -> None:
        g = torch.Generator().manual_seed(seed)
        successors = torch.randint(vocab, (vocab, branching), generator=g)
        choice = torch.randint(branching, (samples, seq_len), generator=g)
        seq = torch.empty(samples, seq_len + 1, dtype=torch.int64)
        seq[:, 0] = torch.randint(vocab, (samples,), generator=g)
        for t in range(seq_len):
            seq[:, t + 1] = successors[seq[:, t], choice[:, t]]
        self.data = seq.to(torch.int32)
        self.entropy = math.log(branching)
        """The loss of a model that has learnt the chain (nats per token)."""

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> torch.Tensor:
        return self.data[i]

    def __getitems__(self, indices: list[int]) -> torch.Tensor:
        """A whole micro-batch in one indexing (the DataLoader prefers this)."""
        return self.data[torch.as_tensor(indices)]


def stacked(batch: Any) -> Any:
    """collate_fn for MarkovText: ``__getitems__`` already returns the stacked batch."""
    return batch
