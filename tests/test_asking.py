"""Questions to a store that may not answer (``train/asking.py``): one a store never answers is
given up after the bound, the next is not asked while it is unanswered, and answers and errors
come back as they were given. (The real store, stopped: test_task_store.py.)"""

from __future__ import annotations

import threading
import time

import pytest

from unicron.train.asking import Asker, Unanswered


def test_answers_and_errors_come_back_as_given() -> None:
    asker = Asker(5.0, "test")
    assert asker.ask(lambda: 42) == 42

    def fails() -> int:
        raise ConnectionResetError("reset")

    with pytest.raises(ConnectionResetError, match="reset"):
        asker.ask(fails)
    assert asker.ask(lambda: "again") == "again"


def test_an_unanswered_question_is_given_up_and_the_next_not_asked_until_it_is_answered() -> None:
    asker, answering, asked = Asker(0.05, "test"), threading.Event(), []

    def held() -> str:
        asked.append("held")
        answering.wait()
        return "late"

    with pytest.raises(Unanswered, match=r"no answer within 0\.05 s"):
        asker.ask(held)
    with pytest.raises(Unanswered, match="still unanswered"):
        asker.ask(lambda: asked.append("second"))
    assert asked == ["held"]  # the second question was never asked
    answering.set()
    deadline = time.monotonic() + 30
    while True:  # the held question is answered now, and the asker takes questions again
        try:
            assert asker.ask(lambda: "next") == "next"
            break
        except Unanswered:
            assert time.monotonic() < deadline, "the asker never took a question again"
            time.sleep(0.01)


def test_a_bound_that_is_not_positive_is_refused() -> None:
    with pytest.raises(ValueError, match="positive"):
        Asker(0.0, "test")
