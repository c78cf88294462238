"""The data position as part of the training state.

A step's samples are a pure function of the step and the data's declaration (global batch B,
dataset size, seed, shuffle, drop_last), never of the number of ranks, so a run restored at step
``s``, or re-formed with another world size, continues with exactly the samples a run without
failures would have seen: none skipped, none repeated.

The order is ``torch.utils.data.DistributedSampler``'s: each epoch visits the dataset in
``torch.randperm(n)`` seeded with ``seed + epoch`` (or in order, without shuffling), and step
``k`` of an epoch trains on the k-th block of B consecutive positions. That block is exactly
what B / (W x b) micro-batches of b samples on each of W DDP ranks cover together, and a rank's
share of the block is strided (``block[rank::W]``), as the sampler deals it, so at the world
size a DDP run used every rank sees the same samples in the same order as under torchrun.
``drop_last`` drops an epoch's last partial block (the sampler's and the loader's
``drop_last=True`` together); without it the last step of an epoch is smaller. Unlike the
sampler with ``drop_last=False``, no sample is repeated to pad the epoch: the padding would
depend on the world size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch


@lru_cache(maxsize=4)
def _epoch_order(epoch: int, size: int, seed: int, shuffle: bool) -> tuple[int, ...]:
    if not shuffle:
        return tuple(range(size))
    generator = torch.Generator()
    generator.manual_seed(seed + epoch)  # DistributedSampler.set_epoch(epoch)
    return tuple(torch.randperm(size, generator=generator).tolist())


@dataclass(frozen=True)
class DataStream:
    """What a step's samples are a function of."""

    global_batch: int
    micro_batch: int
    dataset_size: int
    seed: int = 0
    shuffle: bool = True
    drop_last: bool = True

    def __post_init__(self) -> None:
        if self.micro_batch < 1 or self.global_batch < self.micro_batch:
            raise ValueError(
                f"micro_batch {self.micro_batch} and global_batch {self.global_batch}: need "
                "1 <= micro_batch <= global_batch"
            )
        if self.dataset_size < (self.global_batch if self.drop_last else 1):
            raise ValueError(
                f"the dataset has {self.dataset_size} samples, fewer than one global batch of "
                f"{self.global_batch}: lower global_batch or set drop_last=False"
            )

    @property
    def steps_per_epoch(self) -> int:
        whole, rest = divmod(self.dataset_size, self.global_batch)
        return whole + (1 if rest and not self.drop_last else 0)

    def batch(self, step: int) -> list[int]:
        """The sample ids step ``step`` (1-based) trains on, in order."""
        epoch, within = divmod(step - 1, self.steps_per_epoch)
        order = _epoch_order(epoch, self.dataset_size, self.seed, self.shuffle)
        start = within * self.global_batch
        return list(order[start : start + self.global_batch])


def shard(ids: list[int], rank: int, world_size: int) -> list[int]:
    """This rank's share of a step's samples: every ``world_size``-th from its rank on, as
    DistributedSampler deals them (balanced within one sample)."""
    return ids[rank::world_size]


def unclaimed_share(ids: list[int], held: list[list[int]], rank: int, world_size: int) -> list[int]:
    """This rank's part of the step's samples that no member holds yet (``held``: what each
    member has accumulated), dealt in the step's order: the sample ledger of a step whose
    group re-formed in the middle of it."""
    taken = {i for part in held for i in part}
    return shard([i for i in ids if i not in taken], rank, world_size)
