"""What an operator's tools do to a running coordinator: a Prometheus scrape of ``/metrics`` and
a dashboard tab's poll of ``/v1/dashboard``, each once a ``period_s``, from a thread of this
process (on this machine: its CPU counts against the run it watches). Each answer's time is kept.
"""

from __future__ import annotations

import threading
import time
from types import TracebackType

import httpx

from unicron.control.launch.localcluster import LocalCluster

PATHS = ("/metrics", "/v1/dashboard")


class Scraper:
    def __init__(self, cluster: LocalCluster, period_s: float = 1.0) -> None:
        self.cluster, self.period_s = cluster, period_s
        self.seconds: dict[str, list[float]] = {path: [] for path in PATHS}
        self.failures = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        own = self.cluster.credentials
        with httpx.Client(
            base_url=self.cluster.url, timeout=10.0, headers=own.headers, verify=own.verify
        ) as client:
            while not self._halt.wait(self.period_s):
                for path in PATHS:
                    began = time.perf_counter()
                    try:
                        client.get(path).raise_for_status()
                        self.seconds[path].append(time.perf_counter() - began)
                    except httpx.HTTPError:
                        self.failures += 1

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._halt.set()
        self._thread.join(15)
