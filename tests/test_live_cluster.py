"""End to end through real processes: coordinator, agents, PyTorch workers over gloo.

One task trains while we kill a worker, lose a node, restart the coordinator (another process
holding its task's store port meanwhile) and bring the node back. It must finish with the
expected iterations and with the parameters of a failure-free run over the same global batches
(up to float summation order).
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.chaos import check as chaos_check
from unicron.control.launch.localcluster import LocalCluster
from unicron.train.checkpoint import load_latest
from unicron.train.data import DataStream, shard
from unicron.train.replicas import Layout, micro_batches, replica_share

from .conftest import REFERENCES_VARIABLE, ROOT

TRAIN = ROOT / "examples" / "tinygpt" / "train.py"
# The example's model, smaller than its defaults (width 32 over sequences of 16 tokens: a quarter
# of the parameters): the live tests' CPU goes mostly to their workers' steps, and a step here costs
# about half (the soak, bench/chaos, keeps the defaults). What the tests check, the state and the
# ledger against a failure-free run, does not depend on the size. Explicit in full, so that the
# sharded example (examples/fsdp) builds the same model.
MODEL = ["--layers", "2", "--hidden", "32", "--heads", "4", "--sequence", "16", "--vocab", "64"]
ARGS = [*chaos_check.ARGS, *MODEL]  # float64, a global batch of 16 in micro-batches of 2, 512 samples
ITERATIONS = 120
STALL_S = 7.5  # a pause of the coordinator: three heartbeat deadlines (2.5 s)
CHECKPOINT_EVERY = 10  # task_yaml's tasks


def task_yaml(
    name: str,
    weight: float,
    table: str,
    iterations: int,
    delay: float,
    extra: str = "",
    paced: Path | None = None,
    trace: Path | None = None,
) -> str:
    """A task running the example trainer, with a throughput ``table`` and 1e7 FLOPs per sample;
    ``paced``: a file whose number replaces ``delay`` once written (:func:`full_speed`); ``trace``:
    where its workers write their trace."""
    lifted = [] if paced is None else ["--step-delay-file", str(paced)]
    program = ", ".join(["python", str(TRAIN), *ARGS, "--step-delay", str(delay), *lifted])
    traced = "" if trace is None else f", env: {{UNICRON_TRACE_FILE: {trace}}}"
    return (
        f"name: {name}\nweight: {weight}\nthroughput: {table}\n{extra}"
        f"run: {{program: [{program}], iterations: {iterations}, checkpoint_every: {CHECKPOINT_EVERY}, "
        f"flops_per_sample: 1e7{traced}}}\n"
    )


def traced_task(
    trace: Path,
    table: str,
    iterations: int,
    delay: float,
    run_lines: str = "",
    name: str = "lm",
    program: Sequence[str] = (),
    checkpoint_every: int = 10,
) -> str:
    """The spec of a task of weight 1 running the example trainer (or ``program``) with its trace
    written to ``trace``; ``run_lines``: more lines of its ``run:`` section (faults, recovery). Its
    steps pause ``delay`` until :func:`full_speed` lifts the pause."""
    paced = ["--step-delay", str(delay), "--step-delay-file", str(delay_file(trace))]
    argv = ", ".join(program or ["python", str(TRAIN), *ARGS, *paced])
    if not program:
        prefetch_reference(iterations)
    return (
        f"name: {name}\nweight: 1\nthroughput: {table}\nrun:\n  program: [{argv}]\n"
        f"  iterations: {iterations}\n  checkpoint_every: {checkpoint_every}\n"
        f"  env: {{UNICRON_TRACE_FILE: {trace}}}\n" + run_lines
    )


def delay_file(trace: Path) -> Path:
    return trace.with_suffix(".step-delay")


def full_speed(trace: Path) -> None:
    """The task traced to ``trace`` trains on without pausing between steps: the test has seen what
    the pause gave it time for, and the rest is training to the end (a pause changes no number)."""
    pace(trace, 0.0)


# A test that paces its steps at 1 s (``pace``) while its task trains on one node: the hang
# deadline, for the steps after the pause begins, is still the fast steps' (3 x 0.3 s, floored at
# 1.5 s, plus a heartbeat for the report's way), which a paced step on a loaded machine came within
# 0.2-0.4 s of; on one node (no peer to probe) a late step is a hang, and a relaunch. Such a test
# checks no hang: it raises the floor.
PACED_HANG_FLOOR_S = 5.0


def pace(trace: Path, seconds: float) -> None:
    """The task traced to ``trace`` pauses ``seconds`` between steps from its next step on: long
    enough for what the test waits to see (a replacement's start on a loaded machine) to happen
    before the steps run out."""
    written = delay_file(trace).with_suffix(".new")
    written.write_text(str(seconds))
    written.replace(delay_file(trace))


def assert_status_shows(cluster: LocalCluster, *words: str) -> None:
    """`unicron status` against a running coordinator prints all of ``words`` (with the admin's
    token file), and says what to do without a token."""
    status = [sys.executable, "-m", "unicron.cli.main", "status", "--coordinator", cluster.url]
    shown = subprocess.run(
        [*status, "--token-file", str(cluster.admin_token)], capture_output=True, text=True, timeout=60
    )
    assert shown.returncode == 0, shown.stderr
    for word in words:
        assert word in shown.stdout, word
    anonymous = subprocess.run(status, capture_output=True, text=True, timeout=60, env=without_tokens())
    assert anonymous.returncode == 2 and "unicron token create" in anonymous.stderr


def without_tokens() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("UNICRON_TOKEN")}


# Failure-free runs, by (iterations, trainer arguments): each trained once per test run, in
# the background and niced from the moment a test builds its task's spec (``traced_task``, the
# spec most tests compare with one) or asks for it (``prefetch_reference``), so that it trains
# beside the live cluster on the CPU it leaves (a third of this 2-core machine; 7-10 s each).
# The run's test processes share them (:func:`shared_reference`).
REFERENCES: dict[tuple[int, tuple[str, ...]], Future[dict[str, Any]]] = {}
TRAINER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="reference")
MAX_REFERENCE_ITERATIONS = 1000


def prefetch_reference(iterations: int, extra: Sequence[str] = ()) -> None:
    """Start training the failure-free run ``reference`` will be asked for, if not yet started."""
    # One trainer serves every test in turn: a long run would hold back the later tests' runs
    # (a 10,000-step one made a test time out on CI waiting for its own 20-step run).
    assert iterations <= MAX_REFERENCE_ITERATIONS, "compare a shorter task, or build its spec with task_yaml"
    key = (iterations, tuple(extra))
    if key not in REFERENCES:
        REFERENCES[key] = TRAINER.submit(shared_reference, iterations, tuple(extra))


def shared_reference(iterations: int, extra: tuple[str, ...]) -> dict[str, Any]:
    """The failure-free run of ``iterations`` with ``extra``, trained by whichever of the run's
    test processes asks first, in the folder they share (``REFERENCES_VARIABLE``, made by
    conftest.py), under a lock the others wait on; then read. Outside a pytest run, a folder of
    this process's own."""
    folder = reference_folder(iterations, extra)
    extra = (*MODEL, *extra)
    if folder is None:
        out = Path(tempfile.mkdtemp(prefix=f"unicron-reference-{iterations}-"))
        atexit.register(shutil.rmtree, out, True)
        return chaos_check.reference(out, iterations, extra, True)
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "lock").open("w") as lock:
        # Released when this process and the training one it starts have both ended, however.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (folder / "done").exists():
            with contextlib.suppress(Exception):  # (unreadable: trained again, below)
                state = load_latest(folder / "run")
                if state is not None and state["step"] == iterations:
                    return state
            # A run kept in the cache that lost its files: trained again.
            (folder / "done").unlink()
            shutil.rmtree(folder / "run", ignore_errors=True)

        # (a run left half-way by a process that died resumes from its checkpoints: exact)
        def started(pid: int) -> None:
            (folder / TRAINING).write_text(str(pid))

        niced = not (folder / WANTED).exists()
        state = chaos_check.reference(
            folder / "run", iterations, extra, niced, lock.fileno(), started=started
        )
        (folder / "done").touch()
        return state


# In a failure-free run's folder: the pid of the process training it, and a mark that a test
# waits for it (it trains at the normal priority from then on, see ``reference``).
TRAINING, WANTED = "training", "wanted"


def reference_folder(iterations: int, extra: Sequence[str]) -> Path | None:
    """The run's shared folder of the failure-free run (None: outside a pytest run)."""
    shared = os.environ.get(REFERENCES_VARIABLE)
    if shared is None:
        return None
    key = hashlib.sha256(json.dumps([iterations, *MODEL, *extra]).encode()).hexdigest()[:16]
    return Path(shared) / f"{iterations}-{key}"


def reference(iterations: int, extra: Sequence[str] = ()) -> dict[str, Any]:
    """The final checkpoint of the same training without failures, in one process: a function of
    the iterations and the trainer's arguments alone."""
    prefetch_reference(iterations, extra)
    wanted = REFERENCES[(iterations, tuple(extra))]
    if not wanted.done() and (folder := reference_folder(iterations, extra)) is not None:
        hurry(folder)
    return wanted.result()


def hurry(folder: Path) -> None:
    """A test waits for the failure-free run trained in ``folder``: it trains at the normal
    priority from now on. It was started at the lowest, to train on the cycles the test's cluster
    left; waited for, it took the 60 s after the cluster's end that three test processes on two
    cores left it (the other tests' clusters still run)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / WANTED).touch()  # (not started yet: it starts at the normal priority)
    with contextlib.suppress(OSError, ValueError):
        pid = int((folder / TRAINING).read_text())
        if str(folder).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():  # (still that run)
            os.setpriority(os.PRIO_PROCESS, pid, 0)


def alive(pid: int, trace: Path) -> bool:
    """Whether the worker that wrote a "started" line in ``trace`` as ``pid`` still runs (a zombie
    waiting to be reaped does not; nor does another process given the pid since, e.g. by a test
    run beside this one: it began after that line). A worker's environment is no mark of it: one
    forked by its agent's fork server shows the server's in /proc (warmstart.py)."""
    written = [r["time"] for r in read_rows(trace) if r["what"] == "started" and r["pid"] == pid]
    began = process_start(pid)
    return began is not None and any(began <= at + 1.0 for at in written)  # (btime: whole seconds)


def process_start(pid: int) -> float | None:
    """When ``pid``'s process began (seconds since the epoch); None if it has ended (a zombie
    waiting to be reaped has)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
        boot = next(
            int(line.split()[1])
            for line in Path("/proc/stat").read_text().splitlines()
            if line.startswith("btime")
        )
    except OSError:
        return None
    return None if fields[0] == "Z" else boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def finish_and_settle(
    cluster: LocalCluster, trace: Path, task: str = "lm"
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Wait for ``task`` to finish and for every process it started to exit; its events and
    trace rows."""
    cluster.wait(lambda: cluster.task(task)["state"] == "finished", 300, "the task to finish")
    events: list[dict[str, Any]] = cluster.get("/v1/events", task=task)
    rows = read_trace(trace)
    pids = {r["pid"] for r in rows if r["what"] == "started"}
    cluster.wait(lambda: not any(alive(p, trace) for p in pids), 30, "every process of the task to exit")
    return events, rows


def story_of(events: Sequence[Mapping[str, Any]]) -> str:
    """A task's events as a failed assertion shows them: one per line, with its time, whole (a
    list would be cut short in the CI log, and the event that explains a failure with it)."""
    return "\n".join(
        f"{e['time']:.2f} {e['kind']} {e.get('node') or ''} {json.dumps(e['detail'])}" for e in events
    )


def read_trace(path: Path) -> list[dict[str, Any]]:
    """The JSON-lines trace the library writes (UNICRON_TRACE_FILE)."""
    return [json.loads(line) for line in path.read_text().splitlines()]


def read_rows(trace: Path) -> list[dict[str, Any]]:
    """The trace while the workers still write it: a line being written is left out."""
    rows = []
    for line in trace.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:  # a line being written
            continue
    return rows


def assert_ledger_exact(
    rows: list[dict[str, Any]],
    iterations: int,
    seed: int = 0,
    frozen: frozenset[int] = frozenset(),
    world: int = 4,
    replica_size: int = 1,
) -> None:
    """The sample ledger: every step trained on exactly its global batch, once (no step lost or
    repeated, no sample skipped or seen twice). ``frozen``: the ranks (in a world of ``world``) of
    a node or worker that was killed or frozen. The one step in flight when it stopped may be
    recorded wrongly for those ranks' own share only, in one of two ways: one stopped between a
    completed all-reduce and writing its ledger line leaves that line unwritten although its
    samples are in the step; one that finished its all-reduce and wrote its line while the
    survivors' failed has a line for a step they then redid whole (``superseded``)."""
    kept, redone = superseded(rows, frozen)
    steps: dict[int, list[int]] = {}
    for r in kept:
        steps.setdefault(r["step"], []).extend(r["ids"])
    unrecorded = redone
    stream = DataStream(chaos_check.GLOBAL_BATCH, chaos_check.MICRO_BATCH, chaos_check.DATASET, seed)
    for step in range(1, iterations + 1):
        want = stream.batch(step)
        got = Counter(steps.get(step, []))
        if got != Counter(want) and frozen and not unrecorded:
            unrecorded = step
            missing = Counter(want) - got
            assert not got - Counter(want), step  # nothing twice, ever
            shares = {i for r in frozen for i in share_of(want, r, world, replica_size)}
            assert set(missing) <= shares, step
            continue
        assert got == Counter(want), step


def superseded(rows: list[dict[str, Any]], frozen: frozenset[int]) -> tuple[list[dict[str, Any]], int]:
    """The ledger lines that stand, and the step (0: none) whose lines from an earlier generation
    a later one superseded. In place, a step is recorded by two generations in two ways. A rank
    whose all-reduce ended before the others' broke has a line of the older generation: if the
    others redid the step whole (they recorded its samples again), that line is superseded, and
    only a frozen rank's may be so (a survivor takes part in the redo); if instead they took its
    state, the step done (``state_from_replica``), they record their own shares in the newer
    generation, and its line stands beside theirs. Only one step may be superseded."""
    samples = [r for r in rows if r["what"] == "samples"]
    newest: dict[int, int] = {}
    for r in samples:
        newest[r["step"]] = max(newest.get(r["step"], 0), r["generation"])
    redone: dict[int, set[int]] = {}  # step -> the samples its newest generation recorded
    for r in samples:
        if r["generation"] == newest[r["step"]]:
            redone.setdefault(r["step"], set()).update(r["ids"])
    old = [r for r in samples if r["generation"] < newest[r["step"]] and redone[r["step"]] & set(r["ids"])]
    assert {r["rank"] for r in old} <= frozen, old
    assert len({r["step"] for r in old}) <= 1, old
    kept = [r for r in samples if r not in old]
    return kept, old[0]["step"] if old else 0


def share_of(ids: list[int], rank: int, world: int, replica_size: int) -> list[int]:
    """The samples of a step's ``ids`` that ``rank`` trains on in a generation that formed at the
    step's boundary (replicas of ``replica_size`` ranks: dealt to replicas, then to their ranks)."""
    if replica_size == 1:
        return shard(ids, rank, world)
    layout = Layout(rank, world, replica_size)
    mine = replica_share(ids, layout.replica, layout.replicas)
    return [i for chunk in micro_batches(mine, layout.position, replica_size, 2) for i in chunk]


def latest_generation(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ledger lines of the generation that last trained each step: a restart from a checkpoint
    retrains the steps after it, and only that training is in the final state."""
    last: dict[int, int] = {}
    for r in rows:
        if r["what"] == "samples":
            last[r["step"]] = max(last.get(r["step"], 0), r["generation"])
    return [r for r in rows if r["what"] != "samples" or r["generation"] == last[r["step"]]]


def assert_every_incident_closed(events: list[dict[str, Any]]) -> None:
    """Each incident has exactly one outcome: recovered, or superseded by a later incident (a new
    fault during its recovery, which then recovers both); the last one recovered."""
    incidents = [e["id"] for e in events if e["kind"] == "incident"]
    outcomes = {e["detail"]["incident"]: e["detail"] for e in events if e["kind"] == "outcome"}
    assert len(outcomes) == len([e for e in events if e["kind"] == "outcome"]), "an incident closed twice"
    assert sorted(outcomes) == sorted(incidents), (incidents, outcomes)
    for incident, outcome in outcomes.items():
        assert outcome["outcome"] in ("recovered", "superseded"), outcome
        if outcome["outcome"] == "superseded":
            assert outcome["by"] in incidents and outcome["by"] > incident
    assert outcomes[incidents[-1]]["outcome"] == "recovered"


def assert_ends_exact(tmp: Path, task: str, iterations: int, extra: Sequence[str] = ()) -> None:
    """The task's final checkpoint holds every step and the parameters of a failure-free run."""
    final = load_latest(tmp / "cluster" / "checkpoints" / task)
    assert final is not None and final["step"] == iterations
    assert_same_state(final, reference(iterations, extra))


def assert_same_parameters(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert got.keys() == want.keys()
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-9, atol=1e-11, msg=name)


def assert_same_state(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Two final checkpoints hold the same training state: parameters, the optimizer's moments
    and hyper-parameters (the scheduled learning rate), and the registered scheduler."""
    assert_same_parameters(got["model"], want["model"])
    torch.testing.assert_close(got["optimizer"]["state"], want["optimizer"]["state"], rtol=1e-9, atol=1e-11)
    assert got["optimizer"]["param_groups"] == want["optimizer"]["param_groups"]
    assert got["extras"] == want["extras"] and got["extras"]["scheduler"]["last_epoch"] == got["step"]


@pytest.mark.timeout(600)
def store_port_of(root: Path, task: str) -> int:
    """The task's store port as the cluster's coordinator keeps it (read while it is down)."""
    with contextlib.closing(sqlite3.connect(root / "coordinator" / "unicron.sqlite")) as db:
        (port,) = db.execute("SELECT store_port FROM tasks WHERE name = ?", (task,)).fetchone()
    return int(port)


def test_recovers_from_worker_node_and_coordinator_failures(tmp_path: Path) -> None:
    prefetch_reference(ITERATIONS)  # compared with at the end
    paced = tmp_path / "lm"  # (its step-delay file: :func:`delay_file`)
    settings = {"hang_floor_s": PACED_HANG_FLOOR_S}  # (the steps are paced at 1 s below: see its note)
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, settings=settings) as cluster:
        table, trace = "{2: 2.0e9, 4: 3.6e9}", tmp_path / "trace.jsonl"
        cluster.submit(task_yaml("lm", 1, table, ITERATIONS, 0.15, paced=delay_file(paced), trace=trace))

        def at(step: int, generation: int = 0, workers: int = 0) -> bool:
            t = cluster.task("lm")
            return (
                t["state"] == "running"
                and t["step"] >= step
                and t["generation"] >= generation
                and t["workers"] >= workers
            )

        cluster.wait(lambda: at(12, workers=4), 120, "training on 4 workers")
        cluster.kill_worker("lm", 1)
        cluster.wait(
            lambda: at(cluster.task("lm")["checkpoint_step"] + 3, generation=2),
            120,
            "a restart after the worker died",
        )
        cluster.kill_node("node-1")
        cluster.wait(
            lambda: cluster.task("lm")["generation"] >= 3 and at(0), 120, "a restart on the remaining node"
        )
        # The steps slow down until the coordinator's restart and pause are seen through: on a
        # loaded machine both could outlast the steps left at full pace.
        pace(paced, 1.0)
        since = max(e["id"] for e in cluster.get("/v1/events"))
        cluster.kill_coordinator()
        kept = store_port_of(tmp_path / "cluster", "lm")
        with socket.socket() as holder:  # another process takes the task's store port meanwhile
            holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (its old connections wait)
            holder.bind((cluster.address, kept))
            holder.listen()
            cluster.start_coordinator()
        before = cluster.task("lm")
        cluster.wait(lambda: at(before["step"] + 5), 120, "training to go on after the coordinator restart")
        # The workers kept training through the restart: nothing failed, nothing was relaunched;
        # the node of the task's workers was told where its store went (the checkpoints they
        # commit from then on are confirmed there, and the newcomer below joins through it).
        after = cluster.get("/v1/events", since=since, task="lm")
        kinds = [e["kind"] for e in after]
        assert "incident" not in kinds and "task_launch" not in kinds, kinds
        (moved,) = [e["detail"] for e in after if e["kind"] == "task_store_moved"]
        assert moved["kept_port"] == kept != moved["port"] and moved["told"] == ["node-0"], moved
        assert_a_pause_loses_nothing(cluster, at, trace)
        cluster.start_agent("node-1")
        full_speed(paced)  # the rest is training to the end, compared with a failure-free run
        cluster.wait(lambda: cluster.task("lm")["state"] == "finished", 300, "the task to finish")

        task = cluster.task("lm")
        events = cluster.get("/v1/events", task="lm")
        kinds = [e["kind"] for e in events]
        nodes = {n["name"]: n["state"] for n in cluster.get("/v1/nodes")}
    assert task["step"] == ITERATIONS and task["failures"] >= 2
    assert "incident" in kinds and "outcome" in kinds and nodes["node-1"] == "healthy"
    # The node loss is known as such: either it opened the incident, or it was recorded as the
    # root cause of the connection errors the survivors saw first.
    verdicts = [e["detail"]["kind"] for e in events if e["kind"] in ("incident", "root_cause")]
    assert "node_lost" in verdicts
    final = load_latest(tmp_path / "cluster" / "checkpoints" / "lm")
    assert final is not None and final["step"] == ITERATIONS
    assert_same_state(final, reference(ITERATIONS))


def assert_a_pause_loses_nothing(cluster: LocalCluster, reached: Callable[[int], bool], trace: Path) -> None:
    """The coordinator stops running for three heartbeat deadlines (SIGSTOP; in the field a
    long pause of its process or an overloaded host). Its own silence is not the nodes': no
    node is lost, nothing is relaunched, it records the stall (detection.stalled_for). Before
    that rule, such a pause lost every node and relaunched every healthy worker. The workers
    train on meanwhile: before ``train/asking.py``, every step boundary's check of the task's
    store waited for the stopped coordinator, and no step ended until it ran again."""
    assert cluster.coordinator is not None

    # Not across a checkpoint: its commit waits for the coordinator's confirmation (up to
    # commit_confirm_s), so no step would end in the pause (run 72). Paused once a step right
    # after a checkpoint has begun: at a second a step the next one is 9 s away, past STALL_S.
    def after_a_checkpoint() -> bool:
        steps = [r["step"] for r in read_rows(trace) if r["what"] == "samples"]
        return bool(steps) and max(steps) % CHECKPOINT_EVERY == 1

    cluster.wait(after_a_checkpoint, 60, "a step right after a checkpoint")
    paused = max(e["id"] for e in cluster.get("/v1/events"))
    os.kill(cluster.coordinator.pid, signal.SIGSTOP)
    stopped = time.time()
    time.sleep(STALL_S)
    os.kill(cluster.coordinator.pid, signal.SIGCONT)
    resumed = time.time()
    ended = [r["step"] for r in read_rows(trace) if r["what"] == "samples" and stopped < r["time"] < resumed]
    assert ended, "no step ended while the coordinator was stopped"
    before = cluster.task("lm")
    cluster.wait(lambda: reached(before["step"] + 5), 120, "training to go on after the pause")
    story = [(e["kind"], e["node"], e["detail"]) for e in cluster.get("/v1/events", since=paused)]
    unwanted = {"node_lost", "incident", "task_launch", "in_process_recovery"}
    assert not unwanted & {k for k, _, _ in story}, story
    stalls = [d["seconds"] for k, _, d in story if k == "coordinator_stalled"]
    assert stalls and max(stalls) >= STALL_S - 1, story
    assert cluster.task("lm")["generation"] == before["generation"]
