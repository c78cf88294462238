"""Delay on a test host's link: every packet it sends or receives waits a set time first.

This kernel has no ``netem`` queueing discipline, and a proxy would delay only the connections
pointed at it (gloo connects straight to its peers' addresses). So the host's packets are queued
to this process with netfilter (``iptables -j NFQUEUE`` in the host's namespace, installed by
``netfaults.py``: ``FaultyHosts.delay``), which holds each for ``--delay-ms`` and lets it go, in
arrival order. Only the verdict crosses into this process (packets are queued with their metadata
alone), so it keeps up with a training step's bursts.

Run inside the host's namespace: ``python harness/netdelay.py --queue N --delay-ms D``;
it prints ``ready`` once the queue is bound (the rules come after, so no packet is queued before
anything takes it) and runs until killed. Needs root and the NetfilterQueue package
(``pip install 'unicron[netfaults]'``: ``make test`` installs it with the system libraries it needs).
"""

from __future__ import annotations

import argparse
import collections
import threading
import time
from typing import Any

QUEUE_LENGTH = 65_536  # packets held at once: ~0.1 s of a saturated link's segments


class Holder:
    """Packets waiting for their time, oldest first: a fixed delay keeps arrival order."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s = delay_s
        self._held: collections.deque[tuple[float, Any]] = collections.deque()
        self._ready = threading.Condition()

    def take(self, packet: Any) -> None:
        with self._ready:
            self._held.append((time.monotonic() + self.delay_s, packet))
            self._ready.notify()

    def release_forever(self) -> None:
        while True:
            with self._ready:
                while not self._held:
                    self._ready.wait()
                due, packet = self._held[0]
                wait = due - time.monotonic()
                if wait > 0:
                    self._ready.wait(wait)
                    continue
                self._held.popleft()
            packet.accept()


def main() -> None:
    parser = argparse.ArgumentParser(description="Delay every packet of this network namespace's link.")
    parser.add_argument("--queue", type=int, required=True, help="the NFQUEUE number the rules send to")
    parser.add_argument("--delay-ms", type=float, required=True, help="how long each packet waits")
    args = parser.parse_args()
    from netfilterqueue import COPY_META, NetfilterQueue

    holder = Holder(args.delay_ms / 1000)
    threading.Thread(target=holder.release_forever, daemon=True).start()
    queue = NetfilterQueue()
    queue.bind(args.queue, holder.take, max_len=QUEUE_LENGTH, mode=COPY_META)
    print("ready", flush=True)
    queue.run()


if __name__ == "__main__":
    main()
