"""A sharded replica's periodic checkpoint, written in the background while training goes on.

Writing a checkpoint to shared storage takes as long as the storage needs (seconds for a
model of any size), and the replica's ranks would wait for it at every checkpoint. DCP's
``async_save`` instead copies the replica's shards to host memory (staging: the only part
the step waits for) and writes that copy from a thread, so the next steps run meanwhile.

- **A group of its own.** The writing thread runs DCP's collectives (the plan, the metadata,
  each rank's failure) while the training thread runs FSDP's on the replica's group; two threads
  on one gloo group would interleave their messages. So the writes use a second gloo group over
  the same ranks (``Groups.saver``), formed at the first background save.
- **Committed later, fenced then.** The folder is renamed into place (and ``latest`` moved)
  only after every rank's write finished, and only after the writer confirmed then, not when it
  started, that it still belongs to the task's current generation (``fencing.py``): the commit
  is the step that must not race a newer generation. The replica's ranks commit together, at a
  step boundary where all of them found the write finished (one flag in the boundary's
  collective: ``Session.at_boundary``), or when the next checkpoint is due (they wait for it).
- **Failures.** The storage's errors reach the session only when it commits (``finish``), as
  ``CheckpointWriteError`` on every rank (DCP gathers each rank's failure), and go through
  ``Persisting`` as a synchronous write's do. A replica that fails while a write runs never
  commits it; its partial folder is removed by the next commit (``shardedcheckpoint.committed``).
- **Where it does not pay:** the final checkpoint (the task's result waits for it anyway) and
  the node's in-memory tier (a copy to memory is what staging costs) are written synchronously.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint.filesystem import FileSystemWriter
from torch.distributed.checkpoint.state_dict_saver import async_save

from unicron.train.shardedcheckpoint import WRITE_ERRORS, committed, discarded, ready


@dataclass
class BackgroundSave:
    """One checkpoint being written: ``step``'s, into ``directory``; ``commit``: this rank
    renames it into place (the replica's first)."""

    directory: Path
    step: int
    commit: bool
    keep: int
    confirm: Callable[[], None] | None
    written: Future[Any]

    @classmethod
    def start(
        cls,
        directory: Path,
        step: int,
        state: dict[str, Any],
        commit: bool,
        group: Any,
        confirm: Callable[[], None] | None = None,
        keep: int = 3,
    ) -> BackgroundSave:
        """Stage ``state`` (every rank of the replica calls this, at the same step) and start
        writing it over ``group``; returns at once. What fails here is kept for ``finish``."""
        written: Future[Any]
        try:
            tmp = ready(directory, step, commit)
            started = async_save(state, storage_writer=FileSystemWriter(tmp), process_group=group)
            assert isinstance(started, Future)  # (an AsyncSaveResponse only with a stager of its own)
            written = started
        except WRITE_ERRORS as exc:
            written = Future()
            written.set_exception(exc)
        return cls(directory, step, commit, keep, confirm, written)

    @property
    def running(self) -> bool:
        return not self.written.done()

    def finish(self) -> Path:
        """Wait for the write, then commit it (every rank of the replica calls this together);
        raises ``CheckpointWriteError`` when the storage refused any part, leaving the previous
        checkpoint as it was, and what ``confirm`` raises."""
        try:
            self.written.result()
            return committed(self.directory, self.step, self.commit, self.keep, self.confirm)
        except WRITE_ERRORS as exc:
            raise discarded(self.directory, self.step, self.commit, exc) from exc
