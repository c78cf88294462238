"""The Unicron port (examples/ddp-port/train_unicron.py, its diff in docs/training-library.md)
training a Hugging Face Llama (llama.py): under an agent it recovers in place, as the tiny GPT's.

    torchrun --standalone --nproc-per-node 2 examples/hf-llama/train_unicron.py --iterations 20
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

from llama import llama, lm_loss, options

# Before this folder on the path: ``train_unicron`` is the DDP port's script, not this one.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ddp-port"))
import train_unicron

if __name__ == "__main__":
    ours = options()
    train_unicron.main(functools.partial(llama, pretrained=ours.pretrained), lm_loss, ours.export)
