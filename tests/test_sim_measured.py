"""The simulator's torchft runs on what this repository measured with torchft itself, in the CLI
as on docs/simulation.md: ``src/unicron/sim/measured.py`` is what ``bench/simulation_docs.py``
writes from the committed docs/bench figures, the policy's defaults carry it, and a scenario
replayed as `unicron simulate` replays it gives torchft what the docs' run gives it (the CLI
used round figures once: 2 s detection, 30 s heal, no step cost, torchft at 0.98-1.00 of the
oracle where the docs said 0.91-0.92)."""

from __future__ import annotations

from bench import simulation_docs
from unicron.cli.files import read_text
from unicron.sim import measured
from unicron.sim.policies import make_policy
from unicron.sim.runner import simulate
from unicron.sim.scenario import parse_scenario

from .conftest import ROOT


def test_the_measured_module_is_what_the_benchmark_writes_from_the_committed_figures() -> None:
    figures = simulation_docs.torchft_measured()
    assert figures == measured.TORCHFT
    written = simulation_docs.measured_module(figures)
    assert (ROOT / "src" / "unicron" / "sim" / "measured.py").read_text() == written, (
        "src/unicron/sim/measured.py is stale: python -c 'from bench.simulation_docs import"
        " write_measured; write_measured()'"
    )


def test_the_cli_replays_torchft_as_the_docs_do() -> None:
    settings = make_policy("torchft").s
    got = {key: getattr(settings, key) for key in measured.TORCHFT}
    assert got == measured.TORCHFT
    path = ROOT / "examples" / "scenarios" / "trace-a.yaml"
    as_cli = simulate(parse_scenario(read_text(path), str(path))).result("torchft")
    as_docs = simulation_docs.run("trace-a").result("torchft")
    assert as_cli.waf_flop == as_docs.waf_flop
