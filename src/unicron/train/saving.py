"""When and where a worker writes checkpoints, and what it tells its agent about them.

Every ``checkpoint_every`` steps, and once at the end (the ``final`` state: the task's result):

- an unsharded task's rank 0 writes the persistent checkpoint and each node's first rank its
  in-memory copy (``checkpoint.py``; every rank holds the same state);
- a sharded replica's ranks write their shards together (``shardedcheckpoint.py``): the replica
  of rank 0 to the persistent tier, and on each node the replica that lies wholly on it (the
  node's first) to the in-memory tier. Its periodic persistent checkpoints are written in the
  background unless the task says not to (``backgroundsave.py``).

Storage that refuses a checkpoint stops nothing (``persisting.py``), except that the final
state waits for it; a writer whose commit the task's current generation does not confirm skips
it, and one that was superseded stops (``fencing.py``).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from unicron.core.protocol import CheckpointReport, Phase, StorageReport, StorageTier
from unicron.train import checkpoint
from unicron.train.fencing import CommitRefused, Standing
from unicron.train.persisting import Persisting
from unicron.train.state import TrainState
from unicron.train.sumtest import SPIKE_WINDOWS

if TYPE_CHECKING:
    from unicron.train.backgroundsave import BackgroundSave
    from unicron.train.session import Session


class Saving:
    def __init__(self, session: Session, background: bool | None) -> None:
        """``background``: ``run.checkpoint_async``; None: where the session trains on a GPU, whose
        steps leave the host's cores idle for the writer (on CPUs it competes with training:
        docs/checkpointing.md)."""
        self.session = session
        self.persisting = Persisting(self._storage, refused=self._refused)
        self.background_allowed = session.device.type == "cuda" if background is None else background
        self.background: BackgroundSave | None = None  # a sharded replica's write in flight

    @property
    def writing(self) -> bool:
        """Whether this rank's background write is still running (its replica commits it once
        no rank's is: ``Session.at_boundary``)."""
        return self.background is not None and self.background.running

    def due(self, final: bool = False) -> bool:
        """Whether a checkpoint is due at the session's step (``final``: the task's end)."""
        return self.session.checkpoint_dir is not None and (final or self.periodic(self.session.step))

    def periodic(self, step: int) -> bool:
        """Whether ``step`` is one that a periodic checkpoint is written at, where one is kept."""
        every = self.session.checkpoint_every
        return self.session.checkpoint_dir is not None and bool(every and step % every == 0)

    def save(self, train: TrainState, final: bool = False) -> None:
        """Write the checkpoint due (every rank calls this at the same step)."""
        self.fenced(lambda: self._write(train, final))

    def _write(self, train: TrainState, final: bool) -> None:
        if self.background is not None:  # one write in flight at most: wait for it, saying so
            self.session.progress.at(self.session.step, Phase.CHECKPOINT)
        self.commit_background()
        if train.sharded:
            self._replica(train, final)
        else:
            self._whole(train, final)

    def commit_background(self) -> None:
        """Wait for the write in flight, if any, and commit it (the replica's ranks together)."""
        running, self.background = self.background, None
        if running is not None:
            self.fenced(lambda: self._persist(running.finish, final=False, step=running.step))

    def abandon(self, wait_s: float) -> None:
        """Let a write in flight end, uncommitted, before the groups it uses shut down (a worker
        leaving mid-write: the next commit removes its folder)."""
        running, self.background = self.background, None
        if running is not None:
            with contextlib.suppress(Exception):  # its failure, or a write stuck past ``wait_s``
                running.written.exception(timeout=wait_s)

    def fenced(self, write: Callable[[], None]) -> None:
        """Run ``write``; a writer the task went on without stops here (``fencing.py``)."""
        try:
            write()
        except CommitRefused as refused:
            if refused.standing is not Standing.SUPERSEDED:
                raise  # the final state could not be committed: the task fails, saying why
            raise SystemExit(0) from None  # the task went on without this worker

    def _whole(self, train: TrainState, final: bool) -> None:
        """Rank 0 writes the persistent checkpoint, each node's first rank its in-memory copy."""
        session = self.session
        host = session.host_dir if session.local_rank == 0 else None  # one in-memory copy per node
        if session.rank != 0 and host is None:
            return
        step = session.step
        session.progress.at(step, Phase.CHECKPOINT)
        session.faults.saving(step)
        state = checkpoint.state_of(train, step, **self._where(), **self._spike_windows())
        confirm = session.fence.confirm
        if host is not None:
            self.persisting.attempt(
                "host_memory", lambda: checkpoint.save(host, step, state, keep=2, confirm=confirm)
            )
        directory = session.checkpoint_dir
        if session.rank == 0 and directory is not None:
            self._persist(lambda: checkpoint.save(directory, step, state, confirm=confirm), final, step)

    def _replica(self, train: TrainState, final: bool) -> None:
        """A sharded replica's checkpoint: its ranks write their shards together. Its writers load
        torch.distributed.checkpoint: imported here on first use (``checkpoint.py`` says why)."""
        from unicron.train import shardedcheckpoint
        from unicron.train.backgroundsave import BackgroundSave

        session = self.session
        layout, directory = session.groups.layout, session.checkpoint_dir
        if layout is None or directory is None:
            return
        persistent = layout.replica == 0
        on_one_node = session.groups.replica_on_one_node(session.node, session.local_rank)
        host = session.host_dir if on_one_node else None
        if not persistent and host is None:
            return
        step = session.step
        session.progress.at(step, Phase.CHECKPOINT)
        session.faults.saving(step)
        state = shardedcheckpoint.state_of(train, step, session.replica_size, **self._where())
        commit = layout.position == 0
        confirm = lambda: session.fence.confirm_in_replica(commit)  # noqa: E731
        if host is not None:
            self.persisting.attempt(
                "host_memory",
                lambda: shardedcheckpoint.save(host, step, state, commit, keep=2, confirm=confirm),
            )
        if not persistent:
            return
        if self.background_allowed and not final:
            saver = session.groups.saver()
            self.background = BackgroundSave.start(directory, step, state, commit, saver, confirm)
            return
        write = lambda: shardedcheckpoint.save(directory, step, state, commit, confirm=confirm)  # noqa: E731
        self._persist(write, final, step)

    def _spike_windows(self) -> dict[str, dict[str, list[float]]]:
        """The step's windows of the values its sums are judged by (``sumtest.py``), where they
        are judged: the step loop's, or the ones it left (the final state, saved once it ended);
        a relaunch from this checkpoint judges spikes from its first step."""
        session = self.session
        windows = session.running.spike_windows() if session.running is not None else session.spike_windows
        return {SPIKE_WINDOWS: windows} if windows else {}

    def _where(self) -> dict[str, Any]:
        session = self.session
        return {"task": session.task, "generation": session.generation, "world_size": session.world_size}

    def _persist(self, write: Callable[[], Path], final: bool, step: int) -> None:
        """Write ``step``'s checkpoint to the persistent tier; the task's result waits for the
        storage."""
        session = self.session
        if final and session.step >= session.iterations:  # the result: it must reach the storage
            path: Path | None = self.persisting.final(write, session.storage_wait_s)
        else:
            path = self.persisting.attempt("persistent", write)
        if path is not None and session.rank == 0:
            session.channel.send(CheckpointReport(**session.identity(), step=step, path=str(path)))

    def _refused(self, tier: StorageTier, refused: CommitRefused) -> None:
        session = self.session
        session.trace("commit_refused", tier=tier, standing=refused.standing.value, step=session.step)
        print(f"{session.task}: {refused}", file=sys.stderr, flush=True)

    def _storage(self, tier: StorageTier, ok: bool, error: str, when: float) -> None:
        session = self.session
        session.trace("storage", tier=tier, ok=ok, step=session.step)
        report = StorageReport(
            **session.identity(), step=session.step, tier=tier, ok=ok, error=error[:2000], time=when
        )
        session.channel.send(report)
