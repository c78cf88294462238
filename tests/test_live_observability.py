"""Watching the cluster (issue 16), through the real stack, during a live run with a scripted
fault (a worker killed mid-step, with its peers' gradient buckets in flight: recovered in place,
the survivors recomputing only its share of the step): the coordinator's and the agent's
Prometheus metrics count it and time it, the API gives its breakdown, ``unicron events
--follow`` prints it as it happens and ``unicron status --watch`` refreshes, every metric the
Grafana dashboard uses is served, and the dashboard page, in a real headless Chromium driven by
Selenium, shows the task, where its workers run, and the incident with the same breakdown,
without a reload (a screenshot is written). The browser part is skipped, with the reason, where
no browser can be started."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from unicron.cli.browser import dashboard_url, headless, screenshot, unavailable
from unicron.control.launch.localcluster import LocalCluster
from unicron.control.service.tokens import issue
from unicron.core.access import Role

from .conftest import ROOT
from .test_live_cluster import (
    assert_ends_exact,
    assert_every_incident_closed,
    assert_ledger_exact,
    finish_and_settle,
    full_speed,
    pace,
    story_of,
    traced_task,
)

NO_BROWSER = unavailable()
if NO_BROWSER is None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
FAULT = "  faults: [{action: kill_in_backward, rank: 1, step: 40}]\n  flops_per_sample: 1.0e7\n"
GRAFANA = ROOT / "deploy" / "grafana" / "unicron.json"


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]  # (family, labels) -> value


def samples(text: str) -> Samples:
    """A Prometheus exposition as (sample name, labels) -> value."""
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(found: Samples, name: str, **labels: str) -> float:
    return found.get((name, frozenset(labels.items())), 0.0)


def scrape(cluster: LocalCluster) -> Samples:
    response = cluster.request("GET", "/metrics")
    assert response.status_code == 200, response.text
    return samples(response.text)


_STARTED: list[subprocess.Popen[str]] = []


@pytest.fixture(autouse=True)
def _no_cli_left_behind() -> Iterator[None]:
    """A `--watch` or `--follow` started by a test that failed before interrupting it is killed
    (it would poll a coordinator that is gone for as long as the machine runs)."""
    yield
    while _STARTED:
        process = _STARTED.pop()
        if process.poll() is None:
            process.kill()
            process.communicate(timeout=30)


def cli(cluster: LocalCluster, *args: str) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "unicron.cli.main", *args, "--coordinator", cluster.url]
    env = {**os.environ, "COLUMNS": "250", "UNICRON_TOKEN_FILE": str(cluster.admin_token)}
    process = subprocess.Popen([*argv], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    _STARTED.append(process)
    return process


def interrupted(process: subprocess.Popen[str]) -> tuple[int, str]:
    """Ctrl-C to a `--watch` or `--follow`: its exit code and all it printed."""
    process.send_signal(signal.SIGINT)
    out, _ = process.communicate(timeout=30)
    return process.returncode, out


@pytest.mark.timeout(480)
def test_a_failure_is_counted_broken_down_and_shown_live(tmp_path: Path) -> None:
    trace, iterations = tmp_path / "trace.jsonl", 160
    # Any size from 2 to 4: the three survivors go on alone (no fourth leaves for a size the
    # table lacks), so that what they recompute is the dead rank's share alone.
    spec = traced_task(trace, "{2: 1.9e9, 3: 2.7e9, 4: 3.5e9}", iterations, 0.1, run_lines=FAULT)
    with LocalCluster(tmp_path / "cluster", nodes=2, slots=2, agent_metrics=True) as cluster:
        assert httpx.get(f"{cluster.url}/metrics").status_code == 401  # scraping needs a token too
        follow = cli(cluster, "events", "--follow", "--interval", "0.5")
        page = Page(cluster) if NO_BROWSER is None else None
        cluster.submit(spec)
        cluster.wait(
            lambda: cluster.task("lm")["workers"] == 4 and cluster.task("lm")["step"] > 10, 120, "4 workers"
        )
        # What is shown before the fault (step 40) is looked at with the steps slowed down (on a
        # loaded machine the browser's look outlasted the steps left at full pace), then on to it.
        pace(trace, 1.0)
        running = scrape(cluster)
        if page is not None:
            page.shows_the_task_on(4)
        pace(trace, 0.1)
        cluster.wait(lambda: bool(cluster.get("/v1/incidents")), 120, "the incident")
        cluster.wait(lambda: cluster.get("/v1/incidents")[0]["outcome"] == "recovered", 60, "its recovery")
        pace(trace, 0.5)  # time for the watch's start and its first screens within the 10 steps below
        watch = cli(cluster, "status", "--watch", "--interval", "0.5")
        at = cluster.task("lm")["step"]  # every rank's report of the recovered step is in by then:
        cluster.wait(lambda: cluster.task("lm")["step"] > at + 10, 120, "more steps")
        (incident,) = cluster.get("/v1/incidents")
        shown = page.incident(tmp_path / "dashboard.png") if page is not None else None
        after, text = scrape(cluster), cluster.request("GET", "/metrics").text
        pages = {n: httpx.get(f"http://127.0.0.1:{p}/metrics").text for n, p in cluster.agent_metrics.items()}
        agent = {n: samples(page) for n, page in pages.items()}
        watched, followed = interrupted(watch), interrupted(follow)
        full_speed(trace)  # all is seen: the rest is training to the end, compared with a failure-free run
        events, rows = finish_and_settle(cluster, trace)
    story = story_of(events)
    assert incident["outcome"] == "recovered" and incident["fault_source"] == "injected", story
    assert incident["actions"] == ["restart failed processes"] and incident["lost_micro_batches"] > 0, (
        incident
    )
    assert all(v is not None and v >= 0 for v in incident["seconds"].values()), incident

    assert_metrics(running, after, agent, incident)
    served = set(re.findall(r"unicron_[a-z_]+", "\n".join([text, *pages.values()])))  # families too
    used = set(re.findall(r"unicron_[a-z_]+", GRAFANA.read_text()))
    assert used and used <= served, used - served  # every metric the Grafana dashboard plots
    assert_printed(followed, watched, incident)
    assert_recovered_in_place(events, rows)
    assert_ledger_exact(rows, iterations, frozen=frozenset({1}), world=4)
    assert_ends_exact(tmp_path, "lm", iterations)
    if shown is None:
        pytest.skip(f"the page was not checked: no headless browser here ({NO_BROWSER})")
    assert_shown(shown, incident, tmp_path / "dashboard.png")


def assert_recovered_in_place(events: list[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """The fault itself (merged from test_live_inprocess's four-to-three case): rank 1, killed
    with its peers' gradient buckets in flight at step 40, was recovered in place (one launch,
    one incident, closed), and the three survivors recomputed exactly its share of the step (the
    buckets are copies: their own gradients were intact)."""
    kinds = [e["kind"] for e in events]
    assert kinds.count("task_launch") == 1, kinds
    assert [e["detail"]["kind"] for e in events if e["kind"] == "incident"] == ["exited_abnormally"]
    assert [e["detail"]["step"] for e in events if e["kind"] == "fault_injected"] == [40]
    recovered = [e["detail"] for e in events if e["kind"] == "in_process_recovery"]
    assert len(recovered) == 1 and recovered[0]["failed"] == [1], recovered
    recompute = [r for r in rows if r["what"] == "recompute" and r["step"] == 40]
    assert sum(r["samples"] for r in recompute) == 16 // 4, recompute
    assert_every_incident_closed(events)


def assert_metrics(
    running: Samples, after: Samples, agent: dict[str, Samples], incident: dict[str, Any]
) -> None:
    # The coordinator's metrics: the task as it ran, the cluster, the nodes...
    assert value(running, "unicron_task_state", task="lm", state="running") == 1
    assert value(running, "unicron_task_workers", task="lm") == 4
    assert value(running, "unicron_cluster_optimum_waf_flops") > 0
    assert {dict(k[1])["node"] for k in running if k[0] == "unicron_node_heartbeat_age_seconds"} == {
        "node-0",
        "node-1",
    }
    # ...and the failure: counted, timed once per phase, its lost work, the work achieved.
    assert value(after, "unicron_incidents_total", kind=incident["kind"], severity=incident["severity"]) == 1
    for phase in ("detection", "decision", "transition", "downtime"):
        assert value(after, f"unicron_{phase}_seconds_count") == 1, phase
    assert value(after, "unicron_lost_micro_batches_total", task="lm") == incident["lost_micro_batches"]
    assert (
        value(after, "unicron_cluster_waf_flops") > 0
        and value(after, "unicron_plan_table_total", outcome="lookup") >= 1
    )
    # The agents': the killed worker's exit, on its node alone; launches; reports relayed in time.
    exits = {
        n: value(a, "unicron_agent_worker_exits_total", task="lm", how="failed") for n, a in agent.items()
    }
    assert exits[incident["node"]] == 1 and sum(exits.values()) == 1, exits
    assert (
        sum(value(a, "unicron_agent_worker_launches_total", task="lm", kind="first") for a in agent.values())
        == 4
    )
    assert all(value(a, "unicron_agent_report_latency_seconds_count") > 0 for a in agent.values())


def assert_printed(followed: tuple[int, str], watched: tuple[int, str], incident: dict[str, Any]) -> None:
    # The CLI: --follow printed the incident's outcome with its breakdown as it came; --watch
    # refreshed the status with the incident table; both end on Ctrl-C without a traceback.
    assert followed[0] in (0, 1, 130) and "Traceback" not in followed[1], followed
    # The breakdown as it stood at the outcome: its timings are final then; a survivor's report of
    # its recomputed micro-batches may still arrive after the outcome and add to the count.
    timings, rest = incident["summary"].split("; lost ", 1)
    printed = re.search(
        rf"breakdown: incident {incident['incident']}: (.*); lost (\d+) step\(s\), (\d+) micro-batch",
        followed[1],
    )
    assert printed is not None and printed[1] == timings, followed[1][-3000:]
    final = re.match(r"(\d+) step\(s\), (\d+) micro-batch", rest)
    assert final is not None, rest
    assert printed[2] == final[1] and 0 < int(printed[3]) <= int(final[2]), (printed[0], rest)
    assert watched[0] in (0, 1, 130) and "Traceback" not in watched[1], watched
    assert re.search(rf"│ {incident['incident']} +│ lm .* recovered", watched[1]), watched[1][-3000:]


def assert_shown(shown: dict[str, Any], incident: dict[str, Any], screenshot: Path) -> None:
    # The page showed the API's breakdown: every phase, the lost work and the ladder's actions.
    assert shown["id"] == str(incident["incident"]) and shown["not_reloaded"] is True
    for phase, seconds in incident["seconds"].items():
        assert shown["phases"][phase].endswith(f"{seconds:.{3 if seconds < 1 else 2}f} s"), (phase, shown)
    lost = {"steps": str(incident["lost_steps"]), "micro_batches": str(incident["lost_micro_batches"])}
    assert shown["lost"] == lost and shown["actions"] == "restart failed processes", shown
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# The recovered incident's entry as the page shows it (``innerText``: the rendered text, as
# Selenium's ``text``), or null while there is none.
INCIDENT_SNAPSHOT = """
const item = document.querySelector('[data-incident][data-outcome="recovered"]');
if (!item) return null;
const texts = (attr) => Object.fromEntries(
  [...item.querySelectorAll(`[${attr}]`)].map((e) => [e.getAttribute(attr), e.innerText.trim()]));
return {
  id: item.getAttribute('data-incident'),
  phases: texts('data-phase'),
  lost: texts('data-lost'),
  actions: item.querySelector('[data-actions]').innerText.trim(),
  not_reloaded: window.notReloaded,
};
"""


class Page:
    """The dashboard in headless Chromium, opened before the task is submitted: it asks for a
    token, refuses one that may not read, and shows the cluster with a viewer's."""

    def __init__(self, cluster: LocalCluster) -> None:
        self.driver = d = headless()
        try:
            d.get(f"{cluster.url}/")
            self.wait("#login:not([hidden])", 30, "the token form")
            d.get(dashboard_url(cluster.url, issue(cluster.secret, Role.AGENT, "node-0")))
            status = lambda d: d.find_element(By.ID, "status").text  # noqa: E731
            WebDriverWait(d, 30).until(lambda d: "refused" in status(d), "an agent's token was not refused")
            d.get(dashboard_url(cluster.url, issue(cluster.secret, Role.VIEWER, "watcher")))
            self.wait("#main:not([hidden])", 30, "the cluster")
            d.execute_script("window.notReloaded = true")
        except BaseException:
            d.quit()
            raise

    def wait(self, css: str, timeout: float, what: str) -> Any:
        found: list[Any] = WebDriverWait(self.driver, timeout, poll_frequency=0.2).until(
            lambda d: d.find_elements(By.CSS_SELECTOR, css), message=f"the page never showed {what} ({css})"
        )
        return found[0]

    def shows_the_task_on(self, workers: int) -> None:
        self.wait('tr[data-task="lm"][data-state="running"]', 60, "the task running")
        assert not self.driver.find_elements(By.CSS_SELECTOR, "[data-incident]")  # nothing failed yet
        slots = self.driver.find_elements(By.CSS_SELECTOR, '.node .slot[data-task="lm"]')
        assert len(slots) == workers  # where its workers run

    def incident(self, picture: Path) -> dict[str, Any]:
        """The incident's entry once the page shows it recovered; then the screenshot. Read in
        one script, a snapshot: the page re-renders as it polls, and elements found before a
        re-render are stale after it (a CI run failed on that)."""
        try:
            shown: dict[str, Any] = WebDriverWait(self.driver, 30, poll_frequency=0.2).until(
                lambda d: d.execute_script(INCIDENT_SNAPSHOT),
                message="the page never showed the incident, recovered",
            )
            screenshot(self.driver, picture)
            return shown
        finally:
            self.driver.quit()
