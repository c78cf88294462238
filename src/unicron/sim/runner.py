"""Run a scenario: make or load its trace, simulate every policy, relate each to the oracle."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from unicron.sim.engine import PolicyResult, Simulation
from unicron.sim.policies import make_policy
from unicron.sim.scenario import ScenarioSpec
from unicron.sim.traces import Failure, generate


@dataclass(frozen=True)
class SimulationReport:
    scenario: ScenarioSpec
    failures: list[Failure]
    results: list[PolicyResult]
    seconds: float

    def result(self, policy: str) -> PolicyResult:
        return next(r for r in self.results if r.policy == policy)


def scenario_trace(scenario: ScenarioSpec) -> list[Failure]:
    t = scenario.trace
    return generate(
        nodes=scenario.cluster.nodes,
        hours=scenario.days * 24,
        node_mtbf_hours=t.node_mtbf(scenario.cluster),
        mix=t.kind_mix(),
        seed=t.seed,
        distribution=t.distribution,
        weibull_shape=t.weibull_shape,
        repair_median_hours=t.repair_median_hours,
        repair_sigma=t.repair_sigma,
        count=t.count,
    )


# Told, during a run, the policy being simulated and the simulated hours it has reached.
Progress = Callable[[str, float], None]


def simulate(
    scenario: ScenarioSpec, failures: list[Failure] | None = None, progress: Progress | None = None
) -> SimulationReport:
    started = time.perf_counter()
    hours = scenario.days * 24
    # A generated trace may draw a failure past the end (a renewal process's last gap): not
    # replayed, not counted. A given one is replayed whole, or refused (``parse_trace(hours=)``).
    trace = [f for f in scenario_trace(scenario) if f.time_hours < hours] if failures is None else failures
    if (late := next((f for f in trace if f.time_hours >= hours), None)) is not None:
        raise ValueError(f"a failure at {late.time_hours:g} h is past the scenario's end ({hours:g} h)")
    results = []
    for name in scenario.policies:
        policy = make_policy(name, scenario.policy_settings.get(name))
        sim = Simulation(
            scenario.cluster,
            list(scenario.tasks),
            trace,
            policy,
            scenario.days * 24,
            samples=scenario.samples,
        )
        results.append(sim.run(None if progress is None else partial(progress, name)))
    oracle = next(r for r in results if r.policy == "oracle").waf_flop
    for r in results:  # no ratio for a policy that did not run (nor against an oracle that did not)
        r.ratio_to_oracle = r.waf_flop / oracle if oracle > 0 and r.did_not_run is None else None
    return SimulationReport(scenario, trace, results, time.perf_counter() - started)
