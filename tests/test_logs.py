"""`unicron logs`: workers' logs read by their agents and relayed by the coordinator.

The agent's side on real files (which part of a log a read returns, the names a worker kept in
place has); the coordinator's side stepped by hand (the agents played by the test: which worker
and node a request means, errors that name the fix, a lost node refused at once, an agent that
does not answer); the routes through the real app in process, with the agent's answer posted as
an agent posts it; the command's follow against answers played by the test.
tests/test_live_security.py reads a log end to end (`unicron logs`, over TLS).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from fastapi.testclient import TestClient

from unicron.control.agent import logfiles
from unicron.control.agent.processes import Worker
from unicron.control.coordinator import CoordinatorSettings
from unicron.control.service.logrelay import LogAnswer, LogRelay, locate
from unicron.control.service.service import create_app
from unicron.control.service.tokens import issue
from unicron.control.store.secret import load_or_create_secret
from unicron.core.access import Role
from unicron.core.errors import NotFound, Unavailable, UsageError
from unicron.core.livespecs import parse_live_tasks
from unicron.core.protocol import LaunchWorker, ReadLog
from unicron.core.states import NodeState

from .fakecluster import SPEC

LINES = b"".join(f"line {i}\n".encode() for i in range(100))  # 100 lines, 7 or 8 bytes each


def order(**read: Any) -> ReadLog:
    return ReadLog.model_validate({"request": "0" * 32, "task": "lm", "generation": 1, "rank": 0, **read})


# ------------------------------------------------------------------ the agent's side


def test_a_read_returns_the_end_its_tail_or_from_an_offset(tmp_path: Path) -> None:
    log = tmp_path / "lm-g1-r0.log"
    log.write_bytes(LINES)
    whole = logfiles.read_log(log, None, None, running=False)
    assert (whole.offset, whole.data, whole.size, whole.capped) == (0, LINES, len(LINES), False)
    last = logfiles.read_log(log, None, 2, running=False)
    assert last.data == b"line 98\nline 99\n" and last.offset == len(LINES) - len(last.data)
    assert logfiles.read_log(log, None, 0, running=False).data == b""  # (a follow of new lines only)
    on = logfiles.read_log(log, last.offset, None, running=True)
    assert on.data == last.data and not on.capped
    after = logfiles.read_log(log, len(LINES) - 20, 1, running=False)  # the last line past a byte
    assert after.data == b"line 99\n" and not after.capped
    few = logfiles.read_log(log, len(LINES) - 12, 5, running=False)
    assert few.data == LINES[-12:] and not few.capped  # fewer lines than asked, none left out
    rewritten = logfiles.read_log(log, len(LINES) + 5, None, running=True)
    assert rewritten.offset == 0 and rewritten.data == LINES  # shorter than the offset: anew


def test_the_byte_cap_starts_at_a_line_and_says_when_it_cut_what_was_wanted(tmp_path: Path) -> None:
    log = tmp_path / "lm-g1-r0.log"
    log.write_bytes(LINES)
    end = logfiles.read_log(log, None, None, running=False, cap=20)
    assert end.data == b"line 98\nline 99\n" and end.capped  # "...97\n" cut mid-line: dropped
    assert end.offset + len(end.data) == len(LINES)
    fits = logfiles.read_log(log, None, 1, running=False, cap=20)
    assert fits.data == b"line 99\n" and not fits.capped  # one line asked, one line given
    more = logfiles.read_log(log, None, 5, running=False, cap=20)
    assert more.data == end.data and more.capped
    follow = logfiles.read_log(log, 0, None, running=True, cap=20)
    assert follow.data == LINES[:20] and not follow.capped  # (the next read goes on from there)


def test_a_character_being_written_waits_for_its_last_byte(tmp_path: Path) -> None:
    log = tmp_path / "lm-g1-r0.log"
    text = "loss 0.5 \u2713\n".encode()
    log.write_bytes(text + "\u2713".encode()[:2])  # a 3-byte character, 2 bytes written so far
    assert logfiles.read_log(log, None, None, running=True).data == text
    assert logfiles.read_log(log, None, None, running=False).data.endswith(b"\xe2\x9c")
    assert logfiles.complete_utf8("a\U0001f600".encode()) == 5
    assert logfiles.complete_utf8("a\U0001f600".encode()[:4]) == 1


@dataclass
class Process:
    pid: int = 1


def worker(tmp_path: Path, generation: int, rank: int, exited: bool = False) -> Worker:
    launch = LaunchWorker(task="lm", generation=generation, rank=rank, world_size=4, local_rank=0, argv=["x"])
    log = logfiles.log_path(tmp_path, "lm", generation, rank)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"I was launched as g{generation} r{rank}\n")
    return Worker(launch, cast(Any, Process()), log, exited=exited)


def test_a_worker_kept_in_place_is_found_under_each_identity_it_had(tmp_path: Path) -> None:
    kept = worker(tmp_path, 1, 3)
    # The agent's rename: its order now names g2 r1; its output goes on in its first file.
    kept.order = kept.order.model_copy(update={"generation": 2, "rank": 1})
    logfiles.link_renamed(kept.log, tmp_path, "lm", 2, 1)
    ended = worker(tmp_path, 1, 0, exited=True)
    for generation, rank in ((1, 3), (2, 1)):
        path, running = logfiles.located(order(generation=generation, rank=rank), tmp_path, [kept, ended])
        assert path.read_text() == "I was launched as g1 r3\n" and running
    # Forgotten by the agent (a minute after its exit), still found by the link.
    path, running = logfiles.located(order(generation=2, rank=1), tmp_path, [])
    assert path.read_text() == "I was launched as g1 r3\n" and not running
    assert logfiles.located(order(generation=1, rank=0), tmp_path, [kept, ended])[1] is False
    missing = logfiles.chunk(
        order(generation=9, rank=0), "n0", logfiles.log_path(tmp_path, "lm", 9, 0), False
    )
    assert "node n0 has no log" in missing.error and "--run-dir" in missing.error


# ------------------------------------------------------------------ the coordinator's side


def test_a_request_means_the_newest_generation_that_had_the_rank(make: Any) -> None:
    cluster = make()
    cluster.exit(3)  # rank 3 dies: the others go on in place as generation 2, ranks 0-2
    store = cluster.c.store
    assert store.get_task("lm").generation == 2
    first = {w.rank: w.node for w in store.workers("lm", 1)}
    assert locate(store, "lm", None, 0).generation == 2
    assert locate(store, "lm", None, 3) == locate(store, "lm", 1, 3)  # only generation 1 had it
    assert locate(store, "lm", 1, 3).node == first[3]
    with pytest.raises(
        NotFound, match=r"no rank 3 in generation 2: its ranks are 0-2; pass one of them to --rank"
    ):
        locate(store, "lm", 2, 3)
    with pytest.raises(NotFound, match=r"no generation 7: its generations are 1-2"):
        locate(store, "lm", 7, 0)
    with pytest.raises(NotFound, match=r"no rank 9 in any generation"):
        locate(store, "lm", None, 9)
    with pytest.raises(NotFound, match=r"no task named 'gpt'.*unicron status"):
        locate(store, "gpt", None, 0)


def test_an_ended_run_kept_under_its_name_is_read_as_name_hash_run(make: Any) -> None:
    cluster = make()
    before = locate(cluster.c.store, "lm", None, 2)
    cluster.c.cancel("lm")
    for _ in range(20):  # its workers stop; the name is free
        cluster.step()
    cluster.c.submit(*parse_live_tasks(SPEC.format(recovery="in_process", run_extra=""), "test"))
    assert locate(cluster.c.store, "lm#1", None, 2) == before  # its workers' rows stay the name's
    with pytest.raises(NotFound, match=r"no workers yet \(waiting\).*`unicron logs 'lm#1'`"):
        locate(cluster.c.store, "lm", None, 0)


def answer_as_agent(cluster: Any, relay: LogRelay, node: str, log: Path, running: bool = True) -> ReadLog:
    """The agent's part: take the read from the node's orders and post what it reads."""
    (read,) = [o for o in cluster.c.orders(node, cluster.acked.get(node, 0)).orders if isinstance(o, ReadLog)]
    assert relay.answered(node, logfiles.chunk(read, node, log, running))
    return read


def test_a_read_goes_to_the_node_that_ran_the_worker_and_its_answer_comes_back(
    make: Any, tmp_path: Path
) -> None:
    cluster = make()
    relay = LogRelay(lambda: cluster.c, wait_s=5.0)
    node = locate(cluster.c.store, "lm", None, 2).node
    log = tmp_path / "lm-g1-r2.log"
    log.write_bytes(LINES)

    async def read() -> tuple[LogAnswer, ReadLog]:
        reading = asyncio.create_task(relay.read("lm", 2, None, 3, None))
        await asyncio.sleep(0)  # the order is out
        other = "n1" if node == "n0" else "n0"
        assert not [o for o in cluster.c.orders(other).orders if isinstance(o, ReadLog)]
        sent = answer_as_agent(cluster, relay, node, log)
        return await reading, sent

    got, sent = asyncio.run(read())
    assert (sent.task, sent.generation, sent.rank, sent.tail, sent.offset) == ("lm", 1, 2, 3, None)
    assert got.text == "line 97\nline 98\nline 99\n" and got.node == node and got.running
    assert got.next_offset == got.size == len(LINES) and not got.capped
    # Answered: the order is taken back, so no agent is sent it again.
    assert not [o for o in cluster.c.orders(node).orders if isinstance(o, ReadLog)]
    assert relay.waiting == {}


def test_an_answer_from_another_node_or_for_nobody_is_not_taken(make: Any, tmp_path: Path) -> None:
    cluster = make()
    relay = LogRelay(lambda: cluster.c, wait_s=0.3)
    node = locate(cluster.c.store, "lm", None, 0).node
    other = "n1" if node == "n0" else "n0"
    log = tmp_path / "any.log"
    log.write_text("forged\n")

    async def read() -> None:
        reading = asyncio.create_task(relay.read("lm", 0, None, None, None))
        await asyncio.sleep(0)
        (sent,) = [o for o in cluster.c.orders(node).orders if isinstance(o, ReadLog)]
        assert not relay.answered(other, logfiles.chunk(sent, other, log, False))
        with pytest.raises(Unavailable, match=f"the agent on node {node} did not answer within 0.3 s"):
            await reading

    began = time.monotonic()
    asyncio.run(read())
    assert time.monotonic() - began < 3.0
    stale = logfiles.chunk(order(), node, log, False)
    assert not relay.answered(node, stale)  # nobody waits for it any more


def test_a_lost_node_is_refused_at_once_naming_it(make: Any) -> None:
    cluster = make(heartbeat_deadline_s=2.0)
    relay = LogRelay(lambda: cluster.c, wait_s=30.0)
    lost = locate(cluster.c.store, "lm", None, 0).node
    alive = "n1" if lost == "n0" else "n0"
    for _ in range(5):
        cluster.step(0.5)
    while cluster.c.store.node(lost).state is not NodeState.LOST:
        cluster.clock.now += 0.5
        cluster.beat(alive)
        cluster.c.tick()
    began = time.monotonic()
    with pytest.raises(Unavailable) as refused:
        asyncio.run(relay.read("lm", 0, 1, None, None))
    assert time.monotonic() - began < 1.0
    said = str(refused.value)
    assert f"ran on node {lost}, which is lost (no heartbeat for" in said
    assert "lm-g1-r0.log in the logs folder of its agent's --run-dir" in said


def test_reads_in_flight_are_bounded(make: Any) -> None:
    cluster = make()
    relay = LogRelay(lambda: cluster.c, wait_s=1.0, per_node=1)

    async def two() -> None:
        first = asyncio.create_task(relay.read("lm", 0, None, None, None))
        await asyncio.sleep(0)
        with pytest.raises(Unavailable, match="too many log reads wait for their agents"):
            await relay.read("lm", 0, None, None, None)
        first.cancel()

    asyncio.run(two())


# ------------------------------------------------------------------ the routes, in process

TASK = "name: t1\nweight: 1\nthroughput: {2: 1.0e9}\nrun: {program: [python, train.py], iterations: 10}\n"


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[TestClient, Path]]:
    settings = CoordinatorSettings(state_dir=tmp_path / "state", checkpoint_root=tmp_path / "ckpt")
    with TestClient(create_app(settings)) as client:
        yield client, settings.state_dir


def token(state: Path, role: Role, subject: str) -> dict[str, str]:
    return {"authorization": f"Bearer {issue(load_or_create_secret(state), role, subject)}"}


class AgentPlayer:
    """Node ``a``'s agent, played over the API: heartbeats, the long poll, its orders."""

    def __init__(self, client: TestClient, state: Path) -> None:
        self.client, self.headers, self.acked = client, token(state, Role.AGENT, "a"), 0
        self.orders: list[Any] = []
        assert client.post(
            "/v1/agents/register", json={"node": "a", "slots": 2}, headers=self.headers
        ).is_success

    def poll(self) -> None:
        self.client.post(
            "/v1/agents/heartbeat", json={"node": "a", "acked": self.acked}, headers=self.headers
        )
        batch = self.client.get(
            "/v1/agents/a/orders", params={"wait": 0.2, "acked": self.acked}, headers=self.headers
        ).json()
        fresh = [o for o, n in zip(batch["orders"], batch["numbers"], strict=True) if n > self.acked]
        self.orders += fresh
        self.acked = max([self.acked, *batch["numbers"]])

    def until(self, kind: str, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = [o for o in self.orders if o["type"] == kind]
            if found:
                self.orders.remove(found[0])
                return found[0]
            self.poll()
        raise AssertionError(f"no {kind} order within {timeout_s} s")


def test_a_viewer_reads_a_log_through_the_route_and_the_agent_answers(
    served: tuple[TestClient, Path], tmp_path: Path
) -> None:
    client, state = served
    admin, viewer = token(state, Role.ADMIN, "ops"), token(state, Role.VIEWER, "dash")
    agent = AgentPlayer(client, state)
    assert client.post("/v1/tasks", content=TASK, headers=admin).status_code == 201
    launches = [agent.until("launch"), agent.until("launch")]
    assert sorted(o["rank"] for o in launches) == [0, 1]
    log = tmp_path / "t1-g1-r1.log"
    log.write_text("hello from rank 1\n")
    read: dict[str, Any] = {}
    reader = threading.Thread(
        target=lambda: read.update(
            response=client.get("/v1/tasks/t1/logs", params={"rank": 1}, headers=viewer)
        )
    )
    reader.start()
    asked = ReadLog.model_validate(agent.until("read_log"))
    chunk = logfiles.chunk(asked, "a", log, running=True).model_dump_json()
    json = {"content-type": "application/json"}
    other = token(state, Role.AGENT, "b")
    assert client.post("/v1/agents/a/logs", content=chunk, headers=other | json).status_code == 403
    taken = client.post("/v1/agents/a/logs", content=chunk, headers=agent.headers | json)
    assert taken.status_code == 200 and taken.json() == {"taken": True}
    reader.join(10)
    response = read["response"]
    assert response.status_code == 200, response.text
    got = response.json()
    assert (got["text"], got["node"], got["generation"], got["rank"]) == ("hello from rank 1\n", "a", 1, 1)
    assert got["running"] and got["path"] == str(log)
    unknown = client.get("/v1/tasks/t1/logs", params={"rank": 5}, headers=viewer)
    assert unknown.status_code == 404 and "pass one of them to --rank" in unknown.json()["error"]
    nobody = client.get("/v1/tasks/nobody/logs", headers=viewer)
    assert nobody.status_code == 404 and "no task named 'nobody'" in nobody.json()["error"]
    assert client.get("/v1/tasks/t1/logs", headers=token(state, Role.AGENT, "a")).status_code == 403


# ------------------------------------------------------------------ the command


class Answers:
    """The coordinator as `unicron logs` sees it: each request answered from a list, recorded."""

    def __init__(self, *answers: dict[str, Any]) -> None:
        self.answers, self.asked = list(answers), cast(list[dict[str, Any]], [])

    def request(self, method: str, path: str, params: dict[str, Any]) -> dict[str, Any]:
        self.asked.append({"path": path, **params})
        return self.answers.pop(0)


def piece(text: str, offset: int, size: int, running: bool, capped: bool = False) -> dict[str, Any]:
    base = {"task": "lm", "generation": 2, "rank": 1, "node": "n0", "path": "/run/logs/lm-g1-r3.log"}
    end = offset + len(text)
    return base | {
        "text": text,
        "offset": offset,
        "next_offset": end,
        "size": size,
        "running": running,
        "capped": capped,
    }


def test_follow_reads_on_from_each_end_until_the_worker_has_exited_and_all_is_shown(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from unicron.cli.logs import show_logs, task_path

    api = Answers(
        piece("b\n", 10, 12, running=True, capped=True),
        piece("", 12, 12, running=True),
        piece("c\n", 12, 16, running=False),  # exited; 2 bytes more to read
        piece("d\n", 14, 16, running=False),
    )
    show_logs(cast(Any, api), "lm", 1, None, None, True, 0.01)
    shown = capsys.readouterr()
    assert shown.out == "b\nc\nd\n"
    assert "the start of this log is left out: it holds 12 bytes" in shown.err
    assert "/run/logs/lm-g1-r3.log on node n0" in shown.err
    assert [a.get("offset") for a in api.asked] == [None, 12, 12, 14]
    assert all(a["generation"] == 2 for a in api.asked[1:])  # that worker's file, whatever comes next
    assert task_path("lm#2") == "/v1/tasks/lm%232/logs"
    with pytest.raises(UsageError, match="not a valid name"):
        task_path("lm#x")
