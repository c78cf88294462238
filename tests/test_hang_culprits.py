"""Finding the hung rank: the pure verdict over reported positions, the frame a stack dump names,
and the coordinator stepped by hand (fake clock, agents played by the test) through a hang whose
culprit is a running process: it dumps every rank's stack first, then stops only the culprit."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from asyncio.subprocess import PIPE
from pathlib import Path
from typing import Any

from unicron.brain.records import WorkerRecord
from unicron.control.agent import stackdump
from unicron.control.agent.processes import Worker, is_stopped, read_stack
from unicron.control.detect.detection import settled_for
from unicron.control.detect.hangs import (
    HangVerdict,
    NotYet,
    Sighting,
    hang_verdict,
    innermost_frame,
    trained_past,
)
from unicron.control.detect.monitor import TaskMonitor
from unicron.core.kept import Posted
from unicron.core.protocol import (
    DumpStacks,
    LaunchWorker,
    Membership,
    Phase,
    Progress,
    Registration,
    StacksReport,
    StopWorkers,
    WorkerState,
    membership_key,
)
from unicron.core.settings import Settings
from unicron.core.states import TaskState, WorkerPhase

NOW = 1000.0
STACK = """Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 331 in wait
  File "/usr/lib/python3.11/threading.py", line 982 in _bootstrap

Current thread 0x00007f0000000002 (most recent call first):
  File "/src/unicron/train/faults.py", line 171 in _spin
  File "/src/unicron/train/faults.py", line 158 in before_last_micro_batch
  File "/src/unicron/train/session.py", line 312 in _accumulate
  File "/examples/tinygpt/train.py", line 90 in main
  File "/examples/tinygpt/train.py", line 120 in <module>
"""


def worker(rank: int, node: str = "n0") -> WorkerRecord:
    return WorkerRecord(
        task="lm",
        generation=1,
        rank=rank,
        node=node,
        local_rank=rank % 2,
        state=WorkerPhase.RUNNING,
        pid=rank,
        exit_code=None,
        exit_signal=None,
        launched=0.0,
    )


def at(phase: Phase, what: str = "", step: int = 7, generation: int = 0) -> Progress:
    return Progress(pid=1, generation=generation, step=step, phase=phase, what=what, micro_batch=3, time=NOW)


def verdict(
    positions: dict[int, Progress | None],
    stopped: tuple[int, ...] = (),
    held_s: dict[int, float] | None = None,
    settled_s: float = 0.0,
    launching: bool = False,
) -> Any:
    workers = [worker(r, "n0" if r < 2 else "n1") for r in range(4)]
    held = held_s or {}
    return hang_verdict(
        workers,
        {"n0": NOW, "n1": NOW},
        {w.key: Sighting(w.rank in stopped, positions.get(w.rank), held.get(w.rank)) for w in workers},
        NOW,
        Settings().heartbeat_interval_s,
        settled_s,
        launching,
    )


def test_the_rank_not_where_its_peers_wait_is_the_culprit() -> None:
    waiting = at(Phase.COLLECTIVE, "all_reduce")
    found = verdict({0: waiting, 1: waiting, 2: at(Phase.COMPUTE), 3: waiting})
    assert [w.rank for w in found.culprits] == [2]
    assert found.where[2] == "step 7: compute (micro-batch 3)" and "all_reduce" in found.where[0]
    # Waiting for a membership counts as waiting; a rank stuck saving a checkpoint does not.
    rejoin = at(Phase.REJOIN)
    found = verdict({0: rejoin, 1: at(Phase.CHECKPOINT), 2: waiting, 3: waiting})
    assert [w.rank for w in found.culprits] == [1]


def test_a_stopped_process_is_the_culprit_whatever_it_reported() -> None:
    waiting = at(Phase.COLLECTIVE, "all_reduce")
    found = verdict({r: waiting for r in range(4)}, stopped=(3,))
    assert [w.rank for w in found.culprits] == [3] and "stopped" in found.why


def test_no_rank_is_blamed_when_all_wait_or_none_reports() -> None:
    waiting = at(Phase.COLLECTIVE, "all_reduce")
    assert verdict({r: waiting for r in range(4)}).culprits == []
    assert verdict({}).culprits == []
    assert verdict({r: at(Phase.COMPUTE) for r in range(4)}).culprits == []
    # No rank reporting at a launch's first step: stuck starting up, not a network's stall.
    assert not verdict({}).starting
    workers = [worker(r) for r in range(2)]
    starting = hang_verdict(workers, {"n0": NOW}, {}, NOW, 0.5, launching=True)
    assert isinstance(starting, HangVerdict) and starting.starting and starting.culprits == []
    # Nor when the ranks that report wait to join (or in the first collective) for one that never
    # reached the session: rank 3 is stuck starting up, the others wait for it.
    joining = {r: at(Phase.REJOIN, "join", step=1) for r in range(3)}
    assert verdict(joining, launching=True).starting
    assert "[3] have not reached" in verdict(joining, launching=True).why
    assert not verdict(joining).starting  # a step later than a launch's first: judged as before
    assert not verdict({**joining, 2: at(Phase.COMPUTE, step=1)}, launching=True).starting


def test_a_late_step_whose_ranks_all_compute_is_hung_only_once_none_has_moved_for_the_settle_time() -> None:
    """No rank waits in a collective: the culprit cannot be told apart, and the whole task is
    relaunched. Before that, every rank must have been read where it is for ``settled_s``: a rank
    read moving sooner (its position changes each micro-batch) is still training, a slow step on
    a loaded host. Past ``hang_cap_s`` the step is hung however its ranks move."""
    computing = {r: at(Phase.COMPUTE) for r in range(4)}
    slow = verdict(computing, held_s={0: 2.0, 1: 2.0, 2: 0.2, 3: 2.0}, settled_s=1.1)
    assert isinstance(slow, NotYet) and "2 (0.20 s)" in slow.why, slow
    stuck = verdict(computing, held_s=dict.fromkeys(range(4), 1.2), settled_s=1.1)
    assert isinstance(stuck, HangVerdict) and stuck.culprits == [] and "none to blame" in stuck.why
    workers = [worker(r, "n0" if r < 2 else "n1") for r in range(4)]
    seen = {w.key: Sighting(False, computing[w.rank], 0.2) for w in workers}
    capped = hang_verdict(workers, {"n0": NOW, "n1": NOW}, seen, NOW, 0.5, 1.1, capped=True)
    assert isinstance(capped, HangVerdict) and capped.culprits == []
    # A rank that reports no position at all cannot be read moving: judged as before, at once.
    silent = verdict(
        {r: at(Phase.COMPUTE) for r in range(3)}, held_s=dict.fromkeys(range(3), 0.2), settled_s=1.1
    )
    assert isinstance(silent, HangVerdict) and silent.culprits == []


def test_ranks_that_keep_moving_through_a_step_that_never_ends_are_hung_at_the_cap(make: Any) -> None:
    """Every heartbeat reads every rank in a micro-batch it has just begun, and the step never
    ends: deferred while it has waited less than ``hang_cap_s``, hung (nobody to blame) once it
    has."""
    cluster = make(hang_warmup_steps=2, hang_floor_s=1.0, heartbeat_interval_s=0.5, hang_cap_s=6.0)
    for step in range(2, 6):
        cluster.clock.now += 0.5
        cluster.train(step)
    ended = cluster.clock.now
    while not cluster.events("hang_detected") and cluster.clock.now < ended + 10.0:
        for _, g, r in list(cluster.running):  # read 0 s after it moved, at the next heartbeat
            moved = cluster.clock.now + 0.5
            cluster.positions[("lm", g, r)] = Progress(
                pid=r, generation=g, step=6, phase=Phase.COMPUTE, time=moved
            )
        cluster.step(0.5)
    (hang,) = cluster.events("hang_detected")
    assert hang["culprits"] == [] and hang["waited_s"] >= 6.0, hang
    assert cluster.clock.now - ended < 6.0 + 1.5  # at the first look past the cap
    (deferred,) = cluster.events("hang_deferred")
    assert "read moving" in deferred["why"], deferred


def test_a_rank_is_settled_where_it_was_read_for_nearly_the_whole_deadline() -> None:
    assert settled_for(mean_s=0.4, deadline_s=1.5, interval_s=0.25) == 1.1
    assert settled_for(mean_s=0.1, deadline_s=1.5, interval_s=0.5) == 1.4
    assert settled_for(mean_s=0.0, deadline_s=300.0, interval_s=0.5) == 0.5  # before step times
    assert settled_for(mean_s=0.4, deadline_s=60.0, interval_s=0.5, launching=True) == 0.5
    # The cap binds (a step of 250 s, capped at 300 s): a rank hung early in the step is blamed
    # by the deadline; one of steps past the cap (every step late) at a heartbeat.
    assert settled_for(mean_s=250.0, deadline_s=300.0, interval_s=0.5) == 50.0
    assert settled_for(mean_s=400.0, deadline_s=300.0, interval_s=0.5) == 0.5


def test_a_rank_past_the_step_a_peer_waits_in_is_not_blamed() -> None:
    """Under packet loss a ring all-reduce ends sooner on some ranks than on others: a rank
    still in step 37's collective waits on the network, not on the ranks already in step 38,
    whether they compute or wait there. A rank behind the waiters, or at their step but outside
    the collective, is still the culprit."""
    found = verdict(
        {
            0: at(Phase.COMPUTE, step=38),
            1: at(Phase.COLLECTIVE, "all_reduce", step=37),
            2: at(Phase.COLLECTIVE, "all_reduce", step=38),
            3: at(Phase.COMPUTE, step=38),
        }
    )
    assert found.culprits == [] and "past it" in found.why
    found = verdict(
        {
            0: at(Phase.COMPUTE, step=38),
            1: at(Phase.COLLECTIVE, "all_reduce", step=37),
            2: at(Phase.COMPUTE, step=36),
            3: at(Phase.COMPUTE, step=37),
        }
    )
    assert [w.rank for w in found.culprits] == [2, 3]
    # A newcomer waiting to join has not been told the task's step: it bounds nothing.
    found = verdict(
        {
            0: at(Phase.COLLECTIVE, "all_reduce", step=35),
            1: at(Phase.COLLECTIVE, "all_reduce", step=35),
            2: at(Phase.COMPUTE, step=35),
            3: at(Phase.REJOIN, "join", step=1),
        }
    )
    assert [w.rank for w in found.culprits] == [2]


def test_a_silent_node_is_decided_first() -> None:
    workers = [worker(0), worker(2, "n1")]
    interval = Settings().heartbeat_interval_s
    not_yet = hang_verdict(workers, {"n0": NOW, "n1": NOW - 5}, {}, NOW, interval)
    assert isinstance(not_yet, NotYet) and list(not_yet.silent_s) == ["n1"], not_yet


def test_a_rank_read_outside_the_collective_just_after_it_got_there_is_not_blamed_yet() -> None:
    """Its node read its position 0.1 s after it began its micro-batch (a heartbeat old when the
    step is judged, more on a lossy link: seen in CI, a rank restarted for the compute it had
    left for the collective its peers waited in). Not blamed until read there for a mean step
    (0.4 s here); one read there that long is, and so is one whose reading time is unknown."""
    waiting = at(Phase.COLLECTIVE, "all_reduce")
    positions = {0: waiting, 1: waiting, 2: at(Phase.COMPUTE), 3: waiting}
    not_yet = verdict(positions, held_s={r: 0.1 for r in range(4)}, settled_s=0.4)
    assert isinstance(not_yet, NotYet) and "2 (0.10 s)" in not_yet.why and not not_yet.silent_s, not_yet
    found = verdict(positions, held_s={2: 0.4}, settled_s=0.4)
    assert [w.rank for w in found.culprits] == [2]
    assert [w.rank for w in verdict(positions, settled_s=0.4).culprits] == [2]
    # Of two outside it, the one read there long enough is blamed; the other waits its turn.
    found = verdict({**positions, 1: at(Phase.COMPUTE)}, held_s={1: 2.0, 2: 0.1}, settled_s=0.4)
    assert [w.rank for w in found.culprits] == [1]
    # A stopped process is blamed however briefly it was seen.
    found = verdict(positions, stopped=(3,), held_s={3: 0.0}, settled_s=0.4)
    assert [w.rank for w in found.culprits] == [3]


# The same worker run as ``python -m``: runpy's frames lie below the script's module.
AS_MODULE = (
    STACK.rstrip("\n")
    + """
  File "<frozen runpy>", line 88 in _run_code
  File "<frozen runpy>", line 198 in _run_module_as_main
"""
)


def test_the_stack_names_the_main_threads_innermost_frame() -> None:
    assert innermost_frame(STACK) == "_spin (faults.py:171)"
    assert innermost_frame(AS_MODULE) == "_spin (faults.py:171)"
    assert innermost_frame("no stack: the process is stopped") is None


def test_a_running_culprit_is_found_from_positions_and_stopped_after_the_stacks(make: Any) -> None:
    cluster = make(hang_warmup_steps=2, hang_floor_s=1.0, heartbeat_interval_s=0.5)
    for step in range(2, 6):
        cluster.clock.now += 0.5
        cluster.train(step)
    task = cluster.c.store.get_task("lm")
    for _, g, r in list(cluster.running):
        phase = Phase.COMPUTE if r == 2 else Phase.COLLECTIVE
        cluster.positions[("lm", g, r)] = at(phase, "" if r == 2 else "all_reduce", step=6)
    for _ in range(6):  # 3 s: past 3 x 0.5 s plus one heartbeat
        cluster.step(0.5)
    (hang,) = cluster.events("hang_detected")
    assert hang["culprits"] == [2] and hang["why"] == "not in the collective its peers wait in"
    # Every node dumps its workers' stacks, and on the culprit's node before the stop.
    culprit_node = cluster.c.store.worker("lm", task.generation, 2).node
    dumps = [(n, i) for i, (n, o) in enumerate(cluster.orders) if isinstance(o, DumpStacks)]
    stops = [i for i, (n, o) in enumerate(cluster.orders) if isinstance(o, StopWorkers) and n == culprit_node]
    assert {n for n, _ in dumps} == {"n0", "n1"}
    assert stops and min(i for n, i in dumps if n == culprit_node) < min(stops)
    stopped = [o for _, o in cluster.orders if isinstance(o, StopWorkers)]
    assert [(o.generation, o.rank) for o in stopped] == [(task.generation, 2)]  # only the culprit
    assert cluster.c.store.get_task("lm").workers == 3  # the others go on in place
    (incident,) = cluster.events("incident")
    assert incident["kind"] == "task_hang"
    report = StacksReport(task="lm", generation=task.generation, node=culprit_node, stacks={2: STACK})
    cluster.beat(culprit_node, report)
    (stacks,) = cluster.events("stacks")
    assert stacks["incident"] == incident["id"] and stacks["where"] == {"2": "_spin (faults.py:171)"}


def test_a_rank_seen_moving_outside_the_collective_is_blamed_once_it_stays(make: Any) -> None:
    """Each heartbeat reads rank 2 in a micro-batch begun 0.1 s before (it moves, or its reading
    is late): past the deadline the step is said deferred, and nobody is stopped. Once a
    reading finds it in one micro-batch for nearly the whole deadline (1.5 s less a mean step of
    0.5 s), it is the culprit."""
    cluster = make(hang_warmup_steps=2, hang_floor_s=1.0, heartbeat_interval_s=0.5)
    for step in range(2, 6):
        cluster.clock.now += 0.5
        cluster.train(step)
    for _, g, r in list(cluster.running):
        cluster.positions[("lm", g, r)] = at(Phase.COLLECTIVE, "all_reduce", step=6)
    for _ in range(6):  # 3 s: past 3 x 0.5 s plus one heartbeat
        moving = at(Phase.COMPUTE, step=6).model_copy(update={"time": cluster.clock.now + 0.4})
        cluster.positions[("lm", 1, 2)] = moving
        cluster.step(0.5)
    assert cluster.events("hang_detected") == [] and cluster.events("incident") == []
    (deferred,) = cluster.events("hang_deferred")
    assert "2 (0.10 s)" in deferred["why"] and deferred["silent_s"] == {}, deferred
    cluster.step(0.5)  # read in the same micro-batch 0.6 s after it began: not yet
    assert cluster.events("hang_detected") == []
    cluster.step(0.5)  # 1.1 s
    (hang,) = cluster.events("hang_detected")
    assert hang["culprits"] == [2] and hang["held_s"]["2"] == 1.1, hang


def test_a_registration_says_how_long_its_workers_were_where_they_are(make: Any) -> None:
    """A node registering again (after a failed request) lists its workers as a heartbeat does,
    with the time it read them: a rank it read just after a move is not taken as settled there."""
    cluster = make()
    listed = [
        WorkerState(task=t, generation=g, rank=r, pid=pid, running=True, progress=at(Phase.COMPUTE, step=2))
        for (t, g, r), (n, pid) in cluster.running.items()
        if n == "n1"
    ]
    cluster.c.register(Registration(node="n1", slots=2, workers=listed, sent=NOW + 0.2))
    workers = cluster.c.store.workers("lm", 1, live=True)
    seen = cluster.c.detector.observed(workers)
    held = {w.rank: round(seen[w.key].held_s or 0.0, 6) for w in workers if w.node == "n1"}
    assert held and set(held.values()) == {0.2}, held


def test_a_survivor_its_agent_has_not_renamed_yet_is_judged_where_its_process_is(make: Any) -> None:
    """After an in-place change of membership, an agent reports its survivors under their old
    identity until it has carried the rename out (the CI run that failed so: a rank stalled as
    a grow let a newcomer in). A hang judged meanwhile still finds where each process is, and
    blames the stalled one under its new rank, not nobody (nor, after a grace, too late)."""
    cluster = make(hang_warmup_steps=2, hang_floor_s=1.0, heartbeat_interval_s=0.5)
    for step in range(2, 6):
        cluster.clock.now += 0.5
        cluster.train(step)
    cluster.late_renames.add("n1")
    cluster.exit(1)  # on n0: ranks 2 and 3 on n1 become ranks 1 and 2
    cluster.clock.now += 0.5
    cluster.train(6)
    task = cluster.c.store.get_task("lm")
    assert task.generation == 2 and task.state is TaskState.RUNNING
    assert sorted(k for k in cluster.running if cluster.running[k][0] == "n1") == [("lm", 1, 2), ("lm", 1, 3)]
    cluster.positions[("lm", 2, 0)] = at(Phase.COLLECTIVE, "all_reduce", step=7)
    cluster.positions[("lm", 1, 2)] = at(Phase.COLLECTIVE, "all_reduce", step=7)
    cluster.positions[("lm", 1, 3)] = at(Phase.COMPUTE, step=7)  # the stalled one: now rank 2
    for _ in range(6):  # 3 s: past 3 x 0.5 s plus one heartbeat
        cluster.step(0.5)
    (hang,) = cluster.events("hang_detected")
    assert hang["culprits"] == [2] and not hang["peer_check"], hang
    assert hang["where"] == {"0": "step 7: collective all_reduce", "1": "step 7: collective all_reduce",
                             "2": "step 7: compute (micro-batch 3)"}  # fmt: skip


def test_a_dump_files_each_stack_under_the_rank_its_worker_had_when_ordered(tmp_path: Path) -> None:
    """The agent begins a dump as the order comes and finishes it beside the orders that follow
    (control/agent/stackdump.py); a rename among them (an in-place recovery) must not move the stack
    to another rank, nor lose it."""
    log = tmp_path / "worker.log"
    program = (
        "import faulthandler, signal, sys, time\n"
        f"faulthandler.register(signal.SIGUSR1, file=open({str(log.with_suffix('.stacks'))!r}, 'w'))\n"
        "def waiting():\n"  # ready said from the frame the stack must show (not before it)
        "    print('ready', flush=True); time.sleep(60)\n"
        "waiting()\n"
    )

    async def dumped() -> StacksReport:
        process = await asyncio.create_subprocess_exec(sys.executable, "-c", program, stdout=PIPE)
        try:
            assert process.stdout is not None and await process.stdout.readline() == b"ready\n"
            order = LaunchWorker(task="lm", generation=1, rank=3, world_size=4, local_rank=1, argv=[])
            position = Progress(pid=process.pid, step=7, phase=Phase.COMPUTE, time=NOW)
            worker = Worker(order, process, log, last_position=position)
            dump = stackdump.begin(DumpStacks(task="lm", generation=1), "n1", [worker])
            worker.order = order.model_copy(update={"generation": 2, "rank": 2})  # the rename
            return await stackdump.finish(dump)
        finally:
            process.kill()
            await process.wait()

    report = asyncio.run(dumped())
    assert list(report.stacks) == [3] and report.generation == 1
    assert innermost_frame(report.stacks[3]) == "waiting (<string>:4)", report.stacks


def test_a_stopped_process_stack_is_read_without_resuming_it() -> None:
    """A SIGSTOPped process cannot run its faulthandler: the agent reads its stack with py-spy,
    and the frame it stopped in is found in that format too; the process stays stopped."""
    program = "import os, signal\ndef halt():\n    os.kill(os.getpid(), signal.SIGSTOP)\nhalt()\n"
    process = subprocess.Popen([sys.executable, "-c", program])
    try:
        deadline = time.time() + 30
        while not is_stopped(process.pid) and time.time() < deadline:
            time.sleep(0.05)
        text = asyncio.run(read_stack(process.pid))
        assert innermost_frame(text) == "halt (<string>:3)", text
        assert is_stopped(process.pid)
    finally:
        process.kill()
        process.wait()


def test_a_late_step_is_said_deferred_once_while_a_node_is_silent(make: Any) -> None:
    """A step late while a node of the task is silent is not judged (the node's loss is decided
    first), but it is said, once, with the silence; heard again, the node's ranks are judged."""
    cluster = make(hang_warmup_steps=2, hang_floor_s=1.0, heartbeat_interval_s=0.5, heartbeat_deadline_s=5.0)
    for step in range(2, 6):
        cluster.clock.now += 0.5
        cluster.train(step)
    for rank in range(4):
        cluster.positions[("lm", 1, rank)] = at(Phase.COLLECTIVE, "all_reduce", step=6)
    for _ in range(8):  # 4 s: n1 silent past twice its heartbeat interval, not past its deadline
        cluster.clock.now += 0.5
        cluster.beat("n0")
        cluster.c.tick()
    assert cluster.events("hang_detected") == []
    (deferred,) = cluster.events("hang_deferred")
    assert deferred["step"] == 6 and list(deferred["silent_s"]) == ["n1"], deferred
    assert deferred["silent_s"]["n1"] > 1.0 and deferred["waited_s"] > 1.0, deferred
    cluster.step(0.5)  # n1 heard again: the late step is judged now
    (hang,) = cluster.events("hang_detected")
    assert hang["step"] == 6 and hang["culprits"] == [], hang


def _after_a_checkpoint(make: Any, **limits: Any) -> Any:
    """Four ranks trained steps 1-5 (0.5 s each) of a task that saves every 5 steps: the hang
    deadline is 1 s (its floor), and step 5 saved a checkpoint."""
    cluster = make(run_extra=", checkpoint_every: 5", hang_warmup_steps=2, hang_floor_s=1.0, **limits)
    for step in range(2, 6):
        cluster.clock.now += 0.5
        cluster.train(step)
    return cluster


def test_a_hang_in_the_step_after_a_checkpoint_is_found_at_the_usual_deadline(make: Any) -> None:
    """No rank is seen saving: the step after a checkpoint is judged as any other (every such step
    was given checkpoint_allowance_s, 30 s, before: a hang in it went unseen that long)."""
    cluster = _after_a_checkpoint(make)
    for rank in range(4):
        cluster.positions[("lm", 1, rank)] = at(Phase.COMPUTE if rank == 2 else Phase.COLLECTIVE, step=6)
    for _ in range(6):  # 3 s: past the 1 s deadline plus one heartbeat
        cluster.step(0.5)
    (hang,) = cluster.events("hang_detected")
    assert hang["step"] == 6 and hang["culprits"] == [2], hang


def test_a_save_seen_holds_the_next_step_off_while_it_lasts_and_no_longer(make: Any) -> None:
    """Rank 0 is seen saving step 5's checkpoint for 10 s, ten times the deadline: no hang. Once
    it is seen computing step 6, the deadline counts from the last heartbeat that saw it save. A
    save seen for longer than checkpoint_allowance_s is a hang, its saver the culprit."""
    cluster = _after_a_checkpoint(make)
    for rank in range(1, 4):
        cluster.positions[("lm", 1, rank)] = at(Phase.COLLECTIVE, "all_reduce", step=6)
    cluster.positions[("lm", 1, 0)] = at(Phase.CHECKPOINT, step=5, generation=1)
    for _ in range(20):
        cluster.step(0.5)
    assert cluster.events("hang_detected") == []
    cluster.positions[("lm", 1, 0)] = at(Phase.COMPUTE, step=6)  # saved: computing, and stuck
    cluster.step(0.5)
    assert cluster.events("hang_detected") == []  # 0.5 s after the save was last seen
    for _ in range(5):
        cluster.step(0.5)
    (hang,) = cluster.events("hang_detected")
    assert hang["step"] == 6 and hang["culprits"] == [0] and hang["waited_s"] <= 3.0, hang

    stuck = _after_a_checkpoint(make, checkpoint_allowance_s=4.0)
    for rank in range(1, 4):
        stuck.positions[("lm", 1, rank)] = at(Phase.COLLECTIVE, "all_reduce", step=6)
    stuck.positions[("lm", 1, 0)] = at(Phase.CHECKPOINT, step=5, generation=1)
    for _ in range(8):  # 4 s of the save: within its allowance
        stuck.step(0.5)
    assert stuck.events("hang_detected") == []
    for _ in range(6):
        stuck.step(0.5)
    (hang,) = stuck.events("hang_detected")
    assert hang["culprits"] == [0] and "step 5: checkpoint" in hang["where"]["0"], hang


def test_the_first_step_of_a_grown_group_may_take_a_re_forming_and_the_next_one_a_step(make: Any) -> None:
    """Newcomers join at a step boundary: the members re-form the group and send them their
    state before the first step of the grown generation ends. That step is given as long as an
    in-process recovery (it was judged as a plain step: a hang, stacks dumped, peers probed,
    after the 1 s floor); the step after it is judged as usual."""
    cluster = make(hang_warmup_steps=2, hang_floor_s=1.0, recovery_deadline_s=8.0)
    for step in range(2, 6):
        cluster.clock.now += 0.5
        cluster.train(step)
    growth = cluster.regrow(6)
    for _ in range(12):  # 6 s of re-forming: within the recovery deadline
        cluster.step(0.5)
    assert cluster.events("hang_detected") == []
    cluster.train(7)
    for _ in range(6):  # 3 s: past the 1 s deadline plus one heartbeat
        cluster.step(0.5)
    (hang,) = cluster.events("hang_detected")
    assert hang["step"] == 8 and hang["generation"] == growth.generation, hang


def test_a_rank_hung_before_the_warm_up_ends_is_found_at_the_cap(make: Any) -> None:
    """The task has ended one step; the warm-up wants five step times. No step time to go by,
    so the cap: the step is hung once ``hang_cap_s`` (and a heartbeat) has passed, not never."""
    cluster = make(hang_warmup_steps=5, hang_cap_s=10.0)
    for _ in range(18):  # 9 s: within the cap
        cluster.step(0.5)
    assert cluster.events("hang_detected") == []
    for _ in range(6):  # past 10 s and one heartbeat
        cluster.step(0.5)
    assert len(cluster.events("hang_detected")) == 1
    assert [i["kind"] for i in cluster.events("incident")] == ["task_hang"]


def test_a_collective_stalled_past_its_graces_is_reattempted_in_place_by_every_rank(make: Any) -> None:
    """Every rank waits in the all-reduce on two nodes that reach each other, their connections
    retransmitting: a lossy link's stall, graced and renewed (``network_grace_renewals``), then
    checked no more. Still late, it is stuck: every rank is alive and none to blame, so it is
    reattempted in place: no process stopped or started, every member in the next generation,
    and the membership posted abandons the step in progress."""
    cluster = make(
        hang_warmup_steps=2, hang_floor_s=1.0, heartbeat_interval_s=0.5,
        network_grace_s=2.0, network_grace_renewals=1, probes=True,
    )  # fmt: skip
    for step in range(2, 6):
        cluster.clock.now += 0.5
        cluster.train(step)
    task = cluster.c.store.get_task("lm")
    for _, g, r in list(cluster.running):
        cluster.positions[("lm", g, r)] = at(Phase.COLLECTIVE, "all_reduce", step=6)
    pids = dict(cluster.running)
    launches = len(cluster.launched())
    for check in range(2):
        cluster.c.placer.allocator.wait()
        for _ in range(30):
            cluster.step(0.5)
            if len(cluster.events("hang_detected")) > check:
                break
        assert cluster.events("hang_detected")[-1]["peer_check"], cluster.events("hang_detected")
        for node in cluster.nodes:  # every node reaches the other; some connection retransmits
            report = StacksReport(
                task="lm", generation=task.generation, node=node, stacks={}, unreachable=[], retransmitting=1
            )
            cluster.beat(node, report)
        cluster.step(0.5)
        (*_, judged) = cluster.events("peer_check")
        assert judged["grace_s"] == 2.0 and not cluster.events("incident"), judged
    for _ in range(30):
        cluster.step(0.5)
        if cluster.events("incident"):
            break
    (incident,) = cluster.events("incident")
    assert (incident["kind"], incident["action"]) == ("other_network_error", "reattempt in place"), incident
    assert len(cluster.events("hang_detected")) == 3 and len(cluster.events("peer_check")) == 2
    assert not [o for _, o in cluster.orders if isinstance(o, StopWorkers)]
    assert len(cluster.launched()) == launches
    after = cluster.c.store.get_task("lm")
    assert after.generation == task.generation + 1 and after.workers == 4
    assert sorted(pid for _, pid in cluster.running.values()) == sorted(pid for _, pid in pids.values())
    # The membership posted for the workers: nobody failed, and the step in progress is abandoned.
    posted = (cluster.c.store.kept_record(Posted, of="lm") or Posted()).keys[
        membership_key("lm", task.generation)
    ]
    membership = Membership.model_validate_json(posted)
    assert membership.failed == [] and membership.abandon and membership.ranks == {0: 0, 1: 1, 2: 2, 3: 3}


def test_a_step_every_rank_is_past_is_no_hang_and_the_next_one_is_timed_from_then() -> None:
    """Seen in make test: a coordinator started over had stored its predecessor's step 19 while
    the ranks trained step 59; the first heartbeat showed them there, before their next step's
    report, and step 20 was judged hung ("none to blame") and the task relaunched."""
    workers = [worker(r) for r in range(2)]
    positions = {w.key: at(Phase.COMPUTE, step=59, generation=1) for w in workers}
    assert trained_past(workers, positions, generation=1) == 58
    positions[workers[1].key] = at(Phase.COLLECTIVE, step=20, generation=1)  # one rank still at 20
    assert trained_past(workers, positions, generation=1) == 19
    positions[workers[1].key] = at(Phase.COMPUTE, step=59, generation=0)  # not in this generation yet
    assert trained_past(workers, positions, generation=1) is None
    assert trained_past(workers, {workers[0].key: positions[workers[0].key]}, generation=1) is None
    monitor = TaskMonitor(Settings())
    monitor.watch_from(100.0, 19)
    monitor.seen_past(58, 102.5)
    assert (monitor.last_step, monitor.since) == (58, 102.5)  # step 59 is timed from what was seen
    assert not monitor.late(102.5 + monitor.deadline() - 0.01) and monitor.late(
        102.5 + monitor.deadline() + 0.01
    )
