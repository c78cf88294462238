"""The plain torchrun + DDP script (examples/ddp-port/train_ddp.py) training a Hugging Face Llama
(llama.py) instead of the tiny GPT: the same corpus, sampler, optimizer, schedule and loop.

    torchrun --standalone --nproc-per-node 2 examples/hf-llama/train_ddp.py --iterations 20
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from llama import llama, lm_loss, options

# Before this folder on the path: ``train_ddp`` is the DDP port's script, not this one.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ddp-port"))
import train_ddp

if __name__ == "__main__":
    ours = options()
    train_ddp.main(functools.partial(llama, pretrained=ours.pretrained), lm_loss, ours.export)
