"""Questions to the task's store from the training path, answered within a bound.

A TCPStore client's calls wait without limit for a server that stops answering while keeping its
connections open: a frozen coordinator (SIGSTOP, a VM paused), or a link that drops packets
instead of refusing them. Measured with torch 2.13: a ``check`` against a stopped server still
waited after 60 s, whatever ``set_timeout`` said (that bounds waits for keys, not a silent peer).
A worker's step asks the store whether the coordinator posted a recovery; asked on the training
thread, such a question stopped every rank of a task for as long as the coordinator was stopped
(a probe: 4 s stopped, 4 s without a step), and a hang verdict could follow the resume.

So the step's questions go to a thread of their own, and the training thread waits for the answer
at most ``answer_s``. A question not answered by then raises ``Unanswered``; until that one
returns (its connection closed, or the server back), every later question raises it at once:
asking more on that connection would only queue behind it. Training goes on meanwhile, as it
does while the store is unreachable (``taskstore.py``).

Bounded so: the step's membership check (``TaskStore.membership_changed``, through which
``abandons_step`` and ``declared_failed`` ask) and a fault's claim; the checkpoint fence's read is
bounded the same way, on a thread of its own per read (``fencing.py``). Not bounded: a read right
after a check just answered (``TaskStore.posted``), and the recovery's own waits (``arrive``,
``next_membership``, a newcomer's readiness), which wait for the store by design and have their
own time limits where they poll.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

T = TypeVar("T")


class Unanswered(TimeoutError):
    """The store did not answer within the bound (or is still busy with a question that did not)."""


@dataclass
class _Answered(Generic[T]):
    value: T


class BoundedAsker:
    def __init__(self, answer_s: float, name: str = "unicron-store-asker") -> None:
        if not answer_s > 0:
            raise ValueError(f"answer_s must be positive, not {answer_s}")
        self.answer_s = answer_s
        self._changed = threading.Condition()
        self._question: Callable[[], object] | None = None
        self._outcome: _Answered[object] | BaseException | None = None
        self._busy = False  # a question is with the thread (it may be stuck on a silent server)
        self._closed = False
        self._thread = threading.Thread(target=self._answer, name=name, daemon=True)
        self._thread.start()

    @property
    def busy(self) -> bool:
        """Whether a question is still with the thread (one given up on, stuck)."""
        with self._changed:
            return self._busy

    def close(self) -> None:
        """No more questions: the thread ends (after the one it is stuck on, if any)."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    def ask(self, question: Callable[[], T]) -> T:
        """``question()``'s value (or its exception), asked on the asker's thread."""
        with self._changed:
            if self._busy:
                raise Unanswered("the store has not answered an earlier question yet")
            self._busy, self._question, self._outcome = True, question, None
            self._changed.notify_all()
            if not self._changed.wait_for(lambda: self._outcome is not None, self.answer_s):
                raise Unanswered(f"the store did not answer within {self.answer_s:g} s")
            outcome, self._outcome = self._outcome, None
        if isinstance(outcome, BaseException):
            raise outcome
        assert isinstance(outcome, _Answered)
        return cast(T, outcome.value)

    def _answer(self) -> None:
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._question is not None or self._closed)
                if self._question is None:
                    return  # closed
                question, self._question = self._question, None
            assert question is not None
            outcome: _Answered[object] | BaseException
            try:
                outcome = _Answered(question())
            except BaseException as exc:  # handed to the asker, whatever it is
                outcome = exc
            with self._changed:
                self._outcome, self._busy = outcome, False
                self._changed.notify_all()
