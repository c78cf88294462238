"""``unicron demo`` (``make demo``): the live system on an embedded local cluster.

Starts a coordinator and 4 agents of 2 slots on loopback, submits the three tasks of
examples/demo/tasks.yaml (one of them carries a CUDA-like error injected by the fault library),
injects a scripted sequence of faults (kill a worker, lose a whole node, bring it back), shows
live progress, and ends with a report per task. Exits non-zero if a task did not finish or lost
progress. Every process it started is stopped at the end, also on Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from unicron.cli import browser, demo_waf
from unicron.cli.console import console
from unicron.cli.live import task_table
from unicron.control.launch.localcluster import LocalCluster
from unicron.control.launch.taskfile import read_task_file
from unicron.control.launch.testhosts import TestHosts, unavailable
from unicron.control.service.tokens import issue
from unicron.core.access import Role
from unicron.core.errors import UsageError
from unicron.core.extras import require
from unicron.core.livespecs import parse_live_cluster, parse_live_tasks
from unicron.core.taxonomy import ErrorKind

TASKS = Path("examples/demo/tasks.yaml")
SHOT_AFTER_S = 20  # the dashboard is photographed this long after the lost node is back
CLUSTER = Path("examples/demo/cluster.yaml")  # the planner's hardware inputs
NEWS = (
    "task_launch",
    "incident",
    "outcome",
    "hang_detected",
    "straggler",
    "node_lost",
    "node_back",
    "node_isolated",
    "task_finished",
    "task_resize",
    "in_process_recovery",
    "task_grow",
    "task_grown",
    "task_shrink",
    "plan",
    "throughput_measured",
)
DETAILS = (
    "workers",
    "generation",
    "resume_from",
    "why",
    "reason",  # what the plan said of a task it launched, resized or grew (a stop's comparison)
    "after",
    "silent_s",
    "step",
    "placement",
    "kind",
    "severity",
    "action",
    "detection_s",
    "outcome",
    "downtime_s",
    "failed",
    "survivors",
    "source",
    "answers",
    "changes",
    "flops",
)


@dataclass
class Step:
    """One scripted fault: when ``ready`` holds, do ``act`` and say ``what``."""

    what: str
    ready: Callable[[LocalCluster], bool]
    act: Callable[[LocalCluster], None]


def _task(cluster: LocalCluster, name: str) -> dict[str, Any]:
    return cluster.task(name)


def script(marks: dict[str, Any]) -> list[Step]:
    def running(name: str, step: int) -> Callable[[LocalCluster], bool]:
        return lambda c: _task(c, name)["state"] == "running" and _task(c, name)["step"] >= step

    def lose(c: LocalCluster) -> None:  # on test hosts: its link is cut, its processes run on
        # A node of the heaviest task: the planner then has to take slots from a lighter one.
        held: dict[str, dict[str, int]] = {}
        for w in c.get("/v1/workers"):
            if w["state"] in ("launching", "running"):
                per = held.setdefault(w["node"], {})
                per[w["task"]] = per.get(w["task"], 0) + 1
        node = next((n for n, per in sorted(held.items()) if set(per) == {"alpha"}), "node-3")
        marks.update(lost=time.time(), node=node, hit=held.get(node, {}))
        if c.hosts is not None:
            c.cut_link(node)
        else:
            c.kill_node(node)

    def back(c: LocalCluster) -> None:
        marks["back"] = time.time()
        if c.hosts is not None:
            c.heal_link(marks["node"])
        else:
            c.start_agent(marks["node"])

    def kill_worker(c: LocalCluster) -> None:
        c.kill_worker("alpha", 1)

    losing = (
        "cut the link of a node of alpha: its agent and workers run on, unreachable"
        if marks.get("hosts")
        else "lose a node of alpha: its agent and workers die"
    )
    return [
        Step("kill worker rank 1 of alpha (SIGKILL)", running("alpha", 100), kill_worker),
        Step(losing, running("alpha", 250), lose),
        Step(
            "bring the node back",
            lambda c: time.time() - marks.get("lost", time.time()) > 25,
            back,
        ),
    ]


def view(cluster: LocalCluster, log: list[str]) -> Group:
    table = task_table(cluster.get("/v1/tasks"), "Unicron demo: tasks")
    nodes = "  ".join(f"{n['name']}: {n['state']} {n['used'] or ''}" for n in cluster.get("/v1/nodes"))
    return Group(table, Text(f"nodes  {nodes}"), Text("\n".join(log[-8:])))


def report(cluster: LocalCluster) -> tuple[Table, list[str]]:
    problems = []
    table = Table(
        "task",
        "weight",
        "iterations",
        "failures seen",
        "restarts",
        "downtime",
        "WAF (GFLOP/s)",
        "parameters",
        title="Report",
        title_justify="left",
    )
    events = cluster.get("/v1/events", limit=1_000_000)
    for t in cluster.get("/v1/tasks"):
        table.add_row(
            t["name"],
            f"{t['weight']:g}",
            f"{t['step']}/{t['iterations']}",
            str(t["failures"]),
            str(t["restarts"]),
            f"{t['downtime_s']:.1f} s",
            f"{t['waf'] / 1e9:.2f}",
            t["digest"] or "-",
        )
        if t["state"] != "finished" or t["step"] != t["iterations"]:
            problems.append(f"{t['name']} did not finish ({t['state']}, step {t['step']}/{t['iterations']})")
        # Progress is lost if a relaunch resumed from before a checkpoint known to be saved.
        saved = 0
        for e in events:
            if e["task"] != t["name"]:
                continue
            if e["kind"] == "incident":
                saved = max(saved, e["detail"].get("checkpoint_step") or 0)
            elif e["kind"] == "task_launch" and (e["detail"].get("resume_from") or 0) < saved:
                resumed = e["detail"].get("resume_from")
                problems.append(f"{t['name']} resumed from step {resumed}, but step {saved} was saved")
    return table, problems


def plans_table(cluster: LocalCluster, t0: float) -> Table:
    """Every plan the coordinator carried out: the allocation before and after, and whether it
    was looked up in the precomputed table (and for which event) or solved."""
    table = Table("at", "plan", "answers", "allocation before -> after", title="Plans", title_justify="left")
    for e in cluster.get("/v1/events", limit=1_000_000):
        if e["kind"] == "plan":
            table.add_row(*plan_row(e["detail"], e["time"] - t0))
    return table


def plan_row(plan: dict[str, Any], at_s: float) -> list[str]:
    """A plan event as a row: when, table or solved (and why), the event it answers, the changes
    (the demo's report and docs/live-cluster.md)."""
    changes = ", ".join(f"{t} {a}->{b}" for t, (a, b) in sorted(plan["changes"].items())) or "no change"
    where = plan["source"] if plan["source"] == "table" else f"solved ({plan['why']})"
    return [f"{round(at_s)} s", where, plan["answers"] or "-", changes]


def waf_report(
    cluster: LocalCluster, recorder: demo_waf.WafRecorder, marks: dict[str, Any], root: Path
) -> Table:
    """Live WAF against the simulator's prediction for the same events, per phase; writes the
    plot (waf.png) and the figures (waf.json) next to the logs."""
    events = cluster.get("/v1/events", limit=1_000_000)
    t0 = recorder.started
    lost_s, back_s = marks["lost"] - t0, marks["back"] - t0
    finished = [e["time"] - t0 for e in events if e["kind"] == "task_finished"]
    horizon = min(finished) if finished else recorder.samples[-1][0]
    running = next((s[0] for s in recorder.samples if all(s[2].values())), 0.0)
    specs = parse_live_tasks(TASKS.read_text(), str(TASKS))
    measured = demo_waf.measured_rates(events)
    every = min(s.run.checkpoint_every for s in specs)
    transition = demo_waf.transition_from_events(events, cluster.get("/v1/tasks"), every)
    failures = _live_failures(events, marks, t0)
    hardware = parse_live_cluster(CLUSTER.read_text(), str(CLUSTER))
    pt, pw, tables = demo_waf.predicted(
        specs, hardware, measured, 4, 2, failures, horizon, max(10, int(horizon)), transition
    )
    lt, lw = recorder.waf()
    edges = [running, lost_s, back_s, horizon]
    live_means, sim_means = demo_waf.phase_means(lt, lw, edges), demo_waf.phase_means(pt, pw, edges)
    demo_waf.plot(root / "waf.png", recorder, (pt, pw), lost_s, back_s, horizon, marks["node"])
    phases = [
        "all running, before the loss",
        f"{marks['node']} lost",
        f"{marks['node']} back, until a task ends",
    ]
    rows = [
        {"phase": p, "from_s": a, "to_s": b, "live_waf": lv, "simulated_waf": sv}
        for p, a, b, lv, sv in zip(phases, edges[:-1], edges[1:], live_means, sim_means, strict=True)
    ]
    allocations = [{"time_s": e["time"] - t0, **e["detail"]} for e in events if e["kind"] == "plan"]
    comparison = {
        "phases": rows,
        "measured_flops": measured,
        "simulated_tables": tables,
        "simulated_transition": transition.model_dump(),
        "simulated_failures": [
            {"time_s": f.time_s, "hit": dict(f.hit), "kind": f.kind.value, "repair_s": f.repair_s}
            for f in failures
        ],
        "plans": allocations,
    }
    (root / "waf.json").write_text(json.dumps(comparison, indent=2) + "\n")
    return _phases_table(rows, root)


def _live_failures(
    events: list[dict[str, Any]], marks: dict[str, Any], t0: float
) -> list[demo_waf.LiveFailure]:
    """The run's failures for the simulator: the node loss, and every other incident (the killed
    worker, the error), at the same seconds."""
    lost_s, back_s = marks["lost"] - t0, marks["back"] - t0
    failures = [demo_waf.LiveFailure(lost_s, marks["hit"], ErrorKind.NODE_LOST, back_s - lost_s)]
    for e in events:
        if e["kind"] == "incident" and e["detail"]["kind"] != ErrorKind.NODE_LOST.value:
            failures.append(
                demo_waf.LiveFailure(e["time"] - t0, {e["task"]: 1}, ErrorKind(e["detail"]["kind"]))
            )
    return failures


def _phases_table(rows: list[dict[str, Any]], root: Path) -> Table:
    table = Table(
        "phase",
        "seconds",
        "live WAF (GFLOP/s)",
        "simulated (GFLOP/s)",
        "live / simulated",
        title=f"WAF: live against the simulator for the same events (plot: {root / 'waf.png'})",
        title_justify="left",
    )
    for r in rows:
        ratio = r["live_waf"] / r["simulated_waf"] if r["simulated_waf"] else float("nan")
        table.add_row(
            r["phase"],
            f"{r['from_s']:.0f}-{r['to_s']:.0f}",
            f"{r['live_waf'] / 1e9:.2f}",
            f"{r['simulated_waf'] / 1e9:.2f}",
            f"{ratio:.2f}",
        )
    return table


@dataclass
class _Watch:
    """The demo's loop: follows the events, injects the script's faults when due, records WAF,
    and shows it all (a live table on a terminal, lines and a progress line in a log file)."""

    cluster: LocalCluster
    out: Console
    started: float
    log: list[str] = field(default_factory=list)
    last_event: int = 0
    shown: int = 0
    last_progress: float = 0.0

    def say(self, text: str) -> None:
        self.log.append(f"[{time.time() - self.started:6.1f} s] {text}")

    def once(self, steps: list[Step], recorder: demo_waf.WafRecorder) -> list[dict[str, Any]]:
        """One turn of the loop; the tasks as they are now."""
        for e in self.cluster.get("/v1/events", since=self.last_event):
            self.last_event = e["id"]
            if e["kind"] in NEWS:
                detail = {k: v for k, v in e["detail"].items() if k in DETAILS}
                self.say(f"{e['kind']} {e['task'] or e['node']} {detail}")
        if steps and steps[0].ready(self.cluster):
            step = steps.pop(0)
            self.say(f"FAULT: {step.what}")
            step.act(self.cluster)
        tasks: list[dict[str, Any]] = self.cluster.get("/v1/tasks")
        recorder.record(time.time(), tasks)
        return tasks

    def show(self, live: Live | None, tasks: list[dict[str, Any]]) -> None:
        if live is not None:
            live.update(view(self.cluster, self.log))
            return
        for line in self.log[self.shown :]:
            self.out.print(line, markup=False)
        self.shown = len(self.log)
        if time.time() - self.last_progress > 10:
            self.last_progress = time.time()
            states = (
                f"{t['name']} {t['state']} {t['step']}/{t['iterations']} on {t['workers']}" for t in tasks
            )
            self.out.print("progress: " + ", ".join(states), markup=False)


def run_demo(root: Path, timeout_s: float = 900, hosts: int | None = None) -> int:
    """The demo on loopback, or (``hosts``) with the coordinator and each of ``hosts`` agents on
    a test host of its own (network namespaces: ``control/launch/testhosts.py``)."""
    out = console()

    def stop(*_: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)  # also when started where SIGINT was ignored
    require("matplotlib", "plot", "the demo (it ends with its WAF figure)")  # before minutes of it
    test_hosts = _test_hosts(hosts)
    where = "on loopback" if test_hosts is None else "each on a test host of its own (+1 for the coordinator)"
    nodes = hosts or 4
    out.print(f"Starting a coordinator and {nodes} agents of 2 slots {where} (state and logs in {root}) ...")
    cluster = LocalCluster(root, nodes=nodes, slots=2, cluster=CLUSTER.resolve(), hosts=test_hosts)
    watch = _Watch(cluster, out, time.time())
    try:
        cluster.start()
        created = cluster.submit(read_task_file(TASKS).text)  # its programs: relative to its folder
        watch.say("submitted " + ", ".join(f"{t['name']} (weight {t['weight']:g})" for t in created))
        marks: dict[str, Any] = {"hosts": test_hosts is not None}
        steps = script(marks)
        recorder = demo_waf.WafRecorder(time.time())
        live = Live(view(cluster, watch.log), console=out, refresh_per_second=2) if out.is_terminal else None
        with live or contextlib.nullcontext():
            while True:
                tasks = watch.once(steps, recorder)
                if "shot" not in marks and time.time() - marks.get("back", time.time()) > SHOT_AFTER_S:
                    marks["shot"] = _photograph(cluster, root)
                    watch.say(marks["shot"])
                watch.show(live, tasks)
                if all(t["state"] in ("finished", "failed", "cancelled") for t in tasks) and not steps:
                    break
                if time.time() - watch.started > timeout_s:
                    watch.say("timed out")
                    break
                time.sleep(0.5)
        return _final_report(cluster, out, recorder, marks, root, watch.started)
    except KeyboardInterrupt:
        out.print("interrupted: stopping every process")
        return 130
    finally:
        cluster.close()
        if test_hosts is not None:
            test_hosts.close()


def _photograph(cluster: LocalCluster, root: Path) -> str:
    """The dashboard as a viewer sees it once the node is back (``bench/demo_docs.py`` copies
    it to docs/dashboard.png); on test hosts the browser would have to run inside one: not done."""
    if cluster.hosts is not None:
        return "no screenshot: the coordinator is on a test host"
    token = issue(cluster.secret, Role.VIEWER, "demo-screenshot")
    return browser.photograph_dashboard(cluster.url, token, root / "dashboard.png")


def _test_hosts(count: int | None) -> TestHosts | None:
    """``count`` agent hosts and one for the coordinator, made now; refused with the reason
    (and the fix) where network namespaces cannot be made."""
    if count is None:
        return None
    if not 2 <= count <= 16:
        raise UsageError(f"--hosts {count}: the demo runs on 2 to 16 test hosts (4 is its usual size)")
    reason = unavailable()
    if reason is not None:
        raise UsageError(f"--hosts needs network namespaces, and {reason}: run as root, or drop --hosts")
    return TestHosts(count + 1).create()


def _final_report(
    cluster: LocalCluster,
    out: Console,
    recorder: demo_waf.WafRecorder,
    marks: dict[str, Any],
    root: Path,
    started: float,
) -> int:
    table, problems = report(cluster)
    out.print(table)
    out.print(plans_table(cluster, recorder.started))
    if "back" in marks:
        out.print(waf_report(cluster, recorder, marks, root))
    out.print(f"demo took {time.time() - started:.0f} s; logs in {root / 'logs'} and {root / 'agents'}")
    for p in problems:
        out.print(f"[red]FAILED: {p}[/red]")
    if not problems:
        out.print("[green]every task finished with all its iterations; no progress was lost[/green]")
    return 1 if problems else 0
