"""The data position as part of the training state.

Step ``s`` (1-based) trains on global samples ``(s-1)*B .. s*B-1`` of an endless stream that
visits the dataset in a fresh seeded permutation each epoch. The sample ids of a step are a pure
function of (step, global batch, dataset size, seed), so a run restored at step ``s`` continues
with exactly the samples a run without failures would have seen: none skipped, none repeated.
A step's samples are split over the data-parallel ranks in contiguous shares (as even as
possible), and each share into micro-batches.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt


@lru_cache(maxsize=8)
def _epoch_order(epoch: int, size: int, seed: int) -> npt.NDArray[np.int64]:
    return np.random.default_rng([seed, epoch]).permutation(size).astype(np.int64)


def global_batch_ids(step: int, global_batch: int, dataset_size: int, seed: int) -> list[int]:
    """The sample ids step ``step`` trains on, in order."""
    start = (step - 1) * global_batch
    ids = []
    for position in range(start, start + global_batch):
        epoch, offset = divmod(position, dataset_size)
        ids.append(int(_epoch_order(epoch, dataset_size, seed)[offset]))
    return ids


@dataclass(frozen=True)
class DataStream:
    """The data position's parameters: what a step's samples are a function of."""

    global_batch: int
    micro_batch: int
    dataset_size: int
    seed: int = 0

    def stream(self) -> tuple[int, int, int]:
        """Arguments for global_batch_ids after the step."""
        return self.global_batch, self.dataset_size, self.seed


def shard(ids: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's contiguous share of a step's samples."""
    bounds = np.linspace(0, len(ids), world_size + 1).round().astype(int)
    return ids[bounds[rank] : bounds[rank + 1]]


def unclaimed_share(ids: list[int], held: list[list[int]], rank: int, world_size: int) -> list[int]:
    """This rank's part of the step's samples that no member holds yet (``held``: what each
    member has accumulated), split evenly in the step's order: the sample ledger of a step
    whose group re-formed in the middle of it."""
    taken = {i for part in held for i in part}
    return shard([i for i in ids if i not in taken], rank, world_size)
