"""No split brain on storage (issue 15): a task whose whole world is on one host, cut off from the
coordinator (not from the shared checkpoint folder) for 20 seconds. The coordinator declares the
host lost and relaunches the task elsewhere from its checkpoint; the cut-off workers cannot know,
and once their calls to the store give up they train on, there, with each other. Every
checkpoint they write is refused its commit (train/fencing.py): nothing of theirs lands in the
shared folder or their node's in-memory tier after the cut. When the partition heals, they leave
(superseded) or are stopped, and the task ends exact, with an exact ledger."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from harness.netfaults import FaultyHosts
from unicron.control.launch.localcluster import LocalCluster
from unicron.control.launch.testhosts import unavailable
from unicron.core.workerenv import host_checkpoint_dir
from unicron.train.checkpoint import read

from .test_live_cluster import (
    assert_ends_exact,
    assert_ledger_exact,
    finish_and_settle,
    full_speed,
    latest_generation,
    read_rows,
    story_of,
    traced_task,
)

REASON = unavailable()
pytestmark = pytest.mark.skipif(REASON is not None, reason=f"no test hosts here: {REASON}")
PARTITION_S = 20.0


class CommitWatcher(threading.Thread):
    """Every checkpoint committed into ``folders`` while it runs: (generation, step, mtime) of
    each step file seen (a file is read once per inode; the task prunes old ones, so it looks
    often)."""

    def __init__(self, *folders: Path) -> None:
        super().__init__(daemon=True)
        self.folders, self.seen, self.commits = (
            folders,
            set[tuple[str, int]](),
            list[tuple[int, int, float]](),
        )
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.05):
            for folder in self.folders:
                for path in folder.glob("step-*.pt"):
                    self._look(path)

    def _look(self, path: Path) -> None:
        try:
            stat = path.stat()
            if (str(path), stat.st_ino) in self.seen:
                return
            state = read(path)
        except Exception:  # pruned meanwhile
            return
        self.seen.add((str(path), stat.st_ino))
        self.commits.append((int(state["generation"]), int(state["step"]), stat.st_mtime))


@pytest.mark.timeout(600)
def test_a_task_cut_off_whole_trains_on_there_but_commits_nothing(tmp_path: Path) -> None:
    # Steps of at least 0.4 s: the relaunched task (on the other node within ~5 s of the cut) is
    # at most ~60 steps on when the partition heals, and ends a few seconds after.
    trace, iterations = tmp_path / "trace.jsonl", 90
    spec = traced_task(trace, "{2: 1.9e9}", iterations, 0.4, checkpoint_every=5)
    with (
        FaultyHosts(3) as hosts,
        LocalCluster(tmp_path / "cluster", nodes=2, slots=2, hosts=hosts) as cluster,
    ):
        cluster.submit(spec)
        task = lambda: cluster.task("lm")  # noqa: E731
        cluster.wait(lambda: task()["step"] >= 8 and task()["workers"] == 2, 240, "2 workers training")
        workers = [w for w in cluster.get("/v1/workers") if w["state"] == "running"]
        (node,) = {w["node"] for w in workers}  # the whole world on one node
        stale_generation = workers[0]["generation"]
        persistent = tmp_path / "cluster" / "checkpoints" / "lm"
        watcher = CommitWatcher(persistent, host_checkpoint_dir(persistent, node))
        watcher.start()
        # The host's TCP gives up on unanswered calls after ~3 s rather than ~15 min: the
        # partition's 20 s are, to its workers, long enough for their store calls to fail.
        hosts.tcp_retries(cluster.host_of[node], 3)
        hosts.partition([cluster.host_of[node]], [cluster.coordinator_host])
        cut_at = time.time()  # a checkpoint written before this may be one its generation confirmed
        cluster.wait(lambda: task()["generation"] > stale_generation, 60, "a relaunch elsewhere")
        stepped = lambda: max(stale_steps(trace, stale_generation, cut_at), default=0)  # noqa: E731
        at_cut = stepped()
        cluster.wait(lambda: stepped() >= at_cut + 10, 60, "the cut-off workers to train on, unknowing")
        time.sleep(max(0.0, cut_at + PARTITION_S - time.time()))
        assert task()["step"] < iterations, "the task ended before the partition healed: nothing was shown"
        trained_cut_off = stepped()
        hosts.mend()
        cluster.wait(lambda: node_state(cluster, node) == "healthy", 60, f"{node} to register again")
        full_speed(trace)
        events, rows = finish_and_settle(cluster, trace)
        watcher.halt.set()
    story = story_of(events)
    # They did train on, cut off, past checkpoints they would have committed...
    assert trained_cut_off >= at_cut + 10, story
    # ...and none landed: every commit of theirs predates the cut.
    late = [c for c in watcher.commits if c[0] == stale_generation and c[2] > cut_at]
    assert not late, (late, watcher.commits)
    # Their commits were refused, not lost to a race.
    refused = [
        r for r in read_rows(trace) if r["what"] == "commit_refused" and r["generation"] == stale_generation
    ]
    assert refused, story
    assert any(c[0] > stale_generation for c in watcher.commits)  # the watcher saw the new lineage
    assert_ledger_exact(latest_generation(rows), iterations, world=2)
    assert_ends_exact(tmp_path, "lm", iterations)


def stale_steps(trace: Path, generation: int, after: float) -> list[int]:
    """Steps the cut-off generation trained (its ledger lines) after ``after``."""
    return [
        r["step"]
        for r in read_rows(trace)
        if r["what"] == "samples" and r["generation"] == generation and r["time"] > after
    ]


def node_state(cluster: LocalCluster, node: str) -> str:
    return str(next(n["state"] for n in cluster.get("/v1/nodes") if n["name"] == node))
