"""The driver's loop as an explicit state machine: plan -> launch -> start -> train, and on a lost
node recover -> plan again, until the recipe's steps are done or nothing more can be done.

Each phase is one method that does its work, records what happened in the event log and the job
state (persisted after every transition and every committed step), and returns the next phase.
The driver talks to three collaborators behind small protocols (contract.py), so the machine runs
the same against the local simulated cloud, a real cloud, or hand-written fakes in tests:

- ``PlanSource.choose(excluded=...)``: the best plan on the market now, avoiding the places that
  just refused capacity; with the launch requests it needs and its predicted rate and price.
- a provisioner (provisioners/base.py): ``launch``, ``terminate``, ``poll_events``.
- ``Trainer``: start the runtime on a plan (restoring a checkpoint if there is one), train one step,
  checkpoint, stop. ``WorkersLost`` from ``step`` means a worker's node died under it.

Recovery in this version keeps the nodes that survived, launches what the new plan needs beyond
them, and restarts the workers from the newest checkpoint. A preemption notice is acted on before
the node goes: the driver checkpoints the step just committed, lets go of the noticed nodes and
recovers from that checkpoint at once, so no committed step is lost. A node lost without notice:
when a worker of every stage survives, their state is the last committed step's (the dead
worker's step never reached the optimizer), so they write it and the restart rolls nothing back
(event ``rescued``); otherwise the job rolls back to the newest checkpoint and the steps committed
after it are trained again (the data of step ``k`` depends only on ``k``, so the losses repeat).

A driver that dies (its node preempted) and is restarted (by Ray: driver/actor.py) takes the job
over from its persisted state: when the job was training and its nodes and workers all live, it
attaches to the running workers and trains on from the last committed step (a step in flight when
it died is not trained twice: runtime/actor.py); otherwise it re-plans from the newest checkpoint,
keeping the nodes that are still alive. A preemption notice for the driver's own node makes it
checkpoint at once, so that even a job whose workers die with it loses no committed step.
"""

from __future__ import annotations

import enum
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

from orchestrator.driver.contract import (  # the machine's vocabulary (importable from here too)
    CapacityRefused,
    Choice,
    Cloud,
    DriverConfig,
    JobBroken,
    PlanSource,
    Request,
    StepResult,
    Trainer,
    WorkersLost,
)
from orchestrator.driver.events import Event, EventLog
from orchestrator.driver.failures import one_line, refused_everywhere
from orchestrator.driver.guards import Guards
from orchestrator.driver.measure import Profiling
from orchestrator.driver.moves import Moves
from orchestrator.driver.state import JobState, StateStore
from orchestrator.driver.straggler import StragglerWatch
from orchestrator.errors import UserError
from orchestrator.plan import plan_from_dict
from provisioners.base import NodeLost, PreemptionNotice


class Phase(str, enum.Enum):
    PLAN = "plan"
    LAUNCH = "launch"
    START = "start"
    TRAIN = "train"
    RECOVER = "recover"
    DONE = "done"
    FAILED = "failed"
    STOPPED = "stopped"  # by the user (``stop``): checkpointed, nodes released; submit resumes it


TERMINAL = (Phase.DONE, Phase.FAILED, Phase.STOPPED)


@dataclass
class _Session:
    """What the driver holds in memory for the current plan (not persisted: rebuilt on restart)."""

    choice: Choice | None = None
    nodes: dict[str, Request] = field(default_factory=dict)  # node id -> what it was launched as
    excluded: set[str] = field(default_factory=set)
    refusals: dict[str, tuple[str, str]] = field(default_factory=dict)  # place -> (why, fix)
    lost_at_s: float | None = None  # when the node loss (or the notice) under recovery happened
    pause_event: str = "recovered"  # what the first step after the pause logs: or "switched"
    pauses_s: list[float] = field(default_factory=list)  # measured pauses (recoveries, switches)
    checkpoint_s: float = 0.0  # the last checkpoint's time (what stopping on the budget takes)
    declined: set[str] = field(default_factory=set)  # better plans seen and not worth a move
    waiting_since_s: float | None = None  # when planning found no room (after training began)
    leaving: set[str] = field(default_factory=set)  # noticed nodes to let go of when recovering
    rescue: bool = False  # a worker died without notice: try its surviving replicas' state first
    last_failure: str | None = None  # the last loss's reason, one line (named when giving up)
    held_only: bool = False  # re-plan on the nodes left (rescued): train on now, grow later
    step_from_s: float = 0.0  # when the step being trained began
    billed_at_s: float = 0.0
    stragglers: StragglerWatch | None = None  # the running workers' speeds (straggler.py)
    last_result: StepResult | None = None  # of the step committed last
    same_nodes: bool = False  # the next start puts each rank where it ran (a re-balance)


def _same_kind(a: Request, b: Request) -> bool:
    return (a.infra, a.gpu, a.spot, a.instance_type) == (b.infra, b.gpu, b.spot, b.instance_type)


class Driver(Guards, Moves, Profiling):
    def __init__(
        self,
        *,
        store: StateStore,
        events: EventLog,
        plans: PlanSource,
        cloud: Cloud,
        trainer: Trainer,
        config: DriverConfig,
        state: JobState,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        on_step: Callable[[JobState, StepResult], None] | None = None,
        # truthy when asked to stop (a str says who asks: the reason in the event log)
        stop_requested: Callable[[], bool | str | None] = lambda: False,
        own_node: str | None = None,
    ) -> None:
        """``own_node``: the node the driver runs on, when it is one of the cloud's."""
        self.store, self.events, self.plans = store, events, plans
        self.cloud, self.trainer, self.config = cloud, trainer, config
        self.clock, self.on_step, self.stop_requested = clock, on_step, stop_requested
        self.wall = wall  # Unix time, for the deadline (the job began at state.started_at_s)
        self.state, self.own_node = state, own_node
        self.session = _Session()
        self.handlers = {
            Phase.PLAN: self._plan,
            Phase.LAUNCH: self._launch,
            Phase.START: self._start,
            Phase.TRAIN: self._train,
            Phase.RECOVER: self._recover,
        }

    # -- the loop ---------------------------------------------------------------------------------

    def run(self) -> JobState:
        phase = Phase(self.state.phase)
        try:
            if phase not in TERMINAL and phase is not Phase.PLAN:
                phase = self._restarted(phase)
            while phase not in TERMINAL:
                try:
                    phase = self.handlers[phase]()
                except JobBroken as broken:  # retrying cannot help: stop with the cause
                    phase = self._broken(broken)
                self._save(phase=phase.value)
        except Exception as error:
            # a bug, or the job's folder unwritable: let go of the workers and nodes before the
            # error is reported (a killed driver, by contrast, is restarted and takes them over)
            self._release_after()
            self._record_crash(error)
            raise
        return self.state

    def _restarted(self, was: Phase) -> Phase:
        """A restarted driver: take over the running workers when the job was training and its
        nodes and workers all live; otherwise re-plan from the newest checkpoint, keeping the
        nodes still alive."""
        state = self.state
        if state.resumed_from:  # submitted again after it stopped: nothing of it runs
            self.trainer.sweep(keep=None)
            self._save(resumed_from="", workers=None)
            self._log(
                "resumed",
                "re-plan from the newest checkpoint",
                f"submitted again after it {state.resumed_from} at step {state.step}",
                details={"step": state.step, "checkpoint_step": state.checkpoint_step},
            )
            return Phase.RECOVER
        # the pause is measured from the dead driver's last save (it lived until then)
        self.session.lost_at_s = self.clock() - max(0.0, self.wall() - state.updated_at_s)
        kinds = {n: Request(**k) for n, k in state.node_kinds.items() if n in state.nodes}
        alive = self.cloud.alive(list(kinds)) if kinds else set()
        self.session.nodes = {n: r for n, r in kinds.items() if n in alive}
        self._save(driver_restarts=state.driver_restarts + 1, nodes=tuple(self.session.nodes))
        whole = bool(state.nodes) and alive == set(state.nodes)
        if was is Phase.TRAIN and state.workers and state.choice and state.plan and whole:
            if self.trainer.attach(plan_from_dict(state.plan), workers=state.workers):
                self.trainer.sweep(keep=state.workers)  # any group it was starting besides
                self.session.choice = Choice.from_dict(state.choice)
                self._log(
                    "driver_restarted",
                    f"take over the running workers at step {state.step}",
                    f"was in {was.value}; its nodes and workers are alive",
                    details={"step": state.step, "node": self.own_node},
                )
                return Phase.TRAIN
        # the groups it ran or was still starting (their names may not have been recorded)
        self.trainer.sweep(keep=None)
        self._save(workers=None)
        self._log(
            "driver_restarted",
            "re-plan from the newest checkpoint",
            f"was in {was.value}; "
            + ("its workers are gone" if state.workers else "no workers were running"),
            details={
                "step": state.step,
                "checkpoint_step": state.checkpoint_step,
                "node": self.own_node,
            },
        )
        return Phase.RECOVER

    # -- phases -----------------------------------------------------------------------------------

    def _plan(self) -> Phase:
        # nothing is rented for a job whose checkpoints are all unreadable (JobBroken)
        self.trainer.check_restorable(self.state.checkpoint_step)
        before = self.session.choice.summary if self.session.choice else None
        held_only, self.session.held_only = self.session.held_only, False
        try:
            choice = self._choose(held_only=held_only)
        except UserError as error:
            reason = error.message + (f" (to fix: {error.fix})" if error.fix else "")
            if self.state.step > 0 and self._wait_for_capacity(reason):
                return Phase.PLAN
            self._log("no_plan", "stop; the job's state and checkpoints are kept", reason)
            if self.session.refusals:  # the market had room on paper; the cloud said no
                self._stop_failed(refused_everywhere(self.session.refusals))
            return Phase.FAILED
        self.session.choice = choice
        self._log(
            "planned",
            "train on the nodes left; a replacement is weighed at the next periodic re-plan"
            if held_only
            else "launch its nodes",
            f"predicted {choice.samples_per_s:.3g} samples/s at ${choice.usd_per_hour:.3g}/h"
            + (f"; {choice.note}" if choice.note else ""),
            plan_before=before,
            plan_after=choice.summary,
        )
        self._save(plan=choice.plan.to_dict(), choice=choice.to_dict())
        return Phase.LAUNCH

    def _choose(self, *, held_only: bool) -> Choice:
        """The best plan on the market now; ``held_only``: first on the nodes still held (a
        node boots in minutes on a real cloud; training on without it does not wait), the whole
        market when they can hold no plan."""
        held = self._held_by_place()
        excluded = frozenset(self.session.excluded)
        if held_only and held:
            try:
                return self.plans.choose(excluded=excluded, held=held, held_only=True)
            except UserError:
                pass  # the nodes left cannot hold the model: look at the whole market
        return self.plans.choose(excluded=excluded, held=held)

    def _launch(self) -> Phase:
        """Launch what the plan needs beyond the nodes still held (survivors of a loss), and let go
        of held nodes it does not use."""
        choice, started = self.session.choice, {}
        assert choice is not None
        spare = dict(self.session.nodes)  # held nodes not yet given a role in the new plan
        kept = {}
        for request in choice.requests:
            mine = [n for n, r in spare.items() if _same_kind(r, request)][: request.count]
            kept.update((n, spare.pop(n)) for n in mine)
            missing = request.count - len(mine)
            if missing == 0:
                continue
            try:
                ids = self.cloud.launch(
                    replace(request, count=missing), gang=f"{self.state.job}-{self.state.version}"
                )
            except CapacityRefused as refused:
                self.cloud.terminate(list(started))  # all or nothing, across places too
                self.session.excluded.add(refused.infra)
                self.session.refusals[refused.infra] = (str(refused), refused.fix)
                self._log("capacity_refused", "re-plan without that place", str(refused))
                return Phase.PLAN
            except WorkersLost as failed:  # the cloud's API failed the call: retry, with backoff
                self.cloud.terminate(list(started))
                return self._lost(str(failed))
            started.update(dict.fromkeys(ids, request))
        self._bill()
        self.cloud.terminate(list(spare))
        self.session.nodes = {**kept, **started}
        self._log(
            "launched",
            "start training",
            f"{len(started)} new nodes" + (f", {len(kept)} kept" if kept else ""),
        )
        self._save(
            nodes=tuple(self.session.nodes),
            node_kinds={n: asdict(r) for n, r in self.session.nodes.items()},
        )
        return Phase.START

    def _start(self) -> Phase:
        choice, wanted = self.session.choice, self.state.checkpoint_step
        assert choice is not None
        if self.plans.unmeasured(choice.plan):  # profile: auto on a real cloud (measure.py)
            return self._measure(choice) or Phase.PLAN
        try:
            same_nodes, self.session.same_nodes = self.session.same_nodes, False
            resumed = self.trainer.start(choice.plan, restore_step=wanted, same_nodes=same_nodes)
        except WorkersLost as lost:
            return self._lost(str(lost))
        if resumed != self.state.step:
            if wanted is not None and resumed != wanted:
                why = "; ".join(self.trainer.unreadable()) or "see driver.log"
                self._log(
                    "checkpoint_unreadable",
                    f"resume at step {resumed}",
                    f"the checkpoint at step {wanted} could not be read: {why}",
                    details={"step": wanted, "resumed_step": resumed},
                )
            self._save(
                step=resumed,
                losses=self.state.losses[:resumed],
                checkpoint_step=resumed or None,
            )
        self.session.waiting_since_s = None  # running again: a later squeeze waits afresh
        window = self.config.straggler_window_steps
        if window:  # these workers' speeds, from their first step on
            gain = self.config.straggler_min_gain
            self.session.stragglers = StragglerWatch(window=window, min_gain=gain)
        self._save(workers=self.trainer.workers_name())
        devices = self.trainer.devices()
        self._log(
            "started",
            "train",
            f"from step {resumed}"
            + (f" (checkpoint of step {resumed})" if resumed else "")
            + (f"; {devices}" if devices else ""),
        )
        return Phase.TRAIN

    def _train(self) -> Phase:
        self.session.step_from_s = self.clock()
        try:
            return self._train_steps()
        except WorkersLost as lost:  # in a step, or in a checkpoint taken between steps
            # the cloud's event names the node; without one, the runtime's error is the reason
            return self._react(self.cloud.poll_events(timeout_s=0.0)) or self._lost(str(lost))

    def _train_steps(self) -> Phase:
        while self.state.step < self.config.steps:
            phase = self._react(self.cloud.poll_events(timeout_s=0.0))
            if phase is not None:
                return phase
            spent_before = self._spent()
            result = self.trainer.step(self.state.step)
            self._check_finite(result)
            self._commit(result)
            if self._over_budget(self._spent() - spent_before):
                return Phase.STOPPED
            if self._reconsider() or self._rebalance():  # moving: launch the new plan
                return Phase.LAUNCH
            asked = self.stop_requested()
            if asked:
                self._checkpoint("a stop request")
                self._release()
                why = asked if isinstance(asked, str) else "asked to stop"
                self._log("stopped", "released every node", why, details={"step": self.state.step})
                return Phase.STOPPED
        self._checkpoint("the last step")
        self._finish()
        return Phase.DONE

    def _recover(self) -> Phase:
        """Stop the workers, keep the nodes that are still alive (and not noticed), go back to
        planning."""
        if self.session.rescue:
            self.session.rescue = False
            self._rescue()
        self.trainer.stop(restart=True)  # after the workers' checkpoint writes are done
        self._save(workers=None)
        self._bill()
        leaving, self.session.leaving = self.session.leaving, set()
        self.cloud.terminate(sorted(leaving))  # doomed: stop paying for them now
        alive = self.cloud.alive([n for n in self.session.nodes if n not in leaving])
        self.session.nodes = {n: r for n, r in self.session.nodes.items() if n in alive}
        restart = self.state.checkpoint_step or 0
        if restart < self.state.step:
            self._log(
                "rolled_back",
                f"train steps {restart + 1} to {self.state.step} again",
                f"{self.state.step - restart} committed steps were after the newest checkpoint "
                "and no surviving replica held them",
                details={
                    "from_step": self.state.step,
                    "to_step": restart,
                    "steps": self.state.step - restart,
                },
            )
        self._save(
            step=restart,
            losses=self.state.losses[:restart],
            recoveries=self.state.recoveries + 1,
            nodes=tuple(self.session.nodes),
        )
        if not self._another_attempt():
            return Phase.FAILED
        self.session.excluded.clear()
        self.session.refusals.clear()
        return Phase.PLAN

    # -- events and bookkeeping -------------------------------------------------------------------

    def _react(self, events: list) -> Phase | None:
        """A lost node of ours: recover from the newest checkpoint. Preemption notices: checkpoint
        now and move off the noticed nodes before they go (nothing committed is lost)."""
        for event in events:
            if isinstance(event, PreemptionNotice) and event.node_id == self.own_node:
                self._driver_noticed(event)
        ours = [e for e in events if getattr(e, "node_id", None) in self.session.nodes]
        notices = [e for e in ours if isinstance(e, PreemptionNotice)]
        for event in notices:
            self._log(
                "preemption_notice",
                "checkpoint now, then move off the node before it goes",
                f"node {event.node_id} in {event.infra}",
                details={
                    "deadline_s": event.deadline_s,
                    "step": self.state.step,
                    "infra": event.infra,
                },
            )
        lost = [e for e in ours if isinstance(e, NodeLost)]
        if lost:
            return self._lost("; ".join(f"node {e.node_id} in {e.infra} {e.reason}" for e in lost))
        if not notices:
            return None
        self.session.lost_at_s = self.clock()  # training pauses from here
        self._checkpoint("a preemption notice")
        self.session.leaving.update(e.node_id for e in notices)
        self._log(
            "moving_off",
            f"restart from the checkpoint of step {self.state.step} without the noticed nodes",
            ", ".join(sorted(self.session.leaving)),
            details={"step": self.state.step, "checkpoint_step": self.state.checkpoint_step},
        )
        return Phase.RECOVER

    def _driver_noticed(self, event: PreemptionNotice) -> None:
        """The driver's own node goes soon: checkpoint now, so that nothing committed is lost even
        if the workers go with it; Ray restarts the driver on another node and it takes over."""
        self._log(
            "driver_notice",
            "checkpoint now; the driver is restarted elsewhere and takes the workers over",
            f"the driver's node {event.node_id} in {event.infra}",
            details={
                "deadline_s": event.deadline_s,
                "step": self.state.step,
                "node": event.node_id,
            },
        )
        self._checkpoint("the driver's preemption notice")

    def _wait_for_capacity(self, reason: str) -> bool:
        """After training began, a market with no room now may get some back (a zone's outage
        ends, prices fall under the budget): wait up to ``capacity_wait_s``, watching the
        provider's events, then plan again. False when the wait is over (or not wanted)."""
        limit, now = self.config.capacity_wait_s, self.clock()
        if self.session.waiting_since_s is None:
            if limit <= 0:
                return False
            self.session.waiting_since_s = now
            self._log(
                "waiting_for_capacity",
                f"look at the market again for up to {limit:g} s, then stop",
                reason,
                details={"step": self.state.step},
            )
        if now - self.session.waiting_since_s >= limit:
            self.session.waiting_since_s = None
            return False
        self.cloud.poll_events(timeout_s=self.config.capacity_poll_s)  # early on any event
        self.session.excluded.clear()  # places that refused may have room again
        return True

    def _rescue(self) -> None:
        """A replica of every stage survived the loss: its state is the last committed step's
        (the dead one's step never reached the optimizer), so the restart rolls nothing back."""
        step = self.state.step
        if step <= (self.state.checkpoint_step or 0) or not self.trainer.rescue(step):
            return
        self._save(checkpoint_step=step)
        self.session.held_only = True
        self._log(
            "rescued",
            f"restart from the surviving replicas' state after step {step}: nothing rolled back",
            "a replica of every stage of the lost workers is alive",
            details={"step": step},
        )

    def _broken(self, broken: JobBroken) -> Phase:
        """The job's input or state is broken: a lost node may be behind it (its workers fail
        in odd ways), which a retry can fix; otherwise stop, keeping the last good checkpoint."""
        held = list(self.session.nodes)
        if held and self.cloud.alive(held) != set(held):
            return self._lost(broken.message)
        self._stop_failed(broken)
        return Phase.FAILED

    def _lost(self, reason: str) -> Phase:
        self.session.lost_at_s, self.session.rescue = self.clock(), True
        self.session.last_failure = one_line(reason)
        self._log(
            "node_lost",
            "restart from the surviving replicas' state, or else from the newest checkpoint",
            reason,
            details={"step": self.state.step, "checkpoint_step": self.state.checkpoint_step},
        )
        return Phase.RECOVER

    def _held_by_place(self) -> dict[str, int]:
        held: dict[str, int] = {}
        for request in self.session.nodes.values():
            held[request.infra] = held.get(request.infra, 0) + 1
        return held

    def _bill(self) -> None:
        """Add the held nodes' compute since the last bill (node-seconds x their price)."""
        now = self.clock()
        per_hour = sum(r.usd_per_node_hour for r in self.session.nodes.values())
        if self.session.billed_at_s:
            spent = per_hour * (now - self.session.billed_at_s) / 3600
            self.state = self.state.evolve(compute_usd=self.state.compute_usd + spent)
        self.session.billed_at_s = now

    def _commit(self, result: StepResult) -> None:
        self.session.last_result = result
        self._bill()
        now = self.clock()
        took, self.session.step_from_s = now - self.session.step_from_s, now
        step = self.state.step + 1
        progress = {}
        if step > self.state.high_water_step:  # new ground: the retry budget starts afresh
            progress = {"high_water_step": step, "attempts": 0, "attempts_since_s": None}
        self._save(
            durable=False,  # one save per step (state.py); the checkpoint's is durable
            trained_steps=self.state.trained_steps + 1,
            train_s=self.state.train_s + took,
            step=step,
            losses=(*self.state.losses, result.loss),
            egress_usd=self.state.egress_usd + result.egress_usd,
            egress_bytes=self.state.egress_bytes + result.egress_bytes,
            **progress,
        )
        if self.session.lost_at_s is not None:
            recovery_s = now - self.session.lost_at_s
            self.session.lost_at_s = None
            self.session.pauses_s.append(recovery_s)
            event, self.session.pause_event = self.session.pause_event, "recovered"
            self._log(
                event,
                "train",
                "first step after the " + ("loss" if event == "recovered" else "move"),
                details={"recovery_s": recovery_s},
            )
        if self.state.step % self.config.checkpoint_every_steps == 0:
            self._checkpoint("its period")
        if self.on_step is not None:
            self.on_step(self.state, result)

    def _checkpoint(self, why: str) -> None:
        if self.state.checkpoint_step == self.state.step:
            return
        started = self.clock()
        self.trainer.checkpoint(self.state.step)
        self.session.checkpoint_s = self.clock() - started
        self._save(checkpoint_step=self.state.step)
        self._log("checkpointed", "", why, details={"step": self.state.step})

    def _finish(self) -> None:
        self._release()
        self._log("finished", "released every node", f"{self.state.step} steps")

    def _release(self) -> None:
        """Stop the workers and let go of every node (billed up to now)."""
        self.trainer.stop()
        self._bill()
        self.cloud.terminate(list(self.session.nodes))
        self.session.nodes = {}
        self._save(nodes=(), node_kinds={}, workers=None)

    def _save(self, *, durable: bool = True, **changes) -> None:
        self.state = self.store.save(self.state.evolve(**changes), durable=durable)

    def _log(self, event: str, decision: str, reason: str, **extra) -> None:
        """One event; decision and reason as one line each, without colour codes (a runtime's
        error text may carry both and a whole traceback: that goes to driver.log)."""
        self.events.append(
            Event(
                event=event,
                decision=one_line(decision, limit=600),
                reason=one_line(reason, limit=600),
                **extra,
            )
        )
