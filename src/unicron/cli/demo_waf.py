"""The demo's WAF over time: measured on the live cluster, and predicted by the simulator.

The live side samples each task's weighted FLOP (weight x FLOPs per sample x samples trained) and
worker count while the demo runs; WAF is the rate of that sum over a sliding window. The
simulator replays the same events (the node lost and back at the same seconds) with the
Unicron policy, on tasks whose throughput tables are what the coordinator measured (scaled from
the declared tables where a count was not measured). The comparison stops when the first task
finishes (the simulator's tasks run forever).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from unicron.core.extras import require
from unicron.core.livespecs import LiveClusterSpec, LiveTaskSpec
from unicron.core.specs import ClusterSpec, TaskSpec, TransitionSettings
from unicron.core.taxonomy import ErrorKind
from unicron.planning.throughput import MeasuredCurve, curve_for
from unicron.sim.engine import Simulation
from unicron.sim.policies import make_policy
from unicron.sim.traces import Failure

HOUR = 3600.0


@dataclass
class WafRecorder:
    """Samples of (seconds since start, weighted FLOP per task, running workers per task)."""

    started: float
    samples: list[tuple[float, dict[str, float], dict[str, int]]] = field(default_factory=list)

    def record(self, now: float, tasks: Sequence[Mapping[str, Any]]) -> None:
        flop = {t["name"]: float(t["weighted_flop"]) for t in tasks}
        workers = {t["name"]: int(t["workers"]) if t["state"] == "running" else 0 for t in tasks}
        self.samples.append((now - self.started, flop, workers))

    def waf(self, window_s: float = 6.0) -> tuple[np.ndarray, np.ndarray]:
        """Live cluster WAF (weighted FLOP/s) at each sample, over the window before it."""
        t = np.array([s[0] for s in self.samples])
        total = np.array([sum(s[1].values()) for s in self.samples])
        rate = np.zeros_like(t)
        for i in range(len(t)):
            j = int(np.searchsorted(t, t[i] - window_s))
            if t[i] > t[j]:
                rate[i] = (total[i] - total[j]) / (t[i] - t[j])
        return t, rate


def measured_rates(events: Sequence[Mapping[str, Any]]) -> dict[str, dict[int, float]]:
    """The median throughput the coordinator measured per task and worker count."""
    seen: dict[str, dict[int, list[float]]] = {}
    for e in events:
        if e["kind"] == "throughput_measured" and "flops" in e["detail"]:  # (not samples/s)
            per = seen.setdefault(e["task"], {}).setdefault(int(e["detail"]["workers"]), [])
            per.append(float(e["detail"]["flops"]))
    return {t: {c: float(np.median(v)) for c, v in per.items()} for t, per in seen.items()}


def transition_from_events(
    events: Sequence[Mapping[str, Any]], tasks: Sequence[Mapping[str, Any]], checkpoint_every: int
) -> TransitionSettings:
    """The simulator's transition times as this live run measured them (the defaults describe
    large models on real clusters): launch to first step, in-place grow, node-loss detection,
    and the time between checkpoints. The restart is measured on relaunches (generation 2 on)
    where there are any."""
    launched = {
        (e["task"], e["detail"]["generation"]): e["time"] for e in events if e["kind"] == "task_launch"
    }
    starts = {
        key: e["time"] - launched[key]
        for e in events
        if e["kind"] == "task_running" and (key := (e["task"], e["detail"].get("generation"))) in launched
    }
    # A restart is a relaunch after a failure; first launches (all tasks at once) start slower.
    relaunches = [s for (_, generation), s in starts.items() if generation > 1] or list(starts.values())
    grows = [float(e["detail"]["waited_s"]) for e in events if e["kind"] == "task_grown"]
    silent = [float(e["detail"]["silent_s"]) for e in events if e["kind"] == "node_lost"]
    steps = [
        (t["finished"] - t["started"]) / t["step"]
        for t in tasks
        if t["finished"] is not None and t["started"] is not None and t["step"]
    ]
    default = TransitionSettings()
    return TransitionSettings(
        node_loss_detection_s=float(np.median(silent)) if silent else default.node_loss_detection_s,
        restart_process_s=float(np.median(relaunches)) if relaunches else default.restart_process_s,
        reconfigure_s=float(np.median(grows)) if grows else default.reconfigure_s,
        checkpoint_interval_s=checkpoint_every * float(np.median(steps))
        if steps
        else default.checkpoint_interval_s,
    )


@dataclass(frozen=True)
class LiveFailure:
    """A failure of the live run, for the simulator: when, what the live node ran, its kind, and
    how long until the node was back (0 for failures that need no repair)."""

    time_s: float
    hit: Mapping[str, int]
    kind: ErrorKind
    repair_s: float = 0.0


def predicted(
    specs: Sequence[LiveTaskSpec],
    hardware: LiveClusterSpec,
    measured: Mapping[str, Mapping[int, float]],
    nodes: int,
    slots: int,
    failures: Sequence[LiveFailure],
    horizon_s: float,
    bins: int,
    transition: TransitionSettings,
) -> tuple[np.ndarray, np.ndarray, dict[str, dict[int, float]]]:
    """The simulator's cluster WAF over time for the same events, with the measured curves and
    transition times. Returns bin centres (s), WAF per bin, and the throughput tables it used."""
    cluster = ClusterSpec(
        **hardware.model_dump(exclude={"planner"}),
        nodes=nodes,
        gpus_per_node=slots,
        planner=hardware.planner.model_copy(update={"transition": transition}),
    )
    gpu = cluster.gpu_type()
    tasks, tables = [], {}
    for s in specs:
        base = curve_for(s, gpu, slots)
        curve = MeasuredCurve(base, tuple(sorted(measured.get(s.name, {}).items())))
        counts = np.array(sorted(s.throughput or {}), dtype=np.int64)
        table = {int(c): float(r) for c, r in zip(counts, curve.evaluate(counts).rate, strict=True)}
        tables[s.name] = table
        tasks.append(TaskSpec(name=s.name, weight=s.weight, throughput=table))
    # Each failure strikes the simulated node that runs what the live node ran (the two
    # placements may number nodes differently).
    probe = Simulation(cluster, tasks, [], make_policy("unicron"), horizon_s / HOUR, samples=1)
    probe.set_allocation(probe.ideal()[1])
    held = {n: {k: v for k, v in a.items() if v} for n, a in sorted(probe.assignment.items())}
    trace = []
    for f in failures:
        wanted = {k: v for k, v in f.hit.items() if v}
        node = next(
            (n for n, a in held.items() if a == wanted),
            next((n for n, a in held.items() if set(wanted) <= set(a)), nodes - 1),
        )
        trace.append(Failure(f.time_s / HOUR, node, f.kind, f.repair_s / HOUR))
    result = Simulation(cluster, tasks, trace, make_policy("unicron"), horizon_s / HOUR, samples=bins).run()
    hours = np.array(result.timeline_hours)
    starts = np.concatenate([[0.0], hours[:-1]])
    return (starts + hours) / 2 * HOUR, np.array(result.timeline_waf), tables


def phase_means(times: np.ndarray, waf: np.ndarray, edges: Sequence[float]) -> list[float]:
    """Mean WAF in each interval between consecutive ``edges``."""
    out = []
    for a, b in itertools.pairwise(edges):
        inside = (times >= a) & (times < b)
        out.append(float(waf[inside].mean()) if inside.any() else float("nan"))
    return out


def plot(
    path: Path,
    recorder: WafRecorder,
    prediction: tuple[np.ndarray, np.ndarray],
    lost_s: float,
    back_s: float,
    horizon_s: float,
    node: str,
) -> None:
    matplotlib = require("matplotlib", "plot", "the demo's WAF figure")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, live = recorder.waf()
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(10, 6.5), sharex=True, gridspec_kw={"height_ratios": [3, 2]}
    )
    top.plot(t, live / 1e9, label="live (measured)", color="tab:blue")
    top.plot(
        prediction[0],
        prediction[1] / 1e9,
        label="simulator (same events)",
        color="tab:orange",
        linestyle="--",
    )
    for ax in (top, bottom):
        ax.axvspan(lost_s, back_s, color="red", alpha=0.08)
        ax.axvline(horizon_s, color="grey", linestyle=":", linewidth=1)
    top.set(ylabel="cluster WAF (weighted GFLOP/s)", title=f"make demo: WAF over time (red: {node} lost)")
    top.legend(loc="lower left", fontsize=8)
    names = sorted(recorder.samples[0][2]) if recorder.samples else []
    times = [s[0] for s in recorder.samples]
    stacks = [[s[2].get(n, 0) for s in recorder.samples] for n in names]
    bottom.stackplot(times, stacks, labels=names, step="post", alpha=0.8)
    bottom.set(xlabel="seconds since the tasks were submitted", ylabel="workers")
    bottom.legend(loc="upper right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
