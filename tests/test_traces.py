"""Trace files and the generator."""

from __future__ import annotations

import csv
import json

import pytest

from unicron.core.errors import SpecError
from unicron.core.taxonomy import TAXONOMY, ErrorKind
from unicron.sim.mixes import LLAMA3_COUNTS, NAMED_MIXES, UNICRON_TERMINATION_MIX
from unicron.sim.traces import MAX_HOURS, Failure, generate, parse_trace, spanned_days, to_csv

from .conftest import DATA

HEADER = "time_hours,node,kind,repair_hours\n"


def test_csv_and_json_round_trip() -> None:
    failures = [Failure(1.5, 2, ErrorKind.ECC_ERROR, 3.0), Failure(0.5, 0, ErrorKind.CUDA_ERROR, 0.0)]
    assert parse_trace(to_csv(failures), "t.csv") == sorted(failures)
    as_json = json.dumps(
        {
            "failures": [
                {
                    "time_hours": f.time_hours,
                    "node": f.node,
                    "kind": f.kind.value,
                    "repair_hours": f.repair_hours,
                }
                for f in failures
            ]
        }
    )
    assert parse_trace(as_json, "t.json") == sorted(failures)


@pytest.mark.parametrize(
    ("rows", "where", "words"),
    [
        ("1,2,ecc_error\n", "line 2", "3 fields, expected 4"),
        ("x,2,ecc_error,1\n", "line 2", "must be numbers"),
        ("1,2,gremlins,0\n", "line 2", "unknown kind 'gremlins'"),
        ("1,99,ecc_error,0\n", "line 2", "node 99 does not exist"),
        ("# comment\n1,1,ecc_error,0\n-1,1,ecc_error,0\n", "line 4", "time_hours '-1' must be a number >= 0"),
        ("1,1.5,ecc_error,0\n", "line 2", "whole number"),
    ],
)
def test_bad_csv_rows_name_line_and_reason(rows: str, where: str, words: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_trace(HEADER + rows, "t.csv", nodes=16)
    assert any(p.path == where and words in p.message for p in info.value.problems), info.value


def test_bad_json_entries_name_index() -> None:
    text = json.dumps(
        [
            {"time_hours": 1, "node": 0, "kind": "ecc_error", "repair_hours": 1},
            {"time_hours": 1, "node": 0, "kind": "ecc_error"},
        ]
    )
    with pytest.raises(SpecError) as info:
        parse_trace(text, "t.json")
    assert (
        info.value.problems[0].path == "failures[1]"
        and "missing repair_hours" in info.value.problems[0].message
    )


def test_bad_header() -> None:
    with pytest.raises(SpecError, match="use the header"):
        parse_trace("when,where\n1,2\n", "t.csv")


@pytest.mark.parametrize("distribution", ["exponential", "weibull"])
def test_generator_rate_matches_mtbf(distribution: str) -> None:
    # Llama 3's rate: 419 interruptions in 54 days on 2,048 nodes.
    counts = [
        len(
            generate(
                nodes=2048,
                hours=54 * 24,
                node_mtbf_hours=6335,
                mix=NAMED_MIXES["llama3"],
                seed=seed,
                distribution=distribution,
            )
        )  # type: ignore[arg-type]
        for seed in range(4)
    ]
    assert 380 < sum(counts) / len(counts) < 460


def test_generator_is_seeded_and_repairs_only_hardware() -> None:
    a = generate(nodes=64, hours=500, node_mtbf_hours=100, mix=UNICRON_TERMINATION_MIX, seed=5)
    b = generate(nodes=64, hours=500, node_mtbf_hours=100, mix=UNICRON_TERMINATION_MIX, seed=5)
    assert a == b and len(a) > 100
    assert all((f.repair_hours > 0) == TAXONOMY[f.kind].needs_repair for f in a)
    assert {f.kind for f in a} <= set(UNICRON_TERMINATION_MIX)
    exact = generate(nodes=8, hours=168, node_mtbf_hours=1e9, mix={ErrorKind.NODE_LOST: 1}, seed=1, count=10)
    assert len(exact) == 10 and all(0 <= f.time_hours < 168 for f in exact)


def _data_rows(name: str) -> list[dict[str, str]]:
    path = DATA / name
    assert path.exists(), f"{path}: the repository's data/ folder"
    return list(csv.DictReader(line for line in path.open() if not line.startswith("#")))


def test_embedded_mixes_match_the_data_files() -> None:
    shares = {r["status"]: float(r["share_percent"]) for r in _data_rows("unicron_termination_mix.csv")}
    shares["other"] = shares.pop("others")
    shares.pop("finished")
    assert {k.value: v for k, v in UNICRON_TERMINATION_MIX.items()} == shares
    counts = {r["component"]: int(r["count"]) for r in _data_rows("llama3_interruptions.csv")}
    assert counts == LLAMA3_COUNTS and sum(counts.values()) == 419


def test_a_row_past_the_scenarios_end_is_refused_with_the_days_that_hold_it() -> None:
    rows = [{"time_hours": 1, "node": 0, "kind": "ecc_error", "repair_hours": 1},
            {"time_hours": 50, "node": 0, "kind": "ecc_error", "repair_hours": 1}]  # fmt: skip
    with pytest.raises(SpecError) as info:
        parse_trace(json.dumps(rows), "t.json", hours=48.0)
    (problem,) = info.value.problems
    assert problem.path == "failures[1]" and "past the scenario's end (48 h" in problem.message
    assert "days to 3 or more" in problem.fix
    failures = parse_trace(json.dumps(rows), "t.json")
    assert spanned_days(failures, 1.0) == 3 and spanned_days(failures, 7.0) == 7.0
    with pytest.raises(SpecError):  # ten years at most
        parse_trace(HEADER + f"{MAX_HOURS},0,ecc_error,0\n", "t.csv")
