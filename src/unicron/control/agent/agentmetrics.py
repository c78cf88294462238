"""A node agent's own Prometheus metrics, served on ``--metrics-port`` (off by default).

What only the agent sees: the workers it started (a launch of a later generation is a restart
or a replacement), how they ended, the heartbeat's round trip to the coordinator, and each
report's latency: from when the worker made it (a step's end) to the coordinator accepting the
heartbeat that carried it. Served by prometheus-client's own HTTP server on the node's address
(``NodeAddress``), without a token: it tells counts and times only, as node exporters do; bind
it where only the monitoring system reaches.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from unicron.core.protocol import SPARE_GENERATION, ExitReport, LaunchWorker, WorkerReport

LATENCY = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class AgentMetrics:
    def __init__(self) -> None:
        self.registry = r = CollectorRegistry(auto_describe=True)
        count, seconds = partial(Counter, registry=r), partial(Histogram, registry=r, buckets=LATENCY)
        self.launches = count(
            "unicron_agent_worker_launches",
            "Workers started, by task and kind (first: the first launch; again: a restart or a"
            " newcomer; spare: a hot spare)",
            ["task", "kind"],
        )
        self.exits = count("unicron_agent_worker_exits", "Worker exits, by how they ended", ["task", "how"])
        self.heartbeat = seconds(
            "unicron_agent_heartbeat_seconds", "Round trip of a heartbeat to the coordinator"
        )
        self.report_latency = seconds(
            "unicron_agent_report_latency_seconds",
            "From a worker's report (a step's end) to the coordinator accepting it",
        )
        self.reports = count("unicron_agent_reports_relayed", "Reports relayed, by type", ["type"])
        self.reachable = Gauge(
            "unicron_agent_coordinator_reachable", "1 while the coordinator answers heartbeats", registry=r
        )
        self.workers = Gauge("unicron_agent_workers_running", "Workers running on this node", registry=r)

    def serve(self, address: str, port: int) -> int:
        """Serve ``/metrics`` on ``address:port`` (0: any free port); the port it took."""
        server, _ = start_http_server(port, addr=address, registry=self.registry)
        return int(server.server_port)

    def launched(self, order: LaunchWorker) -> None:
        kind = (
            "spare" if order.generation == SPARE_GENERATION else "first" if order.generation == 1 else "again"
        )
        self.launches.labels(order.task, kind).inc()

    def exited(self, report: ExitReport) -> None:
        how = "stopped" if report.stop_ordered else "ok" if report.code == 0 else "failed"
        self.exits.labels(report.task, how).inc()

    def beat(self, seconds: float, sent: Sequence[WorkerReport], accepted_at: float) -> None:
        """A heartbeat answered after ``seconds``, carrying ``sent`` (accepted at ``accepted_at``)."""
        self.heartbeat.observe(seconds)
        self.reachable.set(1)
        for report in sent:
            self.reports.labels(report.type).inc()
            made = getattr(report, "time", 0.0)
            if made:
                self.report_latency.observe(max(0.0, accepted_at - made))
