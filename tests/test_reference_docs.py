"""docs/reference.md is written from the code (bench/reference_docs.py): it must be current, and
what it says about precedence must be what the library does."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.reference_docs import OUT, PRECEDENCE, SECURITY, render, with_agent_bounds
from unicron.core.workerenv import KEYS
from unicron.train import Session


def test_the_committed_reference_is_current() -> None:
    assert OUT.read_text() == render(), "docs/reference.md is stale: run `make docs`"


def test_the_committed_agent_bounds_are_current() -> None:
    """docs/security.md's table of what an agent's message may hold (between its markers)."""
    page = SECURITY.read_text()
    assert page == with_agent_bounds(page), "docs/security.md's agent bounds are stale: run `make docs`"


def test_the_agents_environment_wins_over_keywords(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keywords = {"iterations": 3, "checkpoint_dir": tmp_path / "mine", "checkpoint_every": 5, "timeout_s": 7.0}
    agent = {"iterations": "30", "checkpoint_dir": str(tmp_path / "agents"), "checkpoint_every": "50"}
    agent["pg_timeout_s"] = "70"
    env = {KEYS["task"]: "t", **{KEYS[PRECEDENCE[k]]: agent[PRECEDENCE[k]] for k in keywords}}
    alone = Session({KEYS["task"]: "t"}, **keywords)  # type: ignore[arg-type]
    managed = Session(env, **keywords)  # type: ignore[arg-type]

    def settings(s: Session) -> tuple[object, ...]:
        return (s.iterations, s.checkpoint_dir, s.checkpoint_every, s.timeout.total_seconds())

    seen = [settings(alone), settings(managed)]
    assert seen[0] == (3, tmp_path / "mine", 5, 7.0)
    assert seen[1] == (30, tmp_path / "agents", 50, 70.0)
    # The one step count under an agent is the task file's; the worker's log says so, once.
    said = capsys.readouterr().err
    assert said.count("trains 30 steps (its task file's run.iterations); this script's iterations=3") == 1
    for session in (alone, managed):
        session.close()
