"""The workers' rows as the store holds them in memory, with the indexes they are read by.

Every process the coordinator started (or a hot spare) has one row per identity it took (task,
generation, rank): a recovery in place gives each survivor a new row, so a task's rows grow with
every recovery, and the coordinator reads them on every decision and every tick. Each read has
its index here, kept as rows change (:meth:`WorkerRows.hold`), instead of a pass over every row:
a generation's rows by rank (what a decision reads), the rows holding a slot by node (a launch's
free devices, a lost node's workers: at 2,048 nodes reading all 16,384 rows for each was most of
a node loss's time), and each generation's rows in rank order, counted by node, until one of them
changes (the checks of every tick read them for every task).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from operator import attrgetter
from typing import NamedTuple

from unicron.brain.records import WorkerRecord
from unicron.control.store.backend import WorkerKey
from unicron.core.states import SLOT_HOLDING_PHASES, WorkerPhase

_HOLDING = frozenset(SLOT_HOLDING_PHASES)
_NODE_OF = attrgetter("node")  # (a row's node, read in C)


class Ranked(NamedTuple):
    """A generation's rows in rank order, as last read (a new value once one of them changes)."""

    rows: tuple[WorkerRecord, ...]  # every row
    live: tuple[WorkerRecord, ...]  # the live ones
    launching: tuple[WorkerRecord, ...]  # the live ones not yet seen running
    spread: Mapping[str, int]  # node -> live ones there (counted as they are read: a plan reads
    # it for every task, and reading 16,000 rows again for it was the plan's costliest part)


class WorkerRows:
    """Every worker row, by task and identity, by generation, and, for those holding a slot, by
    node; not thread-safe (the store's lock guards it)."""

    def __init__(self) -> None:
        self._by_task: dict[str, dict[tuple[int, int], WorkerRecord]] = {}  # (generation, rank)
        self._generations: dict[str, dict[int, dict[int, WorkerRecord]]] = {}  # task -> gen -> rank
        self._holding: dict[WorkerKey, WorkerRecord] = {}
        self._holding_on: dict[str, dict[WorkerKey, WorkerRecord]] = {}
        self._ranked: dict[tuple[str, int], Ranked] = {}

    def hold(self, rows: Iterable[WorkerRecord]) -> set[str]:
        """Hold ``rows`` (new, or a row's next version) in every index; the tasks they are of.
        Rows come grouped by task and generation (a switch's are hundreds): each group's tables
        are looked up once."""
        task: str | None = None
        generation: int | None = None
        touched: set[str] = set()
        task_rows: dict[tuple[int, int], WorkerRecord] = {}
        generation_rows: dict[int, WorkerRecord] = {}
        for w in rows:
            if w.task != task:
                task, generation = w.task, None
                touched.add(task)
                task_rows = self._by_task.setdefault(task, {})
            if w.generation != generation:
                generation = w.generation
                self._ranked.pop((task, generation), None)
                generation_rows = self._generations.setdefault(w.task, {}).setdefault(generation, {})
            task_rows[(generation, w.rank)] = w
            generation_rows[w.rank] = w
            key, holds = (w.task, generation, w.rank), w.state in _HOLDING
            before = self._holding.get(key)
            if before is not None and (before.node != w.node or not holds):
                del self._holding_on[before.node][key]
            if holds:
                self._holding[key] = w
                self._holding_on.setdefault(w.node, {})[key] = w
            elif before is not None:
                del self._holding[key]
        return touched

    def row(self, task: str, generation: int, rank: int) -> WorkerRecord | None:
        return self._by_task.get(task, {}).get((generation, rank))

    def of_task(self, task: str, live: bool) -> list[WorkerRecord]:
        """Every row of the task (``live``: live ones only), in no order."""
        return [w for w in self._by_task.get(task, {}).values() if not live or w.state.live]

    def ranked(self, task: str, generation: int) -> Ranked:
        """The generation's rows by rank (read again only after one of them changes)."""
        ranked = self._ranked.get((task, generation))
        if ranked is None:
            rows = tuple(w for _, w in sorted(self._generations.get(task, {}).get(generation, {}).items()))
            live = tuple(w for w in rows if w.state.live)
            launching = tuple(w for w in live if w.state is WorkerPhase.LAUNCHING)
            ranked = self._ranked[task, generation] = Ranked(
                rows, live, launching, Counter(map(_NODE_OF, live))
            )
        return ranked

    def of_generation(self, task: str, generation: int) -> Iterable[WorkerRecord]:
        """The generation's rows in the order held (a batch that ends them needs no rank order)."""
        return self._generations.get(task, {}).get(generation, {}).values()

    def holding(self, phases: Iterable[WorkerPhase]) -> list[WorkerRecord]:
        """The rows holding a slot, in ``phases`` (slot-holding ones only)."""
        wanted = set(phases)
        assert wanted <= _HOLDING, f"{wanted} hold no slot: read the task's rows"
        return [w for w in self._holding.values() if w.state in wanted]

    def holding_on(self, node: str) -> list[WorkerRecord]:
        """The rows holding a slot on ``node`` (any task's workers, spares)."""
        return list(self._holding_on.get(node, {}).values())

    def max_generation(self, task: str) -> int:
        return max(self._generations.get(task, {}), default=0)

    def max_rank(self, task: str, generation: int) -> int | None:
        return max(self._generations.get(task, {}).get(generation, {}), default=None)
