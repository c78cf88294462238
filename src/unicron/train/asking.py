"""Questions to a store that may not answer, asked from a thread of their own and waited for at
most a bound, one at a time.

A coordinator that stops running without closing its connections (SIGSTOP, a paused virtual
machine, a host too loaded to schedule it) answers nothing, and torch's TCPStore client then
waits past its own timeout: here a ``check``, a ``get`` and a new connection's first exchange,
each with a timeout of 2 s, were all still waiting after 15 s (the ``get`` after 45 s) while the
store's process was stopped. Training must not wait with them (``taskstore.py``): a question not
answered within the bound is taken as the store being away (:class:`Unanswered`), and while it
stays unanswered the next one is not asked, so a store that stopped answering holds up at most
one thread.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class Unanswered(Exception):
    """The store has not answered (this question within the bound, or the one before it)."""


class Asker:
    """Asks the questions given to :meth:`ask` in its own daemon thread (one that never answers
    must not hold the process's exit), and waits for each at most ``bound_s``."""

    def __init__(self, bound_s: float, name: str) -> None:
        if bound_s <= 0:
            raise ValueError(f"an asker's bound must be positive, not {bound_s}")
        self.bound_s, self.name = bound_s, name
        self._questions: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]]] = queue.SimpleQueue()
        self._pending: Future[Any] | None = None
        self._thread: threading.Thread | None = None

    def ask(self, question: Callable[[], T]) -> T:
        """``question``'s answer (or what it raised), if the store gives it within the bound."""
        if self._pending is not None and not self._pending.done():
            raise Unanswered(f"{self.name}: the last question is still unanswered")
        if self._thread is None:
            self._thread = threading.Thread(target=self._answer, name=f"unicron-{self.name}", daemon=True)
            self._thread.start()
        answer: Future[T] = Future()
        self._pending = answer
        self._questions.put((question, answer))
        try:
            return answer.result(timeout=self.bound_s)
        except TimeoutError:
            raise Unanswered(f"{self.name}: no answer within {self.bound_s:g} s") from None

    def _answer(self) -> None:
        while True:
            question, answer = self._questions.get()
            try:
                answer.set_result(question())
            except BaseException as exc:  # (given to the asker, who raises it)
                answer.set_exception(exc)
