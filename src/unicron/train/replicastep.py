"""The replicas' check inside the training step (``replicacheck.py`` says what it compares and
why): when it runs, what it adds to the step's summed buffer, how the sum is judged, and what a
mismatch sets off on this rank. ``steploop.StepLoop`` owns one per ``session.steps`` loop, as it
owns the numerical rung (``numericstep.py``), and calls it at three points: as the step's sum is
taken (``take``, ``offer``, ``judge``), when a sum found the parameters unlike (``mend``), and at
the step's end before a checkpoint (``check_at_end``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NoReturn, Protocol

import torch

from unicron.core.protocol import Phase
from unicron.train import numerics, numericstep, replicacheck
from unicron.train.fingerprint import ReplicasDiverged, Verdict, fingerprint
from unicron.train.iteration import StopRequested
from unicron.train.progress import ProgressReporter
from unicron.train.replicacheck import StateUnlike
from unicron.train.state import Stateful, TrainState


class Worker(numericstep.Worker, Protocol):
    """What the check asks of the training session (``session.Session``)."""

    step: int
    agreed_step: int  # the step at which the members last agreed on one state (a group re-formed)
    extras: dict[str, Stateful]
    progress: ProgressReporter

    def rejoin(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> bool:
        """Leave the group, join the coordinator's next one, agree on one state."""
        ...


class ReplicaStep:
    """One loop's check: ``every`` (``run.digest_every``; 0: off), the parameters' fingerprint
    taken for the sum in progress (``summed``), and the last step whose sum found the replicas
    alike (``alike_step``; a mismatch after a step without one cannot be mended in place)."""

    def __init__(
        self, session: Worker, model: torch.nn.Module, optimizer: torch.optim.Optimizer, every: int
    ) -> None:
        self.session, self.model, self.optimizer, self.every = session, model, optimizer, every
        self.train = TrainState(model, optimizer, session.extras)
        self.summed: torch.Tensor | None = None
        self.alike_step = session.step

    def compared(self, step: int) -> bool:
        """Whether the parameters are compared in ``step``'s sum (the same on every rank)."""
        return bool(self.every and step % self.every == 0) and self.session.world_size > 1

    # ------------------------------------------------------------------ in the sum
    def take(self, step: int) -> None:
        """As the step's sum is taken (each attempt), once backward has read every parameter: the
        fingerprint, where compared, so a bit flipped before backward read it is found before its
        gradient is applied. Nothing waits for it: it stays on the device until summed."""
        compared = self.compared(step)
        self.summed = fingerprint(list(self.model.parameters()), host=False) if compared else None

    @property
    def offered(self) -> int:
        """How many values ``offer`` appends to the summed buffer (0 or ``OFFERED``)."""
        return 0 if self.summed is None else replicacheck.OFFERED

    def offer(self, device: torch.device) -> list[torch.Tensor]:
        """What this rank appends to the step's summed buffer (``replicacheck.offer``)."""
        return [] if self.summed is None else [replicacheck.offer(self.summed).to(device)]

    def judge(self, summed: list[float], step: int) -> None:
        """The appended values once summed over the ranks: unlike parameters are ``StateUnlike``
        (nothing of the sum written back)."""
        if not self.offered:
            return
        if not replicacheck.alike(summed):
            raise StateUnlike("the replicas' parameters differ")
        self.alike_step = step

    # ------------------------------------------------------------------ after a mismatch
    def mend(self, step: int, last: bool, again: bool) -> frozenset[int] | None:
        """The parameters differed in ``step``'s sum (nothing of it applied): the odd ranks take
        the majority's state, or every rank raises ``ReplicasDiverged`` (``replicacheck.settle``;
        ``again``: one was mended in the step already, and they differ anew: a device that keeps
        flipping bits is not mended twice). Returns the odd ranks, to compute their micro-batches
        again; None where a peer failed meanwhile (forwarded, to recover from in place as from a
        failed sum; ``last``: raised instead)."""
        session, found_at = self.session, (time.time(), time.monotonic())
        if again:
            why = f"the replicas' parameters differ again in step {step}, after one was mended"
            self._diverged(step, ReplicasDiverged(why, frozenset()))
        fresh = max(self.alike_step, session.agreed_step) >= step - 1
        peers, summed = session.groups.peers, self.summed
        try:
            if peers is None or summed is None:
                raise ConnectionResetError("the process group is gone: connection to peers broken")
            found = replicacheck.settle(peers, self.train, summed, fresh)
        except ReplicasDiverged as exc:
            self._diverged(step, exc)
        except Exception as exc:
            session.recoverable(exc, last=last)
            return None
        self._repaired(step, found, found_at)
        return found.odd

    # ------------------------------------------------------------------ at the step's end
    def check_at_end(self, step: int, due: bool, abandoned: Callable[[], bool] | None) -> None:
        """At the end of ``step`` where ``due`` (before a checkpoint, at the last step): the
        replicas hold one whole state, or are mended, or raise ``ReplicasDiverged``
        (``replicacheck.check``; ``abandoned``: as for the step's sum). A peer lost in the check
        is recovered from as in a step's settle; the group re-formed has agreed on one state
        (``membership.agree``), so nothing is left to compare, and every member goes on to the
        next step's collectives, including one whose check completed before the failure."""
        session = self.session
        if not (self.every and due and session.world_size > 1):
            return
        found_at = (time.time(), time.monotonic())
        for attempt in range(4):
            if session.agreed_step >= step:  # (re-formed at this boundary, or the state copied holds it)
                return
            peers = session.groups.peers
            fresh = max(self.alike_step, session.agreed_step) >= step  # (alike in this step's sum)
            try:
                if peers is None:
                    raise ConnectionResetError("the process group is gone: connection to peers broken")
                session.progress.at(step, Phase.COLLECTIVE, "replica_check")
                found = replicacheck.check(peers, self.train, fresh, abandoned)
                if found is not None:
                    self._repaired(step + 1, found, found_at)
                return
            except ReplicasDiverged as exc:
                self._diverged(step, exc)
            except Exception as exc:
                session.recoverable(exc, last=attempt == 3)
            try:
                session.rejoin(self.model, self.optimizer)  # (outside the except block: see steploop)
            except StopRequested:
                return  # it stops at this boundary: its final save is of a state not checked
        raise AssertionError("unreachable")  # (the last attempt's failure is raised)

    # ------------------------------------------------------------------ what is recorded
    def _diverged(self, step: int, exc: ReplicasDiverged) -> NoReturn:
        """No live state is trusted: traced, and raised on (every rank raises it)."""
        self.session.trace("replicas_diverged", step=step, odd=sorted(exc.odd), why=str(exc))
        raise exc

    def _repaired(self, step: int, found: Verdict, found_at: tuple[float, float]) -> None:
        """The odd replicas took the majority's state before ``step`` computed from theirs (or,
        found in its sum, before anything of it was applied): traced, and reported as an
        incident already undone (``numericstep.report_undone``)."""
        odd = sorted(found.odd)
        self.session.trace("replica_repaired", step=step, odd=odd, source=found.source, why=found.why)
        outcome = numerics.Outcome.REPAIRED
        numericstep.report_undone(self.session, step, "odd_replica", outcome, found.odd, found.why, found_at)
