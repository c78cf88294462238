"""`unicron simulate` as users run it, through a real subprocess."""

from __future__ import annotations

import json
from pathlib import Path

from .conftest import ROOT
from .test_cli_plan import unicron

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
