"""A worker's position board (core.position, train.progress): what the worker writes is what
its agent reads, and a record read while being overwritten is never taken for a position."""

from __future__ import annotations

import os
from pathlib import Path

from unicron.core.position import RECORD_SIZE, decode, encode
from unicron.core.protocol import Phase, Progress
from unicron.train.progress import ProgressReporter


def test_the_agent_reads_the_latest_position_the_worker_wrote(tmp_path: Path) -> None:
    board = tmp_path / "w.position"
    reporter = ProgressReporter(str(board), None, lambda: 3)
    assert decode(board.read_bytes(), 1) is None  # nothing written yet
    reporter.at(7, Phase.COMPUTE, micro_batch=1)
    reporter.at(7, Phase.COLLECTIVE, "all_reduce", 2)
    read = decode(board.read_bytes(), os.getpid())
    assert read is not None
    assert (read.generation, read.step, read.phase, read.what, read.micro_batch) == (
        3,
        7,
        Phase.COLLECTIVE,
        "all_reduce",
        2,
    )
    assert read.pid == os.getpid()
    reporter.close()


def test_a_torn_record_is_not_a_position() -> None:
    old = encode(1, 5, Phase.COMPUTE, "", 1, 100.0)
    new = encode(1, 6, Phase.COLLECTIVE, "all_reduce", 2, 101.0)
    assert decode(old, 9) == Progress(
        pid=9, generation=1, step=5, phase=Phase.COMPUTE, micro_batch=1, time=100.0
    )
    for cut in range(1, RECORD_SIZE - 1):  # half written: the new record's head, the old one's tail
        torn = new[:cut] + old[cut:]
        assert decode(torn, 9) in (None, decode(new, 9), decode(old, 9))
    assert decode(new[:16] + old[16:], 9) is None
    assert decode(new[:-1], 9) is None  # short


def test_without_a_board_nothing_is_written() -> None:
    reporter = ProgressReporter(None, None, lambda: 0)
    reporter.at(1, Phase.COMPUTE)  # no agent: a no-op
    reporter.close()
