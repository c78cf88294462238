"""A small Llama from Hugging Face Transformers, built from a configuration in code (no download),
and its loss: what examples/ddp-port's scripts train instead of the tiny GPT here."""

from __future__ import annotations

import argparse
import sys

import torch
from torch.nn import functional as F
from transformers import LlamaConfig, LlamaForCausalLM

VOCAB, SEQUENCE = 64, 32  # the project's corpus (examples/tinygpt/corpus.py), as the tiny GPT's


def options() -> argparse.Namespace:
    """This example's own options, taken off the command line (the rest are the DDP port's)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--pretrained", help="start from this save_pretrained folder, not new weights")
    p.add_argument("--export", help="write the final model here with save_pretrained")
    ours, sys.argv[1:] = p.parse_known_args()
    return ours


def llama(args: argparse.Namespace, pretrained: str | None = None) -> torch.nn.Module:
    """LlamaForCausalLM of the scripts' ``--layers``, ``--hidden`` and ``--heads``, with
    grouped-query attention (two query heads per key-value head); or the one saved in the
    ``pretrained`` folder (with save_pretrained: a Unicron run's ``--export``), as it was saved."""
    if pretrained:
        return LlamaForCausalLM.from_pretrained(pretrained, dtype="auto", attn_implementation="eager")
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=args.hidden,
        intermediate_size=2 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=max(1, args.heads // 2),
        max_position_embeddings=SEQUENCE,
        tie_word_embeddings=False,
        attn_implementation="eager",  # the same kernels whatever the device and the world size
        use_cache=False,  # (training: no key-value cache to build at each forward)
    )
    return LlamaForCausalLM(config)


def lm_loss(net: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """The micro-batch's mean next-token cross-entropy in the model's precision (the model's own
    ``labels=`` loss casts the logits to float32); ``net`` may be the model or its DDP wrapper."""
    logits = net(input_ids=batch[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
