"""The user's dataset behind the session's data position: a map-style dataset and its
``collate_fn``, fetched by the sample ids each step deals out (``data.DataStream``).

Only map-style datasets (``len`` and indexing) are supported: recovery deals a departed rank's
samples to the survivors by id, and a newcomer resumes at an exact position, which needs random
access. An iterable dataset (a ``torch.utils.data.IterableDataset``, a generator) is refused;
materialise it, or index its shards, to train it under Unicron.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch.utils.data

from unicron.train.data import DataStream


@runtime_checkable
class MapDataset(Protocol):
    def __len__(self) -> int: ...

    def __getitem__(self, index: Any) -> Any: ...


@dataclass(frozen=True)
class StepData:
    stream: DataStream
    dataset: MapDataset
    collate: Callable[[list[Any]], Any]

    def fetch(self, ids: Sequence[int]) -> Any:
        """The micro-batch of samples ``ids``, as the user's ``collate_fn`` builds it."""
        return self.collate([self.dataset[i] for i in ids])


def step_data(
    dataset: object,
    global_batch: int,
    micro_batch: int,
    collate_fn: Callable[[list[Any]], Any] | None,
    seed: int,
    shuffle: bool,
    drop_last: bool,
) -> StepData:
    """Check what ``session.loader`` was given; the error says what to pass instead."""
    if isinstance(dataset, torch.utils.data.DataLoader):
        raise TypeError(
            "session.loader(dataset=...): got a DataLoader; pass its dataset and collate_fn "
            "(the session deals the samples to the ranks itself, in DistributedSampler's order: "
            "drop the sampler and the loader)"
        )
    if isinstance(dataset, torch.utils.data.Sampler):
        raise TypeError(
            "session.loader(dataset=...): got a sampler; pass the dataset (the session is the sampler)"
        )
    if isinstance(dataset, torch.utils.data.IterableDataset) or not isinstance(dataset, MapDataset):
        raise TypeError(
            f"session.loader(dataset=...): a {type(dataset).__name__} has no len() and indexing; "
            "the session needs a map-style dataset so that the data position stays exact when "
            "ranks come and go (materialise an iterable dataset, or index its shards)"
        )
    stream = DataStream(global_batch, micro_batch, len(dataset), seed, shuffle, drop_last)
    return StepData(stream, dataset, collate_fn or torch.utils.data.default_collate)
