"""What the dashboard page shows, as one JSON document: built from a ``ClusterView``, the WAF
history, the incidents' breakdowns and the plan events; no I/O here (``service.py`` reads them
and serves the page from ``web/``).

The page polls it about once a second, asking only for the WAF points newer than the last it
has (``since``), so that a poll stays small however long the cluster has run.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

from unicron.brain.records import EventRecord
from unicron.control.observe.breakdown import Breakdown
from unicron.control.observe.clusterview import ClusterView
from unicron.control.observe.wafhistory import WafPoint

# The page and what it loads, served as they are (no build step): name -> media type.
ASSETS = {
    "index.html": "text/html; charset=utf-8",
    "dashboard.js": "text/javascript; charset=utf-8",
    "dashboard.css": "text/css; charset=utf-8",
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",  # uPlot 1.6.32 (MIT), vendored
    "uPlot.min.css": "text/css; charset=utf-8",
}


def asset(name: str) -> bytes:
    """One of the page's files, from the package (``ASSETS`` names every one)."""
    return resources.files("unicron.control.service").joinpath("web", name).read_bytes()


def document(
    view: ClusterView,
    points: Sequence[WafPoint],
    incidents: Sequence[Breakdown],
    plans: Sequence[EventRecord],
) -> dict[str, Any]:
    return {
        "time": view.time,
        "waf": {"achieved": view.waf, "planned": view.planned_waf, "optimum": view.optimum_waf},
        "open_incidents": view.open_incidents,
        "nodes": [
            {
                "name": n.name,
                "state": n.state.value,
                "host": n.host,
                "heartbeat_age_s": round(max(0.0, view.time - n.last_seen), 3),
                "slots": [{"task": s.task, "spare": s.spare} for s in view.slots.get(n.name, ())],
            }
            for n in view.nodes
        ],
        "tasks": [
            {
                "name": t.record.name,
                "state": t.record.state.value,
                "weight": t.spec.weight,
                "workers": t.record.workers,
                "replicas": t.replicas,
                "generation": t.record.generation,
                "step": t.record.step,
                "iterations": t.spec.run.iterations,
                "failures": t.record.failures,
                "downtime_s": round(t.record.downtime(view.time), 3),
                "measured_flops": t.measured_flops,
                "planned_waf": t.planned_waf,
                "achieved_waf": t.achieved_waf,
            }
            for t in view.tasks
        ],
        "series": [{"time": p.time, "cluster": p.cluster, "tasks": dict(p.tasks)} for p in points],
        "incidents": [b.as_dict() for b in incidents],
        "plans": [
            {
                "id": e.id,
                "time": e.time,
                "source": e.detail.get("source"),
                "answers": e.detail.get("answers"),
                "why": e.detail.get("why"),
                "changes": e.detail.get("changes", {}),
                "waf": e.detail.get("waf"),
            }
            for e in plans
        ],
    }
