"""GPT-3 shapes (Brown et al. 2020, Table 2.1) with Megatron-LM's sequence and padded vocabulary."""

from __future__ import annotations

from unicron.core.specs import ModelSpec

# name: (layers, hidden, heads, global batch in sequences)
GPT3_SHAPES = {
    "1.3b": (24, 2048, 16, 512),
    "2.7b": (32, 2560, 32, 512),
    "6.7b": (32, 4096, 32, 1024),
    "13b": (40, 5120, 40, 1024),
    "175b": (96, 12288, 96, 1536),
}


def gpt3(size: str) -> ModelSpec:
    layers, hidden, heads, batch = GPT3_SHAPES[size]
    return ModelSpec(
        layers=layers,
        hidden_size=hidden,
        heads=heads,
        sequence_length=2048,
        vocabulary=51200,
        global_batch=batch,
    )
