"""How a party that must reach another over the network (an agent its coordinator, a worker its
rendezvous store) retries and what it says: decided here, without I/O, with the clock passed in.

Retries back off exponentially from ``base_s`` to ``cap_s`` with jitter (so that a cluster's
agents do not all return at once to a restarted coordinator), and the log says it once when the
other side stops answering, reminds every ``remind_s`` while it stays away, and says when it is
back and after how long; nothing in between (one line per failed heartbeat buried the logs).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


def describe(error: BaseException) -> str:
    """An error as a log line shows it: its kind, and its text when it has one (a timeout's is
    often empty)."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text}" if text else f"{type(error).__name__} (no answer)"


@dataclass
class Reachability:
    """One link's state: ``what`` names the other side in messages ("the coordinator at URL")."""

    what: str
    base_s: float
    cap_s: float = 5.0
    remind_s: float = 30.0
    rng: random.Random = field(default_factory=random.Random)
    failures: int = 0
    since: float | None = None  # when it stopped answering
    said: float = 0.0  # when that was last said

    def failed(self, now: float, error: BaseException) -> tuple[float, str | None]:
        """Another failed attempt at ``now``: how long to wait before the next, and the line to
        log (None: nothing new to say)."""
        self.failures += 1
        # The exponent stops growing long before the cap is passed: an outage of hours (a retry
        # every cap_s) must not overflow the float.
        ceiling = min(self.cap_s, self.base_s * 2 ** min(self.failures - 1, 60))
        delay = ceiling * (0.5 + 0.5 * self.rng.random())
        if self.since is None:
            self.since = self.said = now
            return delay, f"cannot reach {self.what} ({describe(error)}); retrying with backoff"
        if now - self.said >= self.remind_s:
            self.said = now
            away = now - self.since
            return delay, f"still cannot reach {self.what} after {away:.0f} s ({describe(error)})"
        return delay, None

    def timed_out(self, now: float, error: BaseException) -> tuple[float, str | None]:
        """An attempt that reached the other side and had no answer within its timeout: as
        :meth:`failed`, except that the first in a row is retried at once. Its timeout has spaced
        the attempts out already, and a lone lost answer (a lossy link: one segment lost a few
        times in a row) is mended by asking again on a fresh connection, where a back-off on top
        of the timeout outlasts the time the other side gives us (an agent's heartbeat that timed
        out after 2 s, then waited up to 0.5 s more, left its node silent past a 2.5 s deadline at
        a tenth of its packets lost). Further failures back off as usual."""
        delay, line = self.failed(now, error)
        return (0.0 if self.failures == 1 else delay), line

    def reached(self, now: float) -> str | None:
        """A successful attempt: the line to log if the other side had been away."""
        away, self.since, self.failures = self.since, None, 0
        return None if away is None else f"reached {self.what} again after {now - away:.1f} s"

    @property
    def away(self) -> bool:
        return self.since is not None
