"""A small GPT language model: token and position embeddings, pre-norm blocks, tied head."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F


@dataclass(frozen=True)
class Config:
    vocab: int = 64
    sequence: int = 32
    layers: int = 2
    hidden: int = 64
    heads: int = 4

    def parameters(self) -> int:
        h = self.hidden
        return self.vocab * h + self.sequence * h + self.layers * (12 * h * h + 13 * h) + 2 * h

    def flops_per_sample(self) -> float:
        """Training FLOPs for one sequence: 6 per parameter and token, plus attention."""
        tokens = self.sequence
        return 6 * self.parameters() * tokens + 12 * self.layers * self.hidden * tokens * tokens


class Block(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.heads = c.heads
        self.norm1 = nn.LayerNorm(c.hidden)
        self.qkv = nn.Linear(c.hidden, 3 * c.hidden)
        self.proj = nn.Linear(c.hidden, c.hidden)
        self.norm2 = nn.LayerNorm(c.hidden)
        self.mlp = nn.Sequential(
            nn.Linear(c.hidden, 4 * c.hidden), nn.GELU(), nn.Linear(4 * c.hidden, c.hidden)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(h, dim=2)
        shape = (b, t, self.heads, h // self.heads)
        q, k, v = (z.view(shape).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(h // self.heads)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        attention = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + self.proj((attention @ v).transpose(1, 2).reshape(b, t, h))
        return x + self.mlp(self.norm2(x))


class TinyGPT(nn.Module):
    def __init__(self, c: Config) -> None:
        super().__init__()
        self.tokens = nn.Embedding(c.vocab, c.hidden)
        self.positions = nn.Embedding(c.sequence, c.hidden)
        self.blocks = nn.ModuleList(Block(c) for _ in range(c.layers))
        self.norm = nn.LayerNorm(c.hidden)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        t = tokens.shape[1]
        x = self.tokens(tokens) + self.positions(torch.arange(t, device=tokens.device))
        for block in self.blocks:
            x = block(x)
        return self.norm(x) @ self.tokens.weight.T  # tied output head


def lm_loss(net: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy; ``net`` may be the model or its DDP wrapper."""
    logits = net(batch[:, :-1])
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
