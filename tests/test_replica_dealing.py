"""How a replica's samples are dealt to its ranks (train/replicas.py): pure logic."""

from __future__ import annotations

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from unicron.train.replicas import Layout, micro_batches, replica_share


@given(
    samples=st.integers(0, 200),
    size=st.integers(1, 8),
    micro=st.integers(1, 9),
)
def test_every_sample_once_and_every_rank_the_same_number_of_micro_batches(
    samples: int, size: int, micro: int
) -> None:
    ids = list(range(1000, 1000 + samples))
    dealt = [micro_batches(ids, position, size, micro) for position in range(size)]
    assert Counter(i for chunks in dealt for chunk in chunks for i in chunk) == Counter(ids)
    assert len({len(chunks) for chunks in dealt}) == 1  # FSDP: forward/backward in lockstep
    assert all(len(chunk) <= micro for chunks in dealt for chunk in chunks)
    # Only the last round can be short, and its samples are spread evenly.
    last = [len(chunks[-1]) for chunks in dealt if chunks]
    assert not last or max(last) - min(last) <= 1
    assert all(len(chunk) == micro for chunks in dealt for chunk in chunks[:-1])


def test_replicas_split_a_step_as_ranks_would_and_a_layout_names_its_place() -> None:
    ids = list(range(16))
    shares = [replica_share(ids, r, 3) for r in range(3)]
    assert sorted(i for share in shares for i in share) == ids
    assert [len(s) for s in shares] == [6, 5, 5]
    # 5 samples over 2 ranks in micro-batches of 2: a full round, then one sample and a pad.
    assert micro_batches(shares[1], 0, 2, 2) == [[1, 4], [13]]
    assert micro_batches(shares[1], 1, 2, 2) == [[7, 10], []]
    layout = Layout(rank=5, world=6, size=2)
    assert (layout.replica, layout.position, layout.replicas) == (2, 1, 3)
