"""The user's own loop under the session:

    loader = session.loader(dataset, global_batch, batch_size=micro_batch, seed=seed)
    for step in session.steps(model, optimizer):
        for batch in loader:
            loss_fn(model, batch).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
        optimizer.step()
        optimizer.zero_grad()

The inner loop is where recovery lives. Iterating the loader yields this rank's micro-batches
of the step; their gradients accumulate as backward leaves them and are weighted by their share
of the global batch once, in the buffers being reduced (so ``loss.backward()`` needs no
``/ accumulation`` and no extra pass over the gradients); the buckets of the last
micro-batch's backward are all-reduced as it runs (``gradsync.Buckets``); and when the loop asks
for the next batch after the last one, the loader waits for the reduction. If a peer failed,
the loader re-forms the group with the survivors, deals them the samples nobody holds, and
yields those micro-batches too: the user's ``backward()`` computes them, and only then does
the loop end, with the gradients of exactly the step's global batch reduced. So everything
after the inner loop (clipping, ``optimizer.step()``) sees what it would see after DDP's
backward, and the step is exact. A loop with no micro-batch loop of its own (one
``loss.backward()`` per step) cannot do this: the survivors must compute a departed rank's
micro-batches, and only the user's code knows how. What a loop could do inside that would make
its result depend on the number of workers (a ``zero_grad`` between micro-batches, a second
backward, gradients clipped inside the loop...) is refused where it happens: ``loopguard.py``.
"""

from __future__ import annotations

import enum
import functools
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import torch

from unicron.core.protocol import Phase
from unicron.train import gradsync, metric, numerics, numericstep, replicas, sharded, shardsync
from unicron.train.data import shard, unclaimed_share
from unicron.train.iteration import Iteration, PeerLostError, StopRequested
from unicron.train.loader import StepData
from unicron.train.loopguard import LoopGuard
from unicron.train.membership import settle
from unicron.train.noupdate import NoUpdate
from unicron.train.numerics import WrongSum
from unicron.train.peers import Peers
from unicron.train.replicacheck import StateUnlike
from unicron.train.replicastep import ReplicaStep
from unicron.train.state import step_schedulers
from unicron.train.sumtest import SumTest

if TYPE_CHECKING:
    from unicron.train.session import Session


class StepPhase(enum.Enum):
    """Where the current step is, as the loader and the optimizer's pre-step check see it."""

    COMPUTING = "computing"  # micro-batches being yielded; the gradients are this rank's own
    REDUCED = "reduced"  # the loader ran out: the gradients hold the step's global batch
    # With nothing to apply (``noupdate.py``):
    COPIED = "copied"  # recovery took state that already holds this step
    SKIPPED = "skipped"  # its data at fault, skipped (``run.on_bad_data: skip``)
    ABANDONED = "abandoned"  # asked to stop with the step's reduction broken


class Loader:
    """What ``session.loader(...)`` returns: iterate it once per step, inside
    ``session.steps(...)``; it yields this rank's micro-batches of that step, as the user's
    ``collate_fn`` builds them, and ends once the step's gradients are reduced."""

    def __init__(self, session: Session, data: StepData) -> None:
        self._session, self.data = session, data

    def __iter__(self) -> Iterator[Any]:
        loop = self._session.running
        if loop is None:
            raise RuntimeError(
                "iterate the loader inside `for step in session.steps(model, optimizer):` (it "
                "yields the micro-batches of the step in progress)"
            )
        return loop.micro_batches()


class StepLoop:
    """One ``session.steps(model, optimizer)`` loop: the step in progress, its share of the
    samples, the gradient weighting and buckets; the session's group operations do the rest."""

    def __init__(
        self, session: Session, model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: StepData
    ) -> None:
        self.session, self.model, self.optimizer, self.data = session, model, optimizer, data
        self.phase = StepPhase.REDUCED
        self.chunks: list[list[int]] = []  # this rank's micro-batches of the step (sample ids)
        self.it = Iteration(0)
        # A full micro-batch's share of the step's samples: the factor the accumulated gradients
        # get once, in the reduction (a shorter micro-batch's gradients are pre-weighted).
        self.scale = 1.0
        self.buckets: gradsync.Buckets | None = None
        self.no_update: NoUpdate | None = None  # a COPIED or ABANDONED step's, until it ends
        self.settled_step = 0  # the last step in which a re-formed group settled its samples
        # When this step and the one before began (monotonic), with the generation each began in.
        self.began: list[tuple[int, float]] = []
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.handles = [optimizer.register_step_pre_hook(self._check_reduced)]
        self.sharded = sharded.is_sharded(model)
        self.fsdp_units = sharded.fsdp_modules(model)
        if self.sharded:
            sharded.prepare(model)
            held, whole = sharded.sizes(model)
            session.trace("sharded", parameters=held, of=whole)  # this rank's share of the model
        # With replicas of several ranks, micro-batches are weighed at the outputs (sharded.py).
        self.outputs = sharded.OutputWeight(model) if session.groups.replicated else None
        replicated = self.sharded and session.groups.replicated
        self.unit_sums = shardsync.UnitSums(model) if replicated else None
        # What would train differently at another world size is refused (``loopguard.py``).
        self.guard = LoopGuard(model, optimizer, session.extras, self.sharded)
        self.metrics = session.metrics
        # The step's gradient sum is tested before it is applied (``numerics.py``): finite, and no
        # spike in its norm or in a checked metric's value (``sumtest.py``); not yet for replicas
        # of several ranks, whose sums go through ``replicas.py``.
        contract = session.contract
        self.checks_sum = contract.check_finite and not session.groups.replicated
        windows = session.spike_windows  # (a checkpoint's: judged from the first step)
        self.tests = SumTest(contract.spike_window, contract.spike_factor, self.metrics, windows)
        self.judging_spikes = True  # (not when a spike the data gives is applied: ``numericstep``)
        self.computed: list[int] = []  # the samples whose gradients this rank holds in the step
        self.passing: dict[int, tuple[int, int]] = {}  # rank -> (generation, step): its last passing fault
        self.skips = contract.on_bad_data == "skip"  # a step whose data is at fault: skipped, or the end
        self.skipped: tuple[int, int] | None = None  # (generation, step) of the last step skipped
        self.poisoned = False  # the step's injected NaN, if any, put in (once per computation)
        self.checking = self.checks_sum  # in this step (``begin``)
        # The replicas' parameters compared in the step's sum, and their whole states before a
        # checkpoint (``replicastep.py``; not yet for replicas of several ranks, as the sum's test).
        every = 0 if session.groups.replicated else contract.digest_every
        self.replicas = ReplicaStep(session, model, optimizer, every)

    def _weigh(self, relative: float) -> list[Any]:
        """Hooks weighting the next backward's gradients by ``relative``, a micro-batch's samples
        over a full one's (none for a full one)."""
        if relative == 1:
            return []
        if self.outputs is not None:
            self.outputs.weight = relative
            return [_Restore(self.outputs)]
        return [p.register_hook(lambda grad: grad * relative) for p in self.params]  # type: ignore[no-untyped-call]

    def _check_reduced(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        if self.phase is StepPhase.COMPUTING:
            raise RuntimeError(
                "optimizer.step() before the loader ran out: call it after `for batch in loader:` "
                "ends (the loader ends once the step's gradients are reduced over the ranks)"
            )

    def close(self) -> None:
        self._release()
        self.guard.close()
        for each in self.metrics:
            each.guard = None
        for handle in self.handles:
            handle.remove()
        if self.outputs is not None:
            self.outputs.close()

    # ------------------------------------------------------------------ step boundaries
    def begin(self, step: int, changed: bool) -> bool:
        """Get ``step`` ready: a planned membership change first (``changed``: the coordinator
        posted one), then this rank's share. False: the state (taken from a replica) already
        holds it."""
        session = self.session
        try:
            if changed:
                # A planned change (a newcomer, a resize) takes effect at a step boundary: no work lost.
                session.rejoin(self.model, self.optimizer)
            chunks = self._settle(step)
        except StopRequested:
            return False  # the worker stops at this boundary (``Session.steps``)
        if chunks is None:
            return False
        self.chunks, self.phase = chunks, StepPhase.COMPUTING
        stream = self.data.stream
        self.scale = stream.micro_batch / len(stream.batch(step))
        self.it = Iteration(step, len(chunks), lambda: session.faults.before_last_micro_batch(step))
        self.computed, self.poisoned = [], False
        # A registered GradScaler makes the sum infinite on purpose (its scale too high) and
        # skips that step itself: such a sum is its to handle, not a fault.
        self.checking = self.checks_sum and not any(
            isinstance(obj, torch.amp.GradScaler) and obj.is_enabled() for obj in session.extras.values()
        )
        self.began = [*self.began[-1:], (session.generation, time.monotonic())]
        session.faults.step_started(step)  # inside the step's time: a slowed rank computes slowly
        self.guard.step_began()
        return True

    def end(self, step: int) -> None:
        """The user's step is done: count it, step the registered schedulers, checkpoint."""
        session = self.session
        if self.phase is StepPhase.COMPUTING:
            raise RuntimeError(
                f"step {step} ended before its micro-batches did: iterate `for batch in loader:` "
                "to the end in every step (the loader reduces the gradients as it ends)"
            )
        self.guard.step_ended()
        self._release()
        if self.phase is StepPhase.ABANDONED:
            return  # not done: the worker stops at the boundary before it (``Session.steps``)
        session.step = step
        if self.phase in (StepPhase.REDUCED, StepPhase.SKIPPED):  # (a skipped step counts)
            with self.guard.stepping_schedulers():
                step_schedulers(session.extras, step - 1)
        session.faults.updated(step, self.params)
        due = session.saving.periodic(step) or step == session.iterations  # (before its checkpoint)
        self.replicas.check_at_end(step, due, self._abandon_watch())
        session.channel.send_soon(self.it.report(session.task, session.generation, session.rank))
        session.maybe_checkpoint(self.model, self.optimizer)

    def _settle(self, step: int) -> list[list[int]] | None:
        """This rank's samples of ``step``, at its start. After a group (re)formed this is the
        members' first collective: a peer failing in it (a newcomer that dies or hangs at once)
        is recovered from in-process like a failure in the all-reduce."""
        for attempt in range(4):
            if self.session.step >= step:
                return None
            try:
                return self._my_part(step, held=[])
            except Exception as exc:
                self.session.recoverable(exc, last=attempt == 3)
            self.session.rejoin(self.model, self.optimizer)  # outside the except block: see micro_batches
        raise AssertionError("unreachable")

    def _my_part(self, step: int, held: list[int]) -> list[list[int]]:
        """This rank's samples of ``step``. Right after the group was (re)formed, members tell
        each other which of the step's samples they already hold (the ledger: accumulated in
        gradients, not yet reduced; nothing for a member that was at the step boundary or is
        new) and share out the rest; else the step's samples are split evenly. A shard formula
        cannot do this: with a failure during recovery, or a member that saw the new membership
        at the boundary while another was inside the step, what each holds is not its old shard."""
        session, ids = self.session, self.data.stream.batch(step)
        groups, micro = session.groups, self.data.stream.micro_batch
        if groups.replicated:
            return self._replica_part(step, ids, held)
        if session.world_size == 1:
            # Alone (a group shrunk to one): nobody to settle with; what this rank holds is
            # kept, and it computes the rest of the step.
            session.settle_pending = False
            return _split(unclaimed_share(ids, [held], 0, 1), micro)
        if not session.settle_pending or groups.peers is None:
            return _split(shard(ids, session.rank, session.world_size), micro)
        session.settle_pending = False
        session.progress.at(step, Phase.COLLECTIVE, "settle")
        mine, held_counts = settle(groups.peers, ids, held)
        session.trace("ledger", step=step, held=held_counts, mine=len(mine))
        self.settled_step = step
        return _split(mine, micro)

    def _replica_part(self, step: int, ids: list[int], held: list[int]) -> list[list[int]]:
        """As ``_my_part``, with replicas of several ranks: samples are dealt to replicas (the
        peers), then to the replica's ranks in micro-batches they all run together."""
        session, groups = self.session, self.session.groups
        peers, replica, layout = groups.peers, groups.replica, groups.layout
        if peers is None or replica is None or layout is None:
            raise ConnectionResetError("the process group is gone: connection to peers broken")
        if session.settle_pending:
            session.settle_pending = False
            session.progress.at(step, Phase.COLLECTIVE, "settle")
            mine, held_counts = replicas.settle(replica, peers, ids, held)
            session.trace("ledger", step=step, held=held_counts, mine=len(mine))
            self.settled_step = step
        else:
            mine = replicas.replica_share(ids, peers.rank, peers.size)
        return replicas.micro_batches(mine, layout.position, layout.size, self.data.stream.micro_batch)

    # ------------------------------------------------------------------ inside a step
    def micro_batches(self) -> Iterator[Any]:
        """This rank's micro-batches of the step in progress; then the reduction and, if a peer
        fails, the re-formed group's share of what nobody holds (see the module's docstring)."""
        if self.phase is not StepPhase.COMPUTING:
            raise RuntimeError("the loader was iterated twice in one step: iterate it once per step")
        self.guard.loader_began()
        for each in self.metrics:
            each.begin(self.guard)
        try:
            yield from self._micro_batches()
        finally:
            self.guard.loader_ended()

    def _micro_batches(self) -> Iterator[Any]:
        step, session = self.it.step, self.session
        yield from self._chunks(self.chunks, arm=self._overlap(step))
        contributed = [i for chunk in self.chunks for i in chunk]
        self._before_reduce(step)
        mended = False  # a replica mended in the step: one more attempt, and no second mend
        for attempt in range(5):
            last = attempt == (4 if mended else 3)
            wrong: tuple[str, bool] | None = None  # how the sum was wrong, and whether a spike
            unlike = False  # the replicas' parameters differed in it
            try:
                session.progress.at(step, Phase.COLLECTIVE, "all_reduce", len(self.it.marks))
                self._reduce()
                break
            except WrongSum as exc:
                wrong = (str(exc), exc.spike)  # (not the exception: its frames hold the buffers)
            except StateUnlike:
                unlike = True
            except Exception as exc:
                session.recoverable(exc, last=last)
            if unlike:  # (outside the except block, as below)
                odd = self.replicas.mend(step, last, again=mended)
                if odd is not None:
                    mended = True
                    if session.rank in odd:  # its state replaced: its share computed again from it
                        yield from self.recompute(step, contributed)
                    continue
            if wrong is not None:  # (outside the except block, as below)
                held = yield from numericstep.recover(self, step, contributed, *wrong, last=last)
                if held is numericstep.Done.APPLIED:
                    break  # a right sum, written back: the step goes on
                if held is numericstep.Done.SKIPPED:
                    self._skip(step, contributed)
                    return
                contributed = held  # a peer left (a device at fault) or failed: recover in place
            # Outside the except block: the exception's frames (inside torch.distributed) would
            # keep the failed group alive, and its sockets open, so peers would never notice.
            try:
                copied = session.rejoin(self.model, self.optimizer)
            except StopRequested:
                self._abandon(step)
                return
            self.it.resumed_at = time.time()  # the transition is over: the re-formed group computes
            if copied:
                # Members disagreed: state came from a replica; what was accumulated is void.
                for p in self.model.parameters():
                    p.grad = None
                self.guard.state_replaced()
                for each in self.metrics:
                    each.void()
                if session.step >= step:
                    # The copied state holds this step: a replica finished its reduction in the
                    # group this rank last contributed to (a newer group would have had this rank
                    # in it), and a reduction finished anywhere holds every member's gradients.
                    if contributed:
                        session.trace("samples", step=step, ids=contributed)
                    self.phase, self.no_update = StepPhase.COPIED, self._no_update()
                    return
                contributed = []
            # Survivors keep what they computed; the samples nobody holds are shared out.
            mine = self._my_part(step, held=contributed)
            session.trace("recompute", step=step, samples=sum(len(chunk) for chunk in mine))
            self.it.recomputed += len(mine)
            yield from self._chunks(mine, arm=None)
            contributed += [i for chunk in mine for i in chunk]
        else:
            raise AssertionError("unreachable")
        session.trace("samples", step=step, ids=contributed)  # the ledger: reduced, so in the step
        self.phase = StepPhase.REDUCED
        session.faults.after_reduce(step)

    def _before_reduce(self, step: int) -> None:
        """On the way into a gradient sum of the step: the faults injected there (a NaN once
        per computation of the step, though this is called in the last backward and again
        after the micro-batches when the sum overlaps backward)."""
        self.session.faults.before_reduce(step)
        if not self.poisoned:
            self.poisoned = True
            self.session.faults.poison(step, self.computed, self.params, self.tests.checked_metrics)

    def recompute(self, step: int, ids: list[int]) -> Iterator[Any]:
        """This rank's gradients of the step void, then the samples ``ids`` computed again by the
        user's loop (not counted again: the step trains on them once), up to the sum
        (``numericstep.py``)."""
        self._discard()
        yield from self._chunks(_split(ids, self.data.stream.micro_batch), arm=None, counted=False)
        self._before_reduce(step)

    def reduce(self, spikes: bool = True) -> None:
        """The step's gradient sum (``WrongSum``: wrong, nothing written back; ``spikes``: False
        to take a spike, a NaN or an Inf still not)."""
        self.judging_spikes = spikes
        try:
            self._reduce()
        finally:
            self.judging_spikes = True

    def own_wrong(self) -> bool:
        """Whether this rank's own share of the sum (its gradients, not yet written over by a
        sum, and its checked metrics' sums) is wrong: not finite, or alone over the limit the
        last sum was judged by (``sumtest.py``)."""
        own = numerics.gradients_norm(self.params) * self.scale
        return self.tests.own_wrong(own, self._samples() if self.tests.checked else 1)

    def _samples(self) -> int:
        """The step's samples, over which its metrics' sums are averaged."""
        return len(self.data.stream.batch(self.it.step))

    def _offers_limit(self) -> bool:
        return self.checking and self.tests.judges_spikes

    def spike_windows(self) -> dict[str, list[float]]:
        """The values spikes are judged by now (``sumtest.py``), oldest first: what a checkpoint
        holds for a relaunch; none where the sums are not judged."""
        return self.tests.windows() if self.checks_sum else {}

    def _offer(self, sums: torch.Tensor | None) -> torch.Tensor | None:
        """The metrics' sums (float64) with, appended, to be summed with them: this rank's spike
        limits (``sumtest.py``: every rank judges by the mean of the limits offered), and its
        parameters' fingerprint where compared (``replicacheck.offer``)."""
        parts = [] if sums is None else [sums]
        if self._offers_limit():
            parts.append(torch.tensor(self.tests.offer(), dtype=torch.float64, device=self.session.device))
        parts += self.replicas.offer(self.session.device)
        return torch.cat(parts) if parts else None

    def _check_sum(self, offered: torch.Tensor | None, norm_of: Callable[[], float]) -> None:
        """The tests of the step's gradient sum, before it is written back (``norm_of``: its norm,
        taken only where it is tested;
        ``offered``: what ``_offer`` made, summed over the ranks): the replicas' parameters
        unlike in it (``StateUnlike``); its norm or a checked metric's value not finite, or a
        spike (``WrongSum``). Each applied joins its window."""
        limits = self.tests.offered if self._offers_limit() else 0
        summed = [] if offered is None else offered.tolist()
        tail = summed[len(summed) - limits - self.replicas.offered :]
        self.tests.agree(tail[:limits])  # (first: the rung judges shares by them)
        self.replicas.judge(tail[limits:], self.it.step)
        if not self.checking:
            return
        # (the step's samples read only where a checked metric is averaged over them)
        values = self.tests.values(summed, self._samples()) if self.tests.checked else {}
        self.tests.judge(norm_of(), values, spikes=self.judging_spikes)

    def _discard(self) -> None:
        """What this rank accumulated in the step is void: computed again."""
        for p in self.model.parameters():
            p.grad = None
        self.guard.state_replaced()
        for each in self.metrics:
            each.void()
        self.computed, self.poisoned = [], False

    def _skip(self, step: int, contributed: list[int]) -> None:
        """The step's data is at fault and the task skips it: no update, its samples (this
        rank's share of them) recorded as skipped, in the ledger's place. It still counts: the
        registered schedulers step at its end, so the schedule follows the step count."""
        self._discard()
        self.it.samples = 0  # (nothing trained: no throughput to count)
        self.session.trace("skipped", step=step, ids=contributed)
        self.phase, self.no_update = StepPhase.SKIPPED, self._no_update()

    def _abandon(self, step: int) -> None:
        """Asked to stop with this step's reduction broken: peers that took the request at the
        boundary before it left the group, so no rank completes the step. Nothing of it is
        applied (``noupdate.py``) or recorded, and the worker stops at
        the last step it completed, saving it as its peers did; were it to wait for a group
        instead, the stop's SIGKILL would find it there and its checkpoint unwritten."""
        self.session.trace("abandoned", step=step)
        self.phase, self.no_update = StepPhase.ABANDONED, self._no_update()

    def _no_update(self) -> NoUpdate:
        return NoUpdate(self.model, self.optimizer, self.session.extras)

    def _release(self) -> None:
        """The user's code after a step with no update has run: the optimizer steps again."""
        held, self.no_update = self.no_update, None
        if held is not None:
            held.release()

    def _chunks(
        self, chunks: list[list[int]], arm: Callable[[], None] | None, counted: bool = True
    ) -> Iterator[Any]:
        # ``counted``: the samples count as the step's (not when computed again to check a sum
        # that was not finite: the step trains on them once).
        # Each sample's gradient counts 1/B (B: the step's samples, fewer in an epoch's last step
        # without drop_last): the SUM over ranks is then the global mean for any number of
        # ranks, and work can move between ranks without rescaling. A full micro-batch's mean-loss
        # gradient gets its factor (`scale`) in the reduction; a shorter one is pre-weighted by
        # its size relative to a full one, by a hook held only while its backward runs.
        # An empty micro-batch (a replica's rank with no sample left in the last round) computes a
        # sample of the step weighed 0, to run FSDP's collectives with its replica-mates.
        stream, it = self.data.stream, self.it
        if arm is not None and not chunks:
            arm()  # nothing to compute, but the same collectives as the others
        for index, chunk in enumerate(chunks):
            last = index == len(chunks) - 1
            if arm is not None and last:
                arm()  # the last micro-batch: its backward reduces the gradient buckets
            if self.sharded:
                sharded.sync_gradients(self.fsdp_units, last)  # FSDP reduce-scatters at the last only
            self.session.progress.at(it.step, Phase.COMPUTE, micro_batch=len(it.marks))
            self.computed += chunk
            hooks = self._weigh(len(chunk) / stream.micro_batch)
            self.guard.handing(len(chunk))
            try:
                yield self.data.fetch(chunk or stream.batch(it.step)[:1])
            finally:
                for hook in hooks:
                    hook.remove()
            self.guard.returned()
            it.record(len(chunk) if counted else 0)  # the user's backward of this micro-batch is done

    def _overlap(self, step: int) -> Callable[[], None] | None:
        """Arms the gradient buckets for the step's last micro-batch, or None: a world of one, or
        a step in which the group settled who holds what (it re-formed: every member knows, as
        the settle is their first collective, so all reduce one flat buffer: collectives match)."""
        session = self.session
        peers = session.groups.peers
        if session.world_size == 1 or self.settled_step == step or peers is None:
            return None
        if session.groups.replicated:
            return self._overlap_units(step, peers)
        self.buckets = gradsync.Buckets.of(self.model, self.buckets)
        self.buckets.before_first = lambda: self._before_reduce(step)
        buckets, scale = self.buckets, self.scale
        return lambda: buckets.arm(peers, scale)

    def _overlap_units(self, step: int, peers: Peers) -> Callable[[], None] | None:
        """As ``_overlap`` for a sharded model (``shardsync``): only with several replicas, each
        with a sample to run a backward on (else some would launch sums that others never match)."""
        sums = self.unit_sums
        if sums is None or not sums.usable or len(self.data.stream.batch(step)) < peers.size:
            return None
        if peers.size == 1:
            return None  # one replica: nothing to sum across (replicas.reduce only weighs)
        sums.before_first = lambda: self._before_reduce(step)
        scale = self.scale

        def arm() -> None:
            if sums.can_arm():  # the same on every rank: they run the same program
                sums.arm(peers, scale)

        return arm

    def _reduce(self) -> None:
        """Sum the gradients over the ranks (``gradsync``); abandoned once the coordinator posts
        a recovery's membership (a peer declared dead or hung, or a reattempt), when this rank
        recovers in place."""
        session = self.session
        watch = self._abandon_watch()
        groups = session.groups
        self.replicas.take(self.it.step)  # (the parameters' fingerprint, where compared)
        # The metrics' sums (a copy: a failed attempt leaves this rank's own for the next one).
        sums = self._offer(metric.sums(self.metrics, session.device))
        checks = self.checking or self.replicas.offered > 0
        check = functools.partial(self._check_sum, sums) if checks else None
        if groups.replicated:
            if groups.peers is None or groups.replica is None:
                raise ConnectionResetError("the process group is gone: connection to peers broken")
            if self.unit_sums is not None and self.unit_sums.armed:
                self.unit_sums.finish(groups.replica, watch)  # launched during the last backward
            else:
                replicas.reduce(self.model, self.sharded, groups.replica, groups.peers, watch, self.scale)
        elif session.world_size == 1:  # nothing to sum: only the weighting
            if check is not None:
                check(lambda: numerics.gradients_norm(self.params) * self.scale)
            with torch.no_grad():
                for p in self.params:
                    if p.grad is not None:
                        p.grad.mul_(self.scale)
        elif self.buckets is not None and self.buckets.armed:
            self.buckets.finish(watch, sums, check)  # launched during the last backward
        else:
            gradsync.all_reduce_gradients(self.model, groups.peers, watch, self.scale, sums, check)
        metric.reduced(self.metrics, sums, len(self.data.stream.batch(self.it.step)))
        if self._maybe_abandoned() and session.declared_failed():
            # Declared failed (hung, or its node lost) during the step: its peers abandoned the
            # collective and re-formed without it (what completed here, if anything, is their
            # abandoned buffers), or a lone worker's newcomers went on without it. The step is
            # not this worker's: it leaves (rejoin: it is in no later membership) and neither
            # records the step nor checkpoints it.
            raise PeerLostError("this worker was declared failed during the step")

    def _abandon_watch(self) -> Callable[[], bool] | None:
        """Whether the coordinator posted a recovery meanwhile, for a collective to be abandoned
        on (``gradsync.wait_or_abandon``); None without in-process recovery."""
        session = self.session
        store, generation = session.store, session.generation
        return None if not session.in_process or store is None else lambda: store.abandons_step(generation)

    def _maybe_abandoned(self) -> bool:
        session = self.session
        return maybe_abandoned(
            session.world_size, session.groups.replicated, self.began, session.generation, time.monotonic()
        )


def maybe_abandoned(
    world_size: int, replicated: bool, began: list[tuple[int, float]], generation: int, now: float
) -> bool:
    """Whether peers may have abandoned the step's reduction that completed here, so that this
    rank must ask the store whether it was declared failed meanwhile (``began``: the generation
    and monotonic start of the step before and of this one). Always alone (a lone worker's
    newcomers go on without it, with no collective to abandon), in replicas of several ranks,
    and where the group re-formed since the step before began; else only where that step began
    long enough ago (``gradsync.none_abandoned``)."""
    if world_size == 1 or replicated or len(began) < 2:
        return True
    if any(g != generation for g, _ in began):
        return True  # re-formed since the step before began
    return not gradsync.none_abandoned(now - began[0][1])


def _split(ids: list[int], micro: int) -> list[list[int]]:
    """``ids`` in micro-batches of ``micro`` (the last one shorter)."""
    return [ids[start : start + micro] for start in range(0, len(ids), micro)]


class _Restore:
    """Puts the output weight back to 1 once the micro-batch's backward is done."""

    def __init__(self, outputs: sharded.OutputWeight) -> None:
        self.outputs = outputs

    def remove(self) -> None:
        self.outputs.weight = 1.0
