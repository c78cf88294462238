"""Scenario files: a cluster, its tasks, how long, how the trace is made, which policies run."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from unicron.core.errors import SpecError, SpecProblem
from unicron.core.safeyaml import load_yaml_text
from unicron.core.specs import FIX_MARK, ClusterSpec, TaskSpec, validate_spec
from unicron.core.taxonomy import ErrorKind
from unicron.sim import interruptions
from unicron.sim.mixes import NAMED_MIXES
from unicron.sim.policies import POLICY_NAMES, make_policy
from unicron.sim.traces import MAX_DAYS


class TraceSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    distribution: Literal["exponential", "weibull"] = "exponential"
    weibull_shape: float = Field(0.7, gt=0, le=1)
    node_mtbf_hours: float | None = Field(None, gt=0, description="defaults to the cluster's")
    rate: Literal["node_mtbf", "published"] = Field(
        "node_mtbf",
        description="node_mtbf: each node fails every node_mtbf_hours; published: at the rate that"
        " interrupts a job on the whole cluster as often as published figures say a job that large"
        " is (sim/interruptions.py)",
    )
    mix: str | dict[str, float] = "unicron"
    repair_median_hours: float = Field(4.0, gt=0)
    repair_sigma: float = Field(1.0, ge=0)
    count: int | None = Field(None, ge=0, description="exactly this many failures, uniform in time")
    seed: int = 0

    @field_validator("mix")
    @classmethod
    def _mix(cls, value: str | dict[str, float]) -> str | dict[str, float]:
        if isinstance(value, str):
            if value not in NAMED_MIXES:
                raise ValueError(f"unknown mix {value!r}{FIX_MARK}use {', '.join(NAMED_MIXES)} or a mapping")
            return value
        kinds = {k.value for k in ErrorKind}
        for name, weight in value.items():
            if name not in kinds:
                raise ValueError(f"unknown kind {name!r}{FIX_MARK}use kinds from: {', '.join(sorted(kinds))}")
            if weight < 0:
                raise ValueError(f"weight of {name!r} is negative{FIX_MARK}use weights >= 0")
        if not any(w > 0 for w in value.values()):
            raise ValueError(f"the mix has no positive weight{FIX_MARK}give at least one kind a weight")
        return value

    @model_validator(mode="after")
    def _one_rate(self) -> TraceSettings:
        if self.rate == "published" and self.count is not None:
            raise ValueError(
                f"count places exactly that many failures, whatever the rate{FIX_MARK}drop count,"
                " or drop rate: published"
            )
        if self.rate == "published" and self.node_mtbf_hours is not None:
            raise ValueError(
                f"rate: published sets each node's rate from the cluster's size{FIX_MARK}drop"
                " node_mtbf_hours, or drop rate: published"
            )
        return self

    def node_mtbf(self, cluster: ClusterSpec) -> float:
        """Each node's mean hours between failures for this trace."""
        if self.rate == "published":
            return interruptions.node_mtbf_hours(cluster.nodes, cluster.gpus_per_node)
        return self.node_mtbf_hours or cluster.node_mtbf_hours

    def kind_mix(self) -> dict[ErrorKind, float]:
        if isinstance(self.mix, str):
            return dict(NAMED_MIXES[self.mix])
        return {ErrorKind(k): w for k, w in self.mix.items() if w > 0}


class ScenarioSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str = ""
    days: float = Field(gt=0, le=MAX_DAYS, description="how long the scenario runs (ten years at most)")
    cluster: ClusterSpec
    tasks: list[TaskSpec] = Field(min_length=1)
    trace: TraceSettings = TraceSettings()
    policies: list[str] = Field(default_factory=lambda: list(POLICY_NAMES))
    policy_settings: dict[str, dict[str, Any]] = Field(default_factory=dict)
    samples: int = Field(400, ge=10, le=100_000, description="points of the WAF-over-time curve")

    @field_validator("policies")
    @classmethod
    def _policies(cls, value: list[str]) -> list[str]:
        for name in value:
            if name not in POLICY_NAMES:
                raise ValueError(f"unknown policy {name!r}{FIX_MARK}use some of {', '.join(POLICY_NAMES)}")
        if "oracle" not in value:
            value = [*value, "oracle"]  # every ratio is reported against it
        return value

    @model_validator(mode="after")
    def _names(self) -> ScenarioSpec:
        names = [t.name for t in self.tasks]
        if len(set(names)) != len(names):
            raise ValueError(f"task names repeat{FIX_MARK}give every task its own name")
        return self


def parse_scenario(text: str, source: str) -> ScenarioSpec:
    scenario = validate_spec(ScenarioSpec, load_yaml_text(text, source), source)
    problems = []
    for name, overrides in scenario.policy_settings.items():
        try:
            make_policy(name, overrides)
        except ValidationError as exc:
            for err in exc.errors(include_url=False):
                where = ".".join(str(x) for x in err["loc"])
                problems.append(
                    SpecProblem(
                        f"policy_settings.{name}.{where}",
                        str(err["msg"]),
                        "see docs/simulation.md for the settings",
                    )
                )
        except ValueError as exc:
            problems.append(SpecProblem(f"policy_settings.{name}", str(exc), "use a known policy"))
    if problems:
        raise SpecError(source, problems)
    return scenario
