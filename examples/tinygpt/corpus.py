"""A generated corpus: token sequences from a seeded Markov chain with learnable structure."""

from __future__ import annotations

import numpy as np
import torch


def make_corpus(sequences: int, length: int, vocab: int, seed: int) -> torch.Tensor:
    """``sequences`` rows of ``length + 1`` tokens (inputs and next-token targets)."""
    rng = np.random.default_rng(seed)
    # Each token has a few likely successors, so a model can learn the chain.
    successors = rng.integers(0, vocab, size=(vocab, 3))
    tokens = np.empty(sequences * (length + 1), dtype=np.int64)
    tokens[0] = rng.integers(vocab)
    choice = rng.integers(0, 3, size=len(tokens))
    noise = rng.random(len(tokens)) < 0.1
    random_tokens = rng.integers(0, vocab, size=len(tokens))
    for i in range(1, len(tokens)):
        tokens[i] = random_tokens[i] if noise[i] else successors[tokens[i - 1], choice[i]]
    return torch.from_numpy(tokens.reshape(sequences, length + 1))
