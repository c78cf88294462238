"""Generations: in-place shrinks and grows carried out, and those under way.

A generation is one membership of a task's workers. Survivors of a failure, or the members a
planned shrink keeps, form the next generation without restarting (they rebuild their process
group from the membership posted in the task's store); newcomers of a grow join live members at
a step boundary and take their state from them. The arithmetic and the effects are pure
(``brain/membership.py``: ``survivors``, ``planned_shrink``, ``grow``); :class:`Generations`
applies them through the applier and holds the grows and leavers under way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from unicron.brain import membership
from unicron.brain.effects import Effect, Record
from unicron.brain.membership import Growth, Shrink, given_up, joined, planned_shrink_effects
from unicron.brain.records import TaskRecord
from unicron.brain.snapshot import Snapshot
from unicron.control.context import Context
from unicron.core.kept import GrowInFlight, InFlight, Leaving
from unicron.core.protocol import ExitReport, ready_key
from unicron.core.states import WorkerPhase


def acts(effects: Sequence[Effect]) -> list[Effect]:
    """``effects`` but their events."""
    return [e for e in effects if not isinstance(e, Record)]


def records(effects: Sequence[Effect]) -> list[Effect]:
    """The events among ``effects``: recorded once what is under way is kept (a successor that
    reads the event finds the grow or the leavers it names)."""
    return [e for e in effects if isinstance(e, Record)]


class GrowthVerdict(Enum):
    """What a grow under way comes to at a tick (:func:`growth_verdict`)."""

    WAIT = "the newcomers are getting ready"
    JOIN = "every newcomer is ready: the members let them in"
    FORGET = "its task no longer runs"
    TRAINING_ENDED = "training ended"  # the members will not come to another step boundary
    NOT_READY = "the newcomers were not ready in time"


def growth_verdict(
    growth: Growth,
    task: TaskRecord | None,
    iterations: int,
    ready: Callable[[], bool],
    now: float,
    launch_timeout_s: float,
) -> GrowthVerdict:
    """What ``growth`` comes to now: ``task`` its task's row (None: gone), ``iterations`` its
    steps to train, ``ready`` whether every newcomer said it is ready (asked only when it
    matters: it reads the task's store). Pure but for ``ready``."""
    if task is None or not task.state.active:
        return GrowthVerdict.FORGET
    if task.step >= iterations:
        # Training is over: the members will not come to another step boundary to let the
        # newcomers in (they save and exit), so the newcomers would wait for nothing.
        return GrowthVerdict.TRAINING_ENDED
    if ready():
        return GrowthVerdict.JOIN
    if now - growth.since > launch_timeout_s:
        return GrowthVerdict.NOT_READY
    return GrowthVerdict.WAIT


@dataclass
class Generations:
    """Carries membership changes out and holds those under way: the grows whose newcomers
    have not joined yet, the leavers of a planned shrink. Both are kept in the store
    (``core/kept.py:InFlight``) whenever they change, so a successor carries them on."""

    ctx: Context
    growing: dict[str, Growth] = field(default_factory=dict)  # task -> newcomers not yet joined
    # (task, generation, rank) -> deadline: workers a planned shrink let go, exiting by themselves
    leaving: dict[tuple[str, int, int], float] = field(default_factory=dict)

    def in_flight(self) -> InFlight:
        grows = [
            GrowInFlight(
                task=t, generation=g.generation, membership=g.membership, newcomers=g.newcomers, since=g.since
            )
            for t, g in sorted(self.growing.items())
        ]
        leaving = [
            Leaving(task=t, generation=g, rank=r, due=due) for (t, g, r), due in sorted(self.leaving.items())
        ]
        return InFlight(grows=grows, leaving=leaving)

    def _keep(self) -> None:
        self.ctx.act.keep(self.in_flight())

    def restore(self, kept: InFlight) -> None:
        """What a predecessor had under way, for the tasks still live: a grow only while its
        generation is still ahead of the task's (it was neither committed nor given up)."""
        store = self.ctx.store
        for grow in kept.grows:
            task = store.task(grow.task)
            if task is not None and task.state.active and grow.generation > task.generation:
                self.growing[grow.task] = Growth(
                    grow.generation, grow.membership, list(grow.newcomers), grow.since
                )
        self.leaving = {(w.task, w.generation, w.rank): w.due for w in kept.leaving}

    def forget(self, name: str) -> None:
        """Nothing of the task is under way any more (its grow joined, or it no longer runs)."""
        if self.growing.pop(name, None) is not None:
            self._keep()

    def task_ended(self, name: str) -> None:
        """The task ended. A grow under way is given up, its newcomers stopped and their rows
        ended: the task's own stop reaches only its current generation, and their rows would
        hold their slots until the launch time-out (a plan waited two minutes for one in the
        soak)."""
        if name in self.growing:
            self._drop_growth(name, "task_grow_cancelled", "its task ended")

    def growth(self, name: str) -> Growth | None:
        """The task's grow under way (newcomers not yet joined), if any."""
        return self.growing.get(name)

    def growing_tasks(self) -> list[str]:
        return list(self.growing)

    def in_place(self, name: str) -> bool:
        """Whether the task's membership may change in place now."""
        return self.ctx.spec(name).run.recovery == "in_process" and name not in self.growing

    def shrink_planned(self, snapshot: Snapshot, name: str, shrink: Shrink, reason: str) -> None:
        """Give up workers the plan takes from a running task, in place (``moves.move_for``
        decided ``shrink``; its effects: ``membership.planned_shrink_effects``). The leavers
        go at their next step boundary; one that does not is stopped."""
        task, now = snapshot.task(name), self.ctx.clock()
        effects = planned_shrink_effects(task, len(snapshot.live(name)), shrink, reason)
        self.ctx.act.apply(acts(effects), now)
        for w in shrink.left:
            self.leaving[w.key] = now + self.ctx.limits.hang_cap_s
        self._keep()
        self.ctx.act.apply(records(effects), now)  # (said once what is under way is kept)

    def grow(
        self,
        snapshot: Snapshot,
        name: str,
        placement: dict[str, int],
        reason: str,
        spares: list[tuple[int, str, int]],
    ) -> tuple[int, ...]:
        """Newcomers for the task's next generation (``membership.grow``: hot spares first, then
        new processes), carried out; the grow is under way until they join. Returns the spares
        used."""
        ctx, now = self.ctx, self.ctx.clock()
        task, generation = snapshot.task(name), snapshot.next_generation[name]

        def launch(world: int) -> tuple[list[str], dict[str, str]]:
            env = ctx.worker_env(name, generation, world, task.store_port, joining=True)
            return list(ctx.spec(name).run.program), env

        decided = membership.grow(
            task, snapshot.live(name), generation, placement, spares, launch, reason, now
        )
        ctx.act.apply(acts(decided.effects), now)
        self.growing[name] = decided.growth
        self._keep()
        ctx.act.apply(records(decided.effects), now)  # (said once what is under way is kept)
        return decided.spares_used

    def cancel_growth(self, name: str) -> None:
        """A failure struck while newcomers were waiting to join: they are stopped (the next
        plan may grow the task again)."""
        if name in self.growing:
            self._drop_growth(name, "task_grow_cancelled", "a failure struck first")

    def newcomer_exited(self, report: ExitReport) -> None:
        """A newcomer still waiting to join ended (``brain/routing.py``): the grow is given up
        at once (its members never counted on it), rather than at the launch time-out with the
        slot held meanwhile."""
        how = f"signal {report.signal}" if report.signal is not None else f"code {report.code}"
        phase = WorkerPhase.EXITED if report.code == 0 else WorkerPhase.FAILED
        self.ctx.act.worker_phase(
            (report.task, report.generation, report.rank), phase, code=report.code, signal=report.signal
        )
        self._drop_growth(
            report.task, "task_grow_failed", f"newcomer rank {report.rank} on {report.node} exited ({how})"
        )

    def check_growth(self, name: str, now: float) -> bool:
        """Carry out what the task's grow under way comes to (:func:`growth_verdict`); True when
        the task grew."""
        growth = self.growing[name]
        task = self.ctx.store.task(name)
        keys = [ready_key(name, growth.generation, r) for r in growth.newcomers]
        iterations = self.ctx.spec(name).run.iterations if task is not None else 0
        limit = self.ctx.limits.launch_timeout_s
        verdict = growth_verdict(
            growth, task, iterations, lambda: self.ctx.act.rendezvous.ready(name, keys), now, limit
        )
        if verdict is GrowthVerdict.FORGET:
            self.forget(name)
        elif verdict in (GrowthVerdict.TRAINING_ENDED, GrowthVerdict.NOT_READY):
            self._drop_growth(name, "task_grow_failed", verdict.value)
        elif verdict is GrowthVerdict.JOIN and task is not None:
            live = self.ctx.store.workers(name, task.generation, live=True)
            self.ctx.act.apply(joined(task, growth, live, now), now)
            self.forget(name)
            return True
        return False

    def _drop_growth(self, name: str, event: str, why: str) -> None:
        """Give a grow up: stop exactly its newcomers (a generation-wide stop would reach the
        members too: it stops every generation up to the one named)."""
        growth = self.growing.pop(name)
        self._keep()
        newcomers = self.ctx.store.workers(name, growth.generation, live=True)
        self.ctx.act.apply(given_up(name, growth, newcomers, event, why), self.ctx.clock())

    def is_leaving(self, key: tuple[str, int, int], now: float) -> bool:
        due = self.leaving.get(key)
        return due is None or now < due

    def forget_left(self, now: float) -> None:
        left = {k: due for k, due in self.leaving.items() if due > now - 60.0}
        if len(left) != len(self.leaving):
            self.leaving = left
            self._keep()

    def orphaned_newcomers(self) -> None:
        """After a coordinator restart: workers of a generation ahead of their task's that no
        grow under way will let in (the predecessor stopped between launching them and keeping
        their grow) are stopped; the planner may grow again."""
        store = self.ctx.store
        for task in store.tasks(live_only=True):
            growth = self.growing.get(task.name)
            for g in range(task.generation + 1, store.max_generation(task.name) + 1):
                if growth is not None and g == growth.generation:
                    continue
                for w in store.workers(task.name, g, live=True):
                    self.ctx.act.stop_worker(w, 0.0)
                self.ctx.act.end_workers(task.name, g, WorkerPhase.STOPPED)
