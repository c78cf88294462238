"""A cut link, Unicron against torchrun: the same script, the same fault, test hosts of their own.

Both run across test hosts (network namespaces with their own addresses, ``control/launch/testhosts.py``)
with 2 workers per host; the fault cuts one host's link (its bridge port down: every packet lost,
its processes still running), after training passed step 10.

- Unicron: the coordinator on one host, an agent on each of two more (2 slots each), the task on
  all 4 slots. Detection: from the cut to the coordinator's ``node_lost`` event. Downtime: from
  the cut to the first step the survivors complete after re-forming without the host.
- torchrun: `torch.distributed.run` on each of two hosts (``--nnodes 1:2``, c10d rendezvous on the
  first host, the process-group timeout tuned to 20 s as in the other benchmarks: with gloo's
  default, 30 minutes); the second host is cut. torchrun has no detection event: detection is its
  first reaction the workers can see (a survivor's SIGTERM or collective error, or the relaunch);
  downtime runs to the first step completed after the relaunch (resumed from its checkpoint).

It also measures what the harness's delay does (``harness/netfaults.py``: ``FaultyHosts.delay``):
the time of one gloo all-reduce between two test hosts as one of them delays every packet by 0, 5
and 20 ms.

Writes docs/bench/network.json and docs/multi-host.md; ``python -m bench.network_bench`` (run by
`make bench`); ``--delay`` measures the delay rows alone, keeping the others. Needs root and
network namespaces; without them it writes nothing and says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench import cells
from bench.torchrun import TRAIN, runs_train, trace_rows
from harness.netfaults import FaultyHosts, delay_unavailable
from unicron.control.launch.localcluster import LocalCluster
from unicron.control.launch.testhosts import TestHosts, unavailable

ROOT = Path(__file__).resolve().parents[1]
ARGS = ["--global-batch", "16", "--micro-batch", "2", "--dataset-size", "512", "--step-delay", "0.02"]
REPEATS = int(os.environ.get("UNICRON_BENCH_REPEATS", "3"))
PG_TIMEOUT_S = 20.0  # torchrun's process-group timeout, tuned as in the detection benchmark
CUT_AFTER_STEP = 10
DELAYS_MS = (0.0, 5.0, 20.0)
PROBE_PORT = 29600  # the probe's store, on the first test host (its ports are all free)


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def _first_step_after(rows: list[dict[str, Any]], when: float, generation_above: int) -> float | None:
    done = [
        r["time"]
        for r in rows
        if r["what"] == "samples" and r["time"] > when and r["generation"] > generation_above
    ]
    return min(done) if done else None


def unicron_once(root: Path) -> dict[str, float]:
    trace = root / "trace.jsonl"
    program = ", ".join(["python", str(TRAIN), *ARGS])
    spec = (
        "name: cut\nweight: 1\nthroughput: {2: 1.9e9, 4: 3.5e9}\nrun:\n"
        f"  program: [{program}]\n  iterations: 2000\n  checkpoint_every: 50\n"
        f"  env: {{UNICRON_TRACE_FILE: {trace}}}\n"
    )
    with TestHosts(3) as hosts, LocalCluster(root / "cluster", nodes=2, slots=2, hosts=hosts) as cluster:
        cluster.submit(spec)
        cluster.wait(
            lambda: cluster.task("cut")["step"] > CUT_AFTER_STEP and cluster.task("cut")["workers"] == 4,
            300,
            "training on 4 workers",
        )
        generation = int(cluster.task("cut")["generation"])
        cut = time.time()
        cluster.cut_link("node-1")
        cluster.wait(
            lambda: any(e["kind"] == "node_lost" and e["time"] > cut for e in cluster.get("/v1/events")),
            60,
            "the node loss",
        )
        lost = next(e for e in cluster.get("/v1/events") if e["kind"] == "node_lost" and e["time"] > cut)
        _wait(
            lambda: _first_step_after(trace_rows(trace), cut, generation) is not None, 120, "a step after it"
        )
        resumed = _first_step_after(trace_rows(trace), cut, generation)
        assert resumed is not None
        return {"detection_s": round(lost["time"] - cut, 4), "downtime_s": round(resumed - cut, 4)}


class MultiNodeTorchrun:
    """torchrun on two test hosts (2 workers each), elastic down to one host."""

    def __init__(self, root: Path, hosts: TestHosts) -> None:
        root.mkdir(parents=True, exist_ok=True)
        self.trace, self.hosts = root / "trace.jsonl", hosts
        endpoint = f"{hosts['h0'].address}:29400"
        env = {
            **os.environ,
            "UNICRON_TRACE_FILE": str(self.trace),
            "UNICRON_PG_TIMEOUT": str(PG_TIMEOUT_S),
            "UNICRON_FAULTS": "[]",
            "GLOO_SOCKET_IFNAME": hosts["h0"].interface,  # each host's one interface (same name)
            "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",  # see bench/torchrun.py
        }
        self.processes = []
        for host in (hosts["h0"], hosts["h1"]):
            cmd = [
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes", "1:2", "--nproc-per-node", "2",
                "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id", "cut",
                # torchrun tells whether it hosts the rendezvous from the host name, which
                # resolves to 127.0.0.1 here (as on many machines): told outright instead.
                "--rdzv-conf", f"is_host={int(host.name == 'h0')}",
                "--local-addr", host.address,
                "--max-restarts", "1", "--monitor-interval", "0.1",
                str(TRAIN), *ARGS, "--iterations", "2000", "--checkpoint-dir", str(root / "ckpt"),
            ]  # fmt: skip
            with (root / f"torchrun-{host.name}.log").open("wb") as log:
                argv = hosts.command(host, cmd)
                self.processes.append(
                    subprocess.Popen(
                        argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
                    )
                )

    def rows(self) -> list[dict[str, Any]]:
        return trace_rows(self.trace)

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        # Workers run in sessions of their own (torchrun starts them so): killed by pid.
        for r in self.rows():
            if r["what"] == "started" and runs_train(r["pid"]):  # (not a reused pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(r["pid"], signal.SIGKILL)


def torchrun_once(root: Path) -> dict[str, float | None]:
    with TestHosts(2) as hosts:
        job = MultiNodeTorchrun(root, hosts)
        try:
            _wait(
                lambda: (
                    len({r["rank"] for r in job.rows() if r["what"] == "started"}) == 4
                    and any(r["what"] == "samples" and r["step"] > CUT_AFTER_STEP for r in job.rows())
                ),
                300,
                "torchrun training on 4 workers",
            )
            cut = time.time()
            hosts.cut(hosts["h1"])
            survivors = {r["pid"] for r in job.rows() if r["what"] == "started" and r["rank"] in (0, 1)}

            def reaction() -> float | None:
                seen = [
                    r["time"]
                    for r in job.rows()
                    if r["time"] >= cut
                    and (
                        (r["what"] in ("sigterm", "exception") and r["pid"] in survivors)
                        or (r["what"] == "started" and r["generation"] >= 2)
                    )
                ]
                return min(seen) if seen else None

            _wait(lambda: reaction() is not None, PG_TIMEOUT_S + 120, "torchrun's reaction")
            detected = reaction()
            assert detected is not None
            try:
                _wait(
                    lambda: _first_step_after(job.rows(), cut, 1) is not None,
                    240,
                    "a step after the relaunch",
                )
                resumed = _first_step_after(job.rows(), cut, 1)
            except TimeoutError:
                resumed = None  # no relaunch completed a step: said as such
            return {
                "detection_s": round(detected - cut, 4),
                "downtime_s": None if resumed is None else round(resumed - cut, 4),
            }
        finally:
            job.close()


def summary(samples: list[dict[str, float | None]], key: str) -> dict[str, Any]:
    values = [s[key] for s in samples]
    known = [v for v in values if v is not None]
    return {
        "median_s": statistics.median(known) if known else None,
        "max_s": max(known) if known else None,
        "samples": values,
    }


def delay_rows(folder: Path) -> list[dict[str, float]]:
    """The all-reduce time between two test hosts at each of ``DELAYS_MS`` on the second."""
    with FaultyHosts(2) as hosts:
        first, second = hosts.hosts
        ranks = []
        for rank, host in enumerate((first, second)):
            argv = [sys.executable, "-m", "bench.allreduce_probe", str(rank), first.address]
            argv += [str(PROBE_PORT), str(len(DELAYS_MS)), str(folder)]
            ranks.append(
                subprocess.Popen(hosts.command(host, argv), stdout=subprocess.PIPE, text=True, cwd=ROOT)
            )
        rows = []
        for phase, ms in enumerate(DELAYS_MS):
            hosts.delay(second, ms)
            (folder / f"go-{phase}").touch()
            assert ranks[0].stdout is not None
            measured = json.loads(ranks[0].stdout.readline())
            rows.append(
                {"delay_ms": ms, "round_trip_added_ms": 2 * ms, "allreduce_ms": measured["allreduce_ms"]}
            )
        for rank in ranks:
            rank.wait(60)
    return rows


def measure_delay() -> dict[str, Any] | None:
    reason = unavailable() or delay_unavailable()
    if reason is not None:
        print(f"delay rows skipped: {reason}")
        return None
    with tempfile.TemporaryDirectory(prefix="unicron-delay-") as tmp:
        rows = delay_rows(Path(tmp))
    return {"floats": 1000, "repeats": 20, "rows": rows}


def main() -> dict[str, Any] | None:
    reason = unavailable()
    if reason is not None:
        print(f"network bench skipped: no test hosts here ({reason})")
        return None
    with tempfile.TemporaryDirectory(prefix="unicron-network-") as tmp:
        ours = [unicron_once(Path(tmp) / f"unicron-{i}") for i in range(REPEATS)]
        theirs = [torchrun_once(Path(tmp) / f"torchrun-{i}") for i in range(REPEATS)]
    result = {
        "fault": "cut_link",
        "after_step": CUT_AFTER_STEP,
        "workers": {"hosts": 2, "per_host": 2},
        "unicron": {"detection": summary(ours, "detection_s"), "downtime": summary(ours, "downtime_s")},
        "torchrun_tuned": {
            "detection": summary(theirs, "detection_s"),
            "downtime": summary(theirs, "downtime_s"),
            "process_group_timeout_s": PG_TIMEOUT_S,
        },
        "target_detection_s": 3.0,
        "delay": measure_delay(),
    }
    save(result)
    return result


def save(result: dict[str, Any]) -> None:
    (ROOT / "docs" / "bench").mkdir(parents=True, exist_ok=True)
    (ROOT / "docs" / "bench" / "network.json").write_text(json.dumps(result, indent=2) + "\n")
    write_markdown(result)


def only_delay() -> dict[str, Any] | None:
    """The delay rows measured again, the cut-link rows kept from the last run."""
    result = json.loads((ROOT / "docs" / "bench" / "network.json").read_text())
    result["delay"] = measure_delay()
    save(result)
    return result


def cut_link_rows() -> dict[str, str]:
    """The cut-link rows that docs/detection.md and docs/recovery.md carry (keys ``detection``,
    ``recovery``), from the last network bench's JSON; none where it has not run."""
    path = ROOT / "docs" / "bench" / "network.json"
    if not path.exists():
        return {}
    r = json.loads(path.read_text())
    ours, theirs = r["unicron"], r["torchrun_tuned"]
    label = f"cut link ({r['workers']['hosts']} hosts x {r['workers']['per_host']}, `bench/network_bench.py`)"
    down = [f"{side['downtime']['median_s']:.2f}" for side in (ours, theirs)]
    return {
        "detection": f"| {label} | {cells.timing(ours['detection'])} | {cells.timing(theirs['detection'])} |",
        "recovery": f"| {label} | {' | '.join(down)} | {' | '.join([cells.NOT_MEASURED] * 4)} |",
    }


def _cell(entry: dict[str, Any]) -> str:
    if entry["median_s"] is None:
        return "none completed"
    return f"{entry['median_s']:.2f} s (max {entry['max_s']:.2f})"


def _delay_table(delay: dict[str, Any] | None) -> str:
    if not delay:
        return "(not measured: the last run had no test hosts or could not delay packets)"
    lines = ["| delay on one host | round trip through it | one all-reduce |", "|---|---|---|"]
    lines += [
        f"| {row['delay_ms']:g} ms | +{row['round_trip_added_ms']:g} ms | {row['allreduce_ms']:.1f} ms |"
        for row in delay["rows"]
    ]
    return "\n".join(lines)


def write_markdown(r: dict[str, Any]) -> None:
    """The measured table of docs/multi-host.md (the rest of the page is the template's)."""
    ours, theirs = r["unicron"], r["torchrun_tuned"]
    rows = "\n".join(
        f"| {label} | {_cell(ours[key])} | {_cell(theirs[key])} |"
        for label, key in (("detection", "detection"), ("downtime to the next step", "downtime"))
    )
    template = (Path(__file__).parent / "templates" / "multi-host.md").read_text()
    (ROOT / "docs" / "multi-host.md").write_text(
        template.format(
            rows=rows,
            delay_rows=_delay_table(r.get("delay")),
            repeats=len(ours["detection"]["samples"]),
            pg=theirs["process_group_timeout_s"],
            after=r["after_step"],
            target=r["target_detection_s"],
        )
    )


if __name__ == "__main__":
    if sys.argv[1:] == ["--docs"]:  # the page again from the last measured figures (a text change)
        write_markdown(json.loads((ROOT / "docs" / "bench" / "network.json").read_text()))
    elif sys.argv[1:] == ["--delay"]:
        print(json.dumps(only_delay(), indent=2))
    else:
        print(json.dumps(main(), indent=2))
