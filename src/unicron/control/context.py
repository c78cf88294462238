"""What every part of the coordinator shares: its settings, the store (read-only: writes go
through the applier), the applier, the clock (injected, so that tests step it by hand) and the
parsed task specs."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from unicron.control.act.effects import Applier
from unicron.control.store.reads import StoreReads
from unicron.core.cadence import Pace
from unicron.core.livespecs import DEFAULT_LIVE_CLUSTER, LiveClusterSpec, LiveTaskSpec
from unicron.core.settings import Settings
from unicron.core.workerenv import WorkerEnv
from unicron.planning.gpt import flops_per_sample


@dataclass(frozen=True)
class CoordinatorSettings:
    state_dir: Path
    checkpoint_root: Path
    advertise_host: str = "127.0.0.1"  # where workers reach the rendezvous stores
    cluster: LiveClusterSpec = DEFAULT_LIVE_CLUSTER  # the planner's hardware inputs (--cluster)
    limits: Settings = field(default_factory=Settings)
    # Where the state is kept: ``etcd://host:port,...[/prefix]``; None: SQLite in ``state_dir``.
    store: str | None = None
    url: str = ""  # where this coordinator serves (announced to the others while it leads)

    @property
    def store_location(self) -> str | Path:
        return self.store or self.state_dir / "unicron.sqlite"


@dataclass
class Context:
    settings: CoordinatorSettings
    store: StoreReads
    act: Applier
    clock: Callable[[], float]
    _specs: dict[str, LiveTaskSpec] = field(default_factory=dict)
    _sample_flops: dict[str, float | None] = field(default_factory=dict)
    # How often agents beat and how long a node may be silent, for the cluster's size
    # (``core/cadence.py``): set by detection as nodes come and go, read where a heartbeat's
    # cadence matters.
    pace: Pace = field(init=False)

    def __post_init__(self) -> None:
        self.pace = Pace.start(self.settings.limits)

    @property
    def limits(self) -> Settings:
        return self.settings.limits

    def spec(self, name: str) -> LiveTaskSpec:
        """A task's spec; specs never change, so each is parsed once (reports are a hot path)."""
        if name not in self._specs:
            self._specs[name] = LiveTaskSpec.model_validate_json(self.store.get_task(name).spec)
        return self._specs[name]

    def flops_per_sample(self, name: str) -> float | None:
        """FLOPs of one sample of a task, for its measured WAF: from its ``model:`` when it has
        one, else as declared (``run.flops_per_sample``); None: not measured."""
        if name not in self._sample_flops:  # (every iteration report asks)
            spec = self.spec(name)
            declared = spec.run.flops_per_sample
            self._sample_flops[name] = flops_per_sample(spec.model) if spec.model is not None else declared
        return self._sample_flops[name]

    def forgot_spec(self, name: str) -> None:
        """The name now holds another task (submitted again once its task ended)."""
        self._specs.pop(name, None)
        self._sample_flops.pop(name, None)

    def checkpoint_dir(self, name: str) -> Path:
        """A task's checkpoint folder: NAME under the checkpoint root for the first task of a
        name; a later run of the name (submitted again once the earlier one ended) writes to
        NAME#RUN, so it starts afresh and the earlier run's checkpoints stay as they were (the
        ended task kept as NAME#RUN' still names its own folder)."""
        task = self.store.task(name)
        base, run = self.spec(name).name, 1 if task is None else task.run
        return self.settings.checkpoint_root / (base if run == 1 else f"{base}#{run}")

    def forget_task(self, name: str, only: str | None = None) -> None:
        """The task ended: every node (or ``only`` that one) frees its in-memory checkpoints."""
        self.act.forget_task(name, self.checkpoint_dir(name), self.spec(name).run.env, only)

    def worker_env(
        self, name: str, generation: int, world: int, port: int, joining: bool = False, spare: bool = False
    ) -> dict[str, str]:
        """The task's part of its workers' environment (the agent adds the node's part)."""
        spec = self.spec(name)
        contract = WorkerEnv(
            task=name,
            generation=generation,
            world_size=world,
            replica_size=spec.run.replica_size,
            store=f"{self.settings.advertise_host}:{port}",
            store_key=self.act.rendezvous.key(name),
            checkpoint_dir=str(self.checkpoint_dir(name)),
            iterations=spec.run.iterations,
            checkpoint_every=spec.run.checkpoint_every,
            checkpoint_async=spec.run.checkpoint_async,
            pg_timeout_s=self.limits.process_group_timeout_s,
            membership_timeout_s=self.limits.membership_timeout_s,
            storage_wait_s=self.limits.storage_wait_s,
            recovery=spec.run.recovery,
            check_finite=spec.run.check_finite,
            spike_factor=spec.run.spike_factor,
            spike_window=spec.run.spike_window,
            on_bad_data=spec.run.on_bad_data,
            digest_every=spec.run.digest_every,
            faults=self._faults(name) or None,
            joining=joining,
            spare=spare,
            preload=",".join(spec.run.preload) or None,
        )
        return {**contract.to_env(), **spec.run.env}

    def _faults(self, name: str) -> list[dict[str, Any]]:
        """The task's faults, their generations counted from its run's first (a name's later
        run numbers its generations after the earlier runs'; 0, whichever, stays 0)."""
        task = self.store.task(name)
        offset = 0 if task is None else task.first_generation - 1
        faults = [f.model_dump() for f in self.spec(name).run.faults]
        return [{**f, "generation": f["generation"] + offset} if f["generation"] else f for f in faults]
