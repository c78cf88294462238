"""`unicron simulate` as users run it: through a real subprocess, and in process for what a reader
sees (the table, why a policy did not run, progress, the trace format's kinds)."""

from __future__ import annotations

import io
import itertools
import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from unicron.cli.files import read_text
from unicron.cli.main import app
from unicron.cli.simulate_view import ProgressLine
from unicron.core.taxonomy import ErrorKind
from unicron.sim.report import CAUSE_COLUMNS, COLUMNS
from unicron.sim.runner import simulate
from unicron.sim.scenario import parse_scenario
from unicron.sim.traces import parse_trace

from .conftest import ROOT
from .test_cli_plan import cli, unicron

SCENARIO = str(ROOT / "examples" / "scenarios" / "trace-a.yaml")


def test_simulate_json_plot_and_trace_round_trip(tmp_path: Path) -> None:
    plot, saved = tmp_path / "waf.png", tmp_path / "trace.csv"
    out = unicron("simulate", SCENARIO, "--json", "--plot", str(plot), "--save-trace", str(saved))
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    policies = data["policies"]
    assert set(policies) == {"unicron", "megatron", "oobleck", "varuna", "bamboo", "torchft", "oracle"}
    for entry in policies.values():
        assert entry["waf_flop"] >= 0 and 0 <= entry["ratio_to_oracle"] <= 1 + 1e-9
    assert policies["oracle"]["ratio_to_oracle"] == 1
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    again = json.loads(unicron("simulate", SCENARIO, "--json", "--trace", str(saved)).stdout)
    for name, entry in policies.items():
        assert (
            abs(again["policies"][name]["waf_flop"] / entry["waf_flop"] - 1) < 1e-6
            if entry["waf_flop"]
            else True
        )


def test_simulate_table() -> None:
    out = unicron("simulate", str(ROOT / "examples" / "scenarios" / "figure3.yaml"))
    assert out.returncode == 0, out.stderr
    assert "megatron" in out.stdout and "figure3" in out.stdout


def test_bad_trace_is_a_message(tmp_path: Path) -> None:
    trace = tmp_path / "bad.csv"
    trace.write_text("time_hours,node,kind,repair_hours\n1,0,ecc_error,1\n2,0,solar_flare,0\n")
    out = unicron("simulate", SCENARIO, "--trace", str(trace))
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "line 3" in out.stderr and "unknown kind 'solar_flare'" in out.stderr


# ---------------------------------------------------------------- in process: what a reader sees

# One task too wide for a GPU's memory without tensor parallelism (oobleck, varuna and bamboo have
# none) and, with ONE_SMALL, a small one beside it; one simulated day, two node faults.
WIDE = """name: wide
days: 1
cluster: {nodes: NODES, gpus_per_node: 8, gpu: H100, node_mtbf_hours: 1000}
tasks:
  - name: wide
    weight: 1
    model: {layers: 8, hidden_size: 16384, heads: 128, sequence_length: 8192, vocabulary: 128256,
            global_batch: 16}
    min_workers: 8
    worker_step: 8
    max_workers: 16
ONE_SMALL
trace: {count: 2, mix: {node_lost: 1}, seed: 1}
samples: 20
"""
SMALL = """  - name: small
    weight: 1
    model: {layers: 24, hidden_size: 2048, heads: 16, sequence_length: 2048, vocabulary: 51200,
            global_batch: 512}
    min_workers: 8
    worker_step: 8
    max_workers: 16"""


def wide(tmp_path: Path, small: bool = False) -> str:
    path = tmp_path / "wide.yaml"
    path.write_text(WIDE.replace("NODES", "4" if small else "2").replace("ONE_SMALL", SMALL if small else ""))
    return str(path)


def test_the_table_speaks_plain_words_with_units_and_percent_signs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code, out, err = cli(capsys, "simulate", str(ROOT / "examples" / "scenarios" / "figure3.yaml"))
    assert code == 0, err
    header = next(line for line in out.splitlines() if "policy" in line)
    for column in (*COLUMNS, *CAUSE_COLUMNS.values()):
        assert column in header, (column, header)
    assert "EFLOP" not in out and "Unicron/it" not in out
    unicron = next(line for line in out.splitlines() if line.startswith("│ unicron"))
    cells = [c.strip() for c in unicron.strip("│").split("│")]
    assert cells[2].endswith("%") and cells[3].endswith("x") and all(c.endswith("%") for c in cells[4:]), (
        cells
    )
    assert "lost to each cause, in %" in " ".join(out.split())  # the legend under the table
    assert err == ""  # a short run says nothing of its progress


def test_a_policy_that_cannot_run_says_why_instead_of_a_zero_ratio(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    scenario = wide(tmp_path)
    code, out, err = cli(capsys, "simulate", scenario)
    assert code == 0, err
    for policy in ("oobleck", "varuna", "bamboo"):
        row = next(line for line in out.splitlines() if line.startswith(f"│ {policy}"))
        assert "did not run" in row and "0.00" not in row, row
        assert re.search(
            rf"{policy} did not run: wide does not fit in a GPU's memory \(80 GiB\) on 16 GPUs "
            rf"without tensor parallelism, which {policy} does not use",
            " ".join(out.split()),
        ), out
    code, out, err = cli(capsys, "simulate", scenario, "--json")
    policies = json.loads(out)["policies"]
    assert (
        policies["bamboo"]["ratio_to_oracle"] is None
        and "tensor parallelism" in policies["bamboo"]["did_not_run"]
    )
    assert policies["bamboo"]["tasks_not_run"].keys() == {"wide"}
    assert policies["unicron"]["did_not_run"] is None and 0 < policies["unicron"]["ratio_to_oracle"] <= 1


def test_a_policy_that_runs_without_one_of_its_tasks_is_compared_and_says_which(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code, out, err = cli(capsys, "simulate", wide(tmp_path, small=True), "--json")
    assert code == 0, err
    bamboo = json.loads(out)["policies"]["bamboo"]
    assert bamboo["did_not_run"] is None and 0 < bamboo["ratio_to_oracle"] < 1
    assert set(bamboo["tasks_not_run"]) == {"wide"}
    code, out, err = cli(capsys, "simulate", wide(tmp_path, small=True))
    assert "bamboo ran without wide: wide does not fit" in " ".join(out.split()), out


def test_a_long_run_tells_its_progress_on_stderr_every_few_seconds() -> None:
    path = ROOT / "examples" / "scenarios" / "figure3.yaml"
    scenario = parse_scenario(read_text(path), str(path))
    ticks = itertools.count(0.0, 0.5)  # each look at the clock: half a second later
    stream = io.StringIO()
    simulate(scenario, progress=ProgressLine(scenario, every=3.0, stream=stream, clock=lambda: next(ticks)))
    lines = stream.getvalue().splitlines()
    assert len(lines) > 3, lines
    first = re.fullmatch(
        r"simulating figure3: (\w+) \((\d) of 7 policies\), day ([\d.]+) of 7, (\d+) s so far", lines[0]
    )
    assert first is not None and first[1] == scenario.policies[int(first[2]) - 1], lines[0]
    assert 0 <= float(first[3]) <= 7 and first[4] == "3"
    assert {line.split()[2] for line in lines} >= {"unicron", "oracle"}  # every policy in turn


def test_the_trace_kinds_are_in_the_help_and_the_docs() -> None:
    result = CliRunner().invoke(app, ["simulate", "--help"], terminal_width=200)
    assert result.exit_code == 0, result.output
    page = (ROOT / "docs" / "simulation.md").read_text()
    for kind in ErrorKind:
        assert kind.value in result.output, kind
        assert f"| `{kind.value}` |" in page, kind


def test_a_trace_longer_than_the_scenario_is_refused_or_spanned_never_cut(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A trace's row past the scenario's end was dropped in silence (a 348-day public trace on a
    7-day scenario replayed nothing, and the JSON still said ``failures: 32``). Now the row is
    refused, named, with the fix; ``--span-trace`` lengthens the scenario to the trace instead,
    and ``failures`` counts the faults replayed."""
    scenario = wide(tmp_path)  # one day
    trace = tmp_path / "long.csv"
    trace.write_text("time_hours,node,kind,repair_hours\n2,0,node_lost,1\n30.5,1,node_lost,1\n")
    code, _, err = cli(capsys, "simulate", scenario, "--trace", str(trace))
    assert code == 2 and "Traceback" not in err
    assert "line 3" in err and "past the scenario's end (24 h" in err and "days to 2 or more" in err
    code, out, err = cli(capsys, "simulate", scenario, "--trace", str(trace), "--span-trace", "--json")
    assert code == 0, err
    assert (json.loads(out)["failures"], json.loads(out)["days"]) == (2, 2.0)
    code, _, err = cli(capsys, "simulate", scenario, "--span-trace")  # nothing to span
    assert code == 2 and "pass --trace FILE too" in err
    scenario_spec = parse_scenario(read_text(Path(scenario)), scenario)
    with pytest.raises(ValueError, match="past the scenario's end"):  # given whole, or refused
        simulate(scenario_spec, parse_trace(read_text(trace), str(trace)))
    # A trace the scenario spans: every fault replayed and counted, as given.
    short = tmp_path / "short.csv"
    short.write_text("time_hours,node,kind,repair_hours\n2,0,node_lost,1\n")
    code, out, err = cli(capsys, "simulate", scenario, "--trace", str(short), "--json")
    assert code == 0 and json.loads(out)["failures"] == 1, err
