"""Retrying a party that does not answer: backoff with jitter, and a log that says it once."""

from __future__ import annotations

import random

from unicron.core.reachability import Reachability, describe


def test_retries_back_off_to_a_cap_and_the_log_says_it_once_then_reminds_then_says_it_is_back() -> None:
    link = Reachability("the coordinator at http://10.0.0.1:8470", base_s=0.5, cap_s=4.0, remind_s=30)
    link.rng = random.Random(1)
    delays, lines = [], []
    for second in range(12):
        delay, line = link.failed(100.0 + 5 * second, TimeoutError())
        delays.append(delay)
        lines.append(line)
    ceilings = [0.5, 1, 2, 4, 4, 4, 4, 4, 4, 4, 4, 4]
    assert all(c / 2 <= d <= c for d, c in zip(delays, ceilings, strict=True))  # jittered, capped
    said = [line for line in lines if line is not None]
    assert said[0] == (
        "cannot reach the coordinator at http://10.0.0.1:8470 (TimeoutError (no answer)); "
        "retrying with backoff"
    )
    assert said[1:] == [
        "still cannot reach the coordinator at http://10.0.0.1:8470 after 30 s (TimeoutError (no answer))"
    ]
    assert link.reached(162.5) == "reached the coordinator at http://10.0.0.1:8470 again after 62.5 s"
    assert link.reached(163.0) is None and not link.away  # nothing to say while it answers
    assert link.failed(170.0, OSError("unreachable"))[0] <= 0.5  # backoff starts over


def test_an_error_is_described_by_kind_and_text() -> None:
    assert describe(ConnectionRefusedError("refused")) == "ConnectionRefusedError: refused"


def test_an_outage_of_hours_keeps_retrying_at_the_cap() -> None:
    """A retry every few seconds for a day: the backoff must stay a number, never overflow."""
    link = Reachability("the task's store", base_s=0.5, cap_s=4.0)
    for attempt in range(30_000):
        delay, _ = link.failed(float(attempt) * 4, TimeoutError())
    assert 2.0 <= delay <= 4.0


def test_a_request_that_timed_out_is_asked_again_at_once_the_first_time_then_backs_off() -> None:
    """A heartbeat whose answer was lost (a lossy link) already waited its timeout: asked again at
    once; a second timeout in a row backs off as any failure does, and an answer starts over."""
    link = Reachability("the coordinator", base_s=0.5, cap_s=4.0)
    first, line = link.timed_out(100.0, TimeoutError())
    assert first == 0.0 and line is not None and "retrying" in line
    second, _ = link.timed_out(102.0, TimeoutError())
    assert 0.5 <= second <= 1.0  # (the second failure's ceiling, jittered)
    link.reached(103.0)
    assert link.timed_out(110.0, TimeoutError())[0] == 0.0
