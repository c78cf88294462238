"""Which node may report about which worker: a report is taken only from the node that hosts
its subject.

An agent's token is bound to its node (``core/access.py``), so the heartbeat's node is known;
what its reports say is not. Without this check any agent could end or fail any task: a
``DoneReport`` for rank 0 at the last step and a clean ``ExitReport`` for another rank, sent by
a node that hosts neither, finished a task mid-training; a failing exit for a healthy rank
stopped it and counted an error against its node. So every report names a worker row of the
store (task, generation, rank), and the row's node must be the sender.

The row is the right subject in every case the coordinator knows, because rows are never
deleted and every identity a process takes is written before the process can report under it:

- a launched worker, a hot spare (``SPARE_GENERATION``) and the newcomers of a grow
  (``Generations.growing``) get their rows, on their nodes, when their launch is ordered;
- a hot spare used by a grow keeps its ``USED`` row and its new identity gets one, on the same
  node, before the agent is told to rename it;
- a survivor renamed in place keeps its ``MOVED`` row (the agent reports its exit under the
  identity it has not left yet: ``Reports._successor``) beside its new one, on the same node;
- a worker of a generation that is gone still has its row: its report is admitted and then
  ignored as stale by ``Reports.handle``, as before (a final ``DoneReport`` of an
  older generation counts there on purpose).

A report naming a worker that has no row (an unknown task, generation or rank) names nothing the
coordinator launched: it is refused. So is one naming a row of an earlier task of the same name
(one that ended, its name then submitted again: ``Store.replace_task``): a late report of its
processes (an agent back from a partition, a report sent again) must not count for the new one.
"""

from __future__ import annotations

from unicron.control.store.reads import StoreReads
from unicron.core.protocol import ExitReport, LaunchFailedReport, StacksReport, WorkerReport


def refusal(report: WorkerReport, sender: str, store: StoreReads) -> str | None:
    """Why ``report``, received in ``sender``'s heartbeat, is refused; None when it is taken.

    - The reports an agent writes itself (``ExitReport``, ``LaunchFailedReport``,
      ``StacksReport``) name their node: another node than the sender is a forgery.
    - ``StacksReport`` names no rank: it answers a ``DumpStacks`` order, which goes only to the
      nodes hosting workers of that generation (``Applier.dump_stacks``); the sender must host
      one (its row, whatever its phase now: the workers may have died since the order).
    - Every other report, ``StorageReport`` included, is about one rank: its row must be on the
      sender. A storage report is sent by the rank whose save failed (``train/saving.py``)
      and opens an incident for the whole task (``storagewatch.py``), so it is held to that
      rank's node like the rest, even for the node-local ``host_memory`` tier.
    """
    if isinstance(report, ExitReport | LaunchFailedReport | StacksReport) and report.node != sender:
        return f"it speaks for node {report.node!r} but came from node {sender!r}"
    if isinstance(report, StacksReport):
        if any(w.node == sender for w in store.workers(report.task, report.generation)):
            return None
        return (
            f"node {sender!r} hosts no worker of {report.task!r} generation {report.generation}: "
            "no stacks were asked of it"
        )
    row = store.worker(report.task, report.generation, report.rank)
    who = f"rank {report.rank} of {report.task!r} generation {report.generation}"
    if row is None:
        return f"no worker is known as {who}"
    if row.node != sender:
        return f"{who} runs on node {row.node!r}, not on node {sender!r}"
    task = store.task(report.task)
    if task is not None and row.launched < task.submitted:
        return f"{who} belongs to an earlier task of that name, which ended before this one was submitted"
    return None
