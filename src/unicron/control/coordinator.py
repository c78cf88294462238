"""The coordinator: dispatches requests and reports to its parts, ticks, and applies.

Synchronous, on the service's event loop, one call at a time (no races); ``control.service``
only translates requests into these calls. The parts, one concept each:

- ``detection.py``: hangs, workers that never started (judged on the tick); ``nodewatch.py``:
  silent nodes, and the coordinator's own lateness;
- ``recovery.py``: incidents, fault scope, carrying out what a failure decides
  (``brain/deciding.py``, ``brain/response.py``: pure functions of a ``brain/snapshot.py``
  snapshot, returning effects);
- ``generations.py``: in-place shrinks and grows under way (their arithmetic and effects:
  ``brain/membership.py``);
- ``placing.py``: the planner's answer carried out, hot spares;
- ``reports.py``: the workers' reports and detection's verdicts, routed to the part that acts;
- ``stepping.py``: what each completed step changes (counts, rates, statistics, recovery);
- ``effects.py``: the applier, the only code that writes the store, the rendezvous stores and
  the agents' order queues (the rest hold the store as ``StoreReads``); ``store.py``: the only SQL.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from unicron.brain.records import TaskRecord
from unicron.brain.takeover import store_moved
from unicron.control.act.effects import Applier, Orders
from unicron.control.act.rendezvous import Rendezvous
from unicron.control.context import Context, CoordinatorSettings
from unicron.control.detect.detection import Detector
from unicron.control.detect.nodewatch import NodeWatch, stalled_for
from unicron.control.detect.tail import Finished, Tail
from unicron.control.detect.vanished import Vanished
from unicron.control.observe.clusterview import Viewer
from unicron.control.observe.metrics import Metrics
from unicron.control.observe.wafhistory import WafHistory
from unicron.control.place.draining import drainable, resumable, returning_state
from unicron.control.place.placing import Placer
from unicron.control.place.rates import RateMeter
from unicron.control.place.removal import forgettable, removable
from unicron.control.place.resubmission import reusable
from unicron.control.recover.attribution import Attribution
from unicron.control.recover.generations import Generations
from unicron.control.recover.recovery import Recovery
from unicron.control.recover.storagewatch import StorageWatch
from unicron.control.reports import Reports, end_task
from unicron.control.stepping import Steps
from unicron.control.store.backend import Backend
from unicron.control.store.journal import Journal
from unicron.control.store.location import open_backend
from unicron.control.store.reads import StoreReads
from unicron.control.store.secret import load_or_create_secret
from unicron.control.store.store import Store
from unicron.core.access import check_token_id
from unicron.core.errors import Conflict
from unicron.core.kept import (
    DeviceMends,
    FaultSigns,
    InFlight,
    Isolations,
    LossesHeld,
    MeasuredRates,
    NodeErrors,
    RevokedToken,
    RevokedTokens,
    StepTimes,
    StorageIncidents,
    TaskLadder,
)
from unicron.core.ladder import Ladder
from unicron.core.livespecs import LiveTaskSpec, replica_misfit
from unicron.core.protocol import (
    SPARE_GENERATION,
    ExitReport,
    Heartbeat,
    HeartbeatReply,
    OrderBatch,
    Registration,
    RegistrationReply,
    WorkerReport,
    WorkerState,
)
from unicron.core.states import SLOT_HOLDING_PHASES, NodeState, TaskState, WorkerPhase

__all__ = ["Coordinator", "CoordinatorSettings"]

KEEP_STEP_TIMES_S = 10.0


class Coordinator:
    def __init__(
        self,
        settings: CoordinatorSettings,
        clock: Callable[[], float] = time.time,
        loop_clock: Callable[[], float] = time.monotonic,
        backend: Backend | None = None,
        write_behind: Callable[[Exception], None] | None = None,
    ) -> None:
        # ``loop_clock`` times the loop itself (a stall of this process); tests that step
        # ``clock`` by hand pass time without stalling. ``write_behind``: the store's writes go
        # through a journal (the service's way); called if they are fenced.
        self.loop_clock = loop_clock
        self.settings = settings
        self.limits = settings.limits
        backend = backend or open_backend(settings.store_location)
        store = Store(backend, Journal(backend, write_behind) if write_behind else None)
        self.journal = store.journal
        self.store: StoreReads = store  # writes go through the applier (self.act)
        self.orders_out = Orders(next_seq=int(clock() * 1e6))
        # The tasks' stores: on the advertised address, keys derived from the cluster secret.
        rendezvous = Rendezvous(settings.advertise_host, load_or_create_secret(settings.state_dir))
        self.act = Applier(store, rendezvous, self.orders_out)
        self.ctx = Context(settings, store, self.act, clock)
        self.clock = clock
        self.generations = Generations(self.ctx)
        ladder = Ladder(self.limits)
        self.signs = Attribution(self.ctx, ladder)
        self.recovery = Recovery(self.ctx, self.generations, ladder, self.signs)
        self.detector = Detector(self.ctx, self.recovery)  # the generations' health
        self.nodes = NodeWatch(self.ctx)  # the nodes' silence
        self.rates = RateMeter(window_s=self.limits.measure_window_s, change=self.limits.measure_change)
        self.placer = Placer(self.ctx, self.generations, self.rates)
        self.steps = Steps(self.ctx, self.detector, self.recovery, self.placer, self.rates)
        self.storage = StorageWatch(self.ctx)
        self.reports = Reports(
            self.ctx,
            self.detector,
            self.recovery,
            self.generations,
            self.placer,
            self.steps,
            self.storage,
            self.signs,
        )
        # What operators watch (nothing decides on it): the WAF over time, metrics, the view.
        self.history = WafHistory()
        self.viewer = Viewer(
            self.ctx,
            self.placer,
            self.rates,
            self.history,
            self.recovery.open_count,
            self.nodes.late_s,
            self.journal.behind_s if self.journal is not None else lambda: 0.0,
            self.nodes.holding,
        )
        self.metrics = Metrics(self.viewer.view)
        self.act.listeners.append(self.metrics.on_event)
        self.vanished = Vanished(self.ctx)  # rows whose processes are gone unreported
        self.tail = Tail(self.ctx, self.detector)
        self.recovery.rebuild()
        self._restore_kept()
        self.placer.rebuild_spares()
        self.dirty = True
        self.last_tick: float | None = None  # when the loop last ran (a long gap: it stalled)
        self.forgot_at = -math.inf  # when lost nodes were last looked over (to forget)
        for task, served in self.act.host_task_stores():
            nodes = {w.node for w in self.store.workers(task.name) if w.state in SLOT_HOLDING_PHASES}
            address = f"{self.act.rendezvous.host_address}:{served}"
            self.act.apply(store_moved(task, task.store_port, address, nodes), clock())
        self.generations.orphaned_newcomers()
        gpu = settings.cluster.gpu_type()
        live, mtbf = len(self.store.tasks(live_only=True)), settings.cluster.node_mtbf_hours
        judged_from = self.detector.started(clock())
        self.act.record(
            "coordinator_started",
            tasks=live,
            gpu=gpu.name,
            peak_flops=gpu.peak_flops,
            node_mtbf_hours=mtbf,
            hangs_judged_from=judged_from,
        )

    def _restore_kept(self) -> None:
        """What decides behaviour and is not a row of its own: kept by the parts, restored here
        (from the previous coordinator's store, or empty on a first start)."""
        tasks = [t.name for t in self.store.tasks(live_only=True)]
        nodes = [n.name for n in self.store.nodes()]
        for ended in (t.name for t in self.store.tasks() if not t.state.live):
            # (left when the coordinator stopped between a task's end and its release: a name
            # submitted again is another task, which must not inherit its counts)
            self.act.keep_of(TaskLadder, None, ended)
            self.act.keep_of(FaultSigns, None, ended)
        ladder = self.recovery.ladder
        ladder.restore(self.store.kept_records(TaskLadder, tasks), self.store.kept_records(NodeErrors, nodes))
        self.rates.restore(self.store.kept_record(MeasuredRates) or MeasuredRates())
        self.signs.restore(self.store.kept_records(FaultSigns, tasks))
        self.reports.mends.restore(self.store.kept_record(DeviceMends) or DeviceMends())
        isolated = [node.name for node in self.store.nodes() if node.state is NodeState.ISOLATED]
        self.recovery.restore_isolations(self.store.kept_record(Isolations) or Isolations(), isolated)
        self.generations.restore(self.store.kept_record(InFlight) or InFlight())
        self.storage.restore(self.store.kept_record(StorageIncidents) or StorageIncidents())
        self.revoked = frozenset(
            t.jti for t in (self.store.kept_record(RevokedTokens) or RevokedTokens()).tokens
        )
        self.detector.restore_step_times(self.store.kept_record(StepTimes) or StepTimes())
        self.nodes.hold_losses((self.store.kept_record(LossesHeld) or LossesHeld()).held)
        self.step_times_kept: tuple[float, dict[str, list[float]]] = (0.0, self.detector.step_times())

    def spec(self, name: str) -> LiveTaskSpec:
        return self.ctx.spec(name)

    # ------------------------------------------------------------------ user API
    def submit(self, *specs: LiveTaskSpec) -> None:
        """Add tasks: all of them, or (a name is taken by a live task) none. A name whose task
        has ended is free: that task is kept as NAME#RUN (``place/resubmission.py``)."""
        holding = self.store.workers_in(SLOT_HOLDING_PHASES)
        again = {s.name for s in specs if reusable(s.name, self.store.task(s.name), holding)}
        nodes = self.store.nodes()
        if nodes and (misfit := next(filter(None, (replica_misfit(s, nodes[0].slots) for s in specs)), None)):
            raise Conflict(misfit)
        for spec in specs:
            if spec.name in again:
                self._replace(spec)
            else:
                self.act.add_task(spec.name, spec.model_dump_json(), self.clock())
            self.act.record("task_submitted", task=spec.name, weight=spec.weight)
        self.placer.submitted(tuple(s.name for s in specs))  # planned once its table is built

    def _replace(self, spec: LiveTaskSpec) -> None:
        """The name's ended task is kept as NAME#RUN, with its measured rates; the new one
        starts afresh (its own checkpoint folder: ``Context.checkpoint_dir``)."""
        old = self.store.get_task(spec.name)
        kept = self.act.replace_task(spec.name, spec.model_dump_json(), self.clock())
        self.ctx.forgot_spec(spec.name)
        self.rates.renamed(spec.name, kept)
        self.act.keep(self.rates.kept())
        ended, run = old.state.value, old.run + 1
        self.act.record("task_replaced", task=spec.name, kept_as=kept, run=run, state=ended, step=old.step)

    def cancel(self, name: str) -> bool:
        """Cancel a live task; False (nothing to do) for one that has ended already."""
        task = self.store.get_task(name)
        if not task.state.live:
            return False
        self.ctx.act.stop_generation(name, task.generation, self.limits.stop_grace_s)
        end_task(self.ctx, name, TaskState.CANCELLED, "task_cancelled")
        self.placer.stop_spares_of(name)
        self._release_ended()
        return True

    def remove_node(self, name: str) -> None:  # an admin forgets a lost node (a stale registration)
        removable(name, self.store.node(name), self.store.held_slots().get(name, {}))
        self._remove_node(name, "an admin removed it")

    def drain_node(self, name: str, reason: str) -> None:  # an admin takes a node out (place/draining.py)
        drainable(name, self.store.node(name))
        self.act.node_out_of_service(name, NodeState.DRAINING, "node_draining", reason=reason)
        self.dirty = True

    def resume_node(self, name: str) -> None:  # an admin puts a drained or isolated node back
        resumable(name, self.store.node(name))
        self.recovery.released(name)
        self.act.node_out_of_service(name, NodeState.HEALTHY, "node_resumed")
        self.dirty = True

    def node_losses(self) -> LossesHeld:
        """An admin's hold on node losses, as kept."""
        return self.store.kept_record(LossesHeld) or LossesHeld()

    def hold_node_losses(self, held: bool, reason: str) -> None:
        """An admin holds every node loss (no silent node is declared lost) or releases the
        hold (``detect/silence.py``); kept, so that a successor holds them too."""
        self.nodes.hold_losses(held)
        self.act.keep(LossesHeld(held=held, reason=reason, since=self.clock()))
        self.act.record("node_losses_held" if held else "node_losses_released", reason=reason)

    def _release_ended(self) -> None:
        """Tasks ended (finished, cancelled, or failed by a recovery tier): nothing of them
        stays, here or on the nodes. Taken from the applier, which ended them, after every step
        that may end one, so that no part acts on an ended task's leftovers."""
        while (name := self.act.next_ended()) is not None:
            self._release(name)

    def _release(self, name: str) -> None:
        self.ctx.act.rendezvous.close(name)
        self.recovery.forget(name)
        self.recovery.ladder.forget(name)
        self.act.keep_ladder(self.recovery.ladder)
        self.detector.forget(name)
        self.storage.forget(name)
        self.generations.task_ended(name)
        self.ctx.forget_task(name)
        self.dirty = True

    def revoke_token(self, record: dict[str, str]) -> None:
        """Refuse a token from now on, here and at every coordinator that leads after this one."""
        check_token_id(jti := record["jti"])
        if jti not in self.revoked:
            self.revoked |= {jti}
            kept = self.store.kept_record(RevokedTokens) or RevokedTokens()
            self.act.keep(RevokedTokens(tokens=[*kept.tokens, RevokedToken(**record)]))
            self.act.record("token_revoked", **record)

    # ------------------------------------------------------------------ agents
    def register(self, reg: Registration) -> RegistrationReply:
        known = self.store.node(reg.node)
        # Every node registered has the same slots (checked here), so one other tells them all:
        # a registration storm of thousands of agents must not cost a pass over every node each.
        other = self.store.another_node(reg.node)
        if other is not None and other.slots != reg.slots:
            raise Conflict(
                f"node {reg.node} offers {reg.slots} slots but the cluster's nodes have "
                f"{other.slots}; start every agent with the same --slots"
            )
        self.nodes.registered(reg.node)
        state = returning_state(known, self.recovery.isolated_until_of(reg.node), self.clock())
        self.act.node_registered(reg, state, self.clock())
        if known is None or known.state is NodeState.LOST:
            self.act.record(
                "node_joined" if known is None else "node_back",
                node=reg.node,
                slots=reg.slots,
                state=state.value,
            )
            self.dirty = True
        if known is not None and known.state is NodeState.LOST:
            # Tasks that ended while it was lost were forgotten everywhere but there: its
            # in-memory copies of them (written before it went) would stay in its RAM for good.
            for task in self.store.tasks():
                if not task.state.live and (task.finished or 0) >= known.last_seen:
                    self.ctx.forget_task(task.name, only=reg.node)
        self.vanished.registered(reg.node)
        self._reconcile_workers(reg.node, reg.workers, reg.sent)
        told = self.ctx.pace.told  # (the cluster's size sets it: core/cadence.py)
        return RegistrationReply(
            node=reg.node, heartbeat_interval_s=told.interval_s, heartbeat_deadline_s=told.deadline_s
        )

    def heartbeat(self, hb: Heartbeat) -> HeartbeatReply:
        node = self.store.node(hb.node)
        if node is None or node.state is NodeState.LOST:
            # Unknown, or declared lost: it must register again (and its stale workers stop).
            return HeartbeatReply(registered=False)
        now = self.clock()
        self.act.node_seen(hb.node, now)
        self.nodes.heard(hb.node, hb.sent, hb.waited_s, now)
        for report in hb.reports:
            try:
                self.handle_report(report, hb.node)
            except Exception as exc:  # one bad report must not silence the node's heartbeats
                self.act.record("report_rejected", node=hb.node, report=report.type, error=repr(exc)[:300])
        self._reconcile_workers(hb.node, hb.workers, hb.sent)
        # A heartbeat's list, not a registration's: it comes with the reports of the exits it
        # no longer lists (the agent may forget an exited worker before it has re-registered).
        self.vanished.listed(hb.node, hb.workers, self.clock())
        batch = self.orders(hb.node, hb.acked)
        interval = self.ctx.pace.told.interval_s  # it changes with the cluster's size
        return HeartbeatReply.model_construct(
            orders=batch.orders, numbers=batch.numbers, registered=True, heartbeat_interval_s=interval
        )

    def orders(self, node: str, acked: int = 0) -> OrderBatch:
        """Orders for a node not yet acknowledged (the heartbeat's answer, the long poll). Built
        without validation: the orders are validated messages already, and at thousands of
        agents a validation per answer is a noticeable part of the coordinator's CPU."""
        pending = self.orders_out.pending(node, acked)
        return OrderBatch.model_construct(orders=[o for _, o in pending], numbers=[n for n, _ in pending])

    def _reconcile_workers(self, node: str, reported: list[WorkerState], read_at: float | None) -> None:
        """Track worker processes (as the node read them at ``read_at``, its clock; None: an agent
        that does not say); stop those that belong to no live generation."""
        now = self.clock()
        tasks = {name: self.store.task(name) for name in {w.task for w in reported}}  # once per beat
        for w in reported:
            key = (w.task, w.generation, w.rank)
            self.detector.worker_seen(w, now, read_at)
            if w.generation == SPARE_GENERATION and self.placer.is_spare((w.task, w.rank)):
                continue  # a hot spare waiting to be used (or being renamed into its new identity)
            task = tasks[w.task]
            current = task is not None and task.state.live and task.generation == w.generation
            growth = self.generations.growth(w.task)
            if growth is not None and w.generation == growth.generation:
                current = True  # a newcomer waiting to join its live peers
            row = self.store.worker(*key)
            moved = row is not None and row.state is WorkerPhase.MOVED
            if not current and w.running and moved and self.generations.is_leaving(key, now):
                continue  # renamed into the new generation (the agent will catch up), or leaving
            if not current and w.running:
                self.ctx.act.stop(node, w.task, w.generation, w.rank, self.limits.stop_grace_s)
            elif current and w.running and row is not None and row.state is WorkerPhase.LAUNCHING:
                self.act.worker_phase(key, WorkerPhase.RUNNING, pid=w.pid)
            elif (
                not w.running
                and not w.exit_unsent  # (heard from its report, after those sent before it)
                and task is not None
                and task.generation == w.generation
                and row is not None
                and row.state.live
            ):
                # Its exit was reported under an identity it has since left (it died while
                # being moved in place): the agent's list tells, so the task does not wait for it.
                code = w.returncode
                exit_report = ExitReport(
                    task=w.task,
                    generation=w.generation,
                    rank=w.rank,
                    node=node,
                    code=code if code is not None and code >= 0 else None,
                    signal=-code if code is not None and code < 0 else None,
                    time=now,
                )
                self.reports.exit(task, exit_report)
                self._release_ended()

    # ------------------------------------------------------------------ reports
    def handle_report(self, report: WorkerReport, node: str) -> None:
        """A report from ``node``'s agent about one of its workers."""
        try:
            if self.reports.handle(report, node):
                self.dirty = True  # the plan may want the task larger or smaller, or a slot is free
        finally:
            self._release_ended()

    # ------------------------------------------------------------------ the control loop
    def tick(self, late_s: float = 0.0) -> None:
        """``late_s``: how much later than planned the service's loop came to this tick (its
        own lateness: not counted against the nodes' silence, ``detect/silence.py``)."""
        now, ran = self.clock(), self.loop_clock()
        stalled = stalled_for(self.last_tick, ran, self.limits)
        self.last_tick = ran
        if stalled is not None:
            self.nodes.resumed(now)
            self.detector.resumed(now, stalled)
            self.recovery.paused(stalled)  # its deadlines move on by the stall
        else:
            self.nodes.late(now, late_s)
        for silent in self.nodes.silent(now):
            self.recovery.node_lost(silent)
            self.dirty = True
        self._release_ended()
        if self._forget_lost_nodes(now) or self.recovery.isolations_over(now):
            self.dirty = True
        self.recovery.expire_awaiting(now)
        self._release_ended()
        self.reports.judged(self.detector.judge_checks(now))
        self._release_ended()
        for name in self.generations.growing_tasks():
            if self.generations.check_growth(name, now):
                self.dirty = True  # idle slots may want a new spare
        self.generations.forget_left(now)
        swept = self.vanished.sweep(now)
        for exit_report, node in swept.exits:  # as if its agent had reported it
            self.handle_report(exit_report, node)
        if swept.freed:
            self.dirty = True  # a held plan's launches may fit now
        if self.placer.allocator.poll():
            self.dirty = True  # a table for new inputs (a submission, measurements) is ready
        for task in self.store.tasks(live_only=True):
            if task.state is TaskState.RESTARTING:
                self._finish_stopping(task, now)
            elif task.state is TaskState.STARTING:
                self.reports.failing(self.detector.check_start(task, now))
                self.recovery.check_deadline(task.name, task.generation, now, self.detector.positions)
            elif task.state is TaskState.RUNNING:
                self.reports.failing(self.detector.check_hang(task, now))  # a step that is late
                self._tail(task, now)  # past the last step: exits that are late
            self._release_ended()
        self._keep_step_times(now)
        self.act.put_back_posts(now)
        live = self.store.tasks(live_only=True)
        self.history.sample(now, {t.name: t.flop for t in live})
        if not any(t.state is TaskState.RESTARTING for t in live):
            if self.dirty:
                self.dirty = False
                self.placer.reconcile()
            elif self.placer.held is not None:
                self.placer.carry_out_held()  # launches wait for slots still held: again

    def _tail(self, task: TaskRecord, now: float) -> None:
        found = self.tail.check(task, now, self.storage.failing(task.name))
        if isinstance(found, Finished):
            self.reports.finished(task)
        else:
            self.reports.failing(found)

    def _forget_lost_nodes(self, now: float) -> bool:
        """Lost nodes silent for ``forget_lost_node_s`` that hold no workers are forgotten
        (looked for once a second: it reads every node)."""
        if 0 <= now - self.forgot_at < 1.0:
            return False
        self.forgot_at, after_s = now, self.limits.forget_lost_node_s
        old = forgettable(self.store.nodes(), self.store.held_slots, now, after_s)
        for name in old:
            self._remove_node(name, f"lost for over {after_s:g} s (forget_lost_node_s)")
        return bool(old)

    def _remove_node(self, name: str, why: str) -> None:
        """Forget a node, and the errors counted against it: a successor restores the errors of
        the nodes it knows, so a node that registers again starts afresh under either."""
        self.act.remove_node(name, why=why)
        self.recovery.ladder.forget_node(name)
        self.act.keep_ladder(self.recovery.ladder)

    def _keep_step_times(self, now: float) -> None:
        """The step times that judge hangs, kept every ``KEEP_STEP_TIMES_S`` when they changed: a
        successor judges hangs from its first steps (no warm-up), at the cost of one write."""
        at, last = self.step_times_kept
        if now - at >= KEEP_STEP_TIMES_S and (times := self.detector.step_times()) != last:
            self.act.keep(StepTimes(tasks=times))
            self.step_times_kept = (now, times)

    def _finish_stopping(self, task: TaskRecord, now: float) -> None:
        live = self.store.workers(task.name, task.generation, live=True)
        if live and now - (task.down_since or now) < self.limits.restart_stop_wait_s:
            return
        self.act.end_workers(task.name, task.generation, WorkerPhase.STOPPED)
        self.act.task_waiting(task.name)
        self.dirty = True

    def shutdown(self) -> None:
        self.placer.allocator.close()
        self.act.posts.close()
        self.ctx.act.rendezvous.close_all()
        self.act.close_store()
