"""The driver's state machine against hand-written fakes of the market/planner, the cloud and the
runtime: a fault-free run, preemptions (a notice, then the node lost), capacity refused, no plan,
a budget, and a driver that dies and is restarted from its persisted state."""

from __future__ import annotations

import pytest

from orchestrator.driver.events import read_events
from orchestrator.driver.machine import (
    CapacityRefused,
    Choice,
    Driver,
    DriverConfig,
    JobBroken,
    Request,
    StepResult,
    WorkersLost,
)
from orchestrator.driver.state import JobState, StateStore
from orchestrator.errors import UserError
from orchestrator.plan import Plan, Replica, Stage
from provisioners.base import NodeLost, PreemptionNotice

US, EU = "local/sim-us/sim-us-a", "local/sim-eu/sim-eu-a"


def plan_in(place: str, *, nodes: int = 2) -> Plan:
    """A real plan (the driver keeps and restores it) on ``nodes`` T4s in one place."""
    replicas = tuple(Replica(gpu="T4", infra=place) for _ in range(nodes))
    return Plan(
        global_batch_size=8 * nodes,  # 4 microbatches per replica: shares to move
        microbatch_size=2,
        stages=(Stage(layers=(0, 6), replicas=replicas),),
    )


class FakePlans:
    """Prefers US, then EU; each plan asks for two nodes in one place."""

    def __init__(self, places=(US, EU), *, measure: tuple[str, ...] = ()) -> None:
        self.places = places
        self.asked: list[frozenset] = []
        self.held: list[dict] = []
        self.to_measure = set(measure)  # GPU types to time on the job's nodes (profile: auto)
        self.learned: dict[str, object] = {}

    def unmeasured(self, plan: Plan) -> tuple[str, ...]:
        return tuple(sorted({r.gpu for s in plan.stages for r in s.replicas} & self.to_measure))

    def learn(self, gpu: str, profile) -> None:
        self.to_measure.discard(gpu)
        self.learned[gpu] = profile

    def choose(
        self, *, excluded: frozenset[str], held: dict[str, int], held_only: bool = False
    ) -> Choice:
        self.asked.append(excluded)
        self.held.append(dict(held))
        if held_only:  # one node left somewhere: a plan on it alone
            place = next(p for p, n in held.items() if n)
            request = Request(infra=place, gpu="T4", count=1, spot=True, usd_per_node_hour=0.5)
            return Choice(
                plan=plan_in(place, nodes=1),
                summary=f"1 x T4 in {place}",
                requests=(request,),
                samples_per_s=5.0,
                usd_per_hour=0.5,
            )
        for place in self.places:
            if place not in excluded:
                request = Request(infra=place, gpu="T4", count=2, spot=True, usd_per_node_hour=0.5)
                return Choice(
                    plan=plan_in(place),
                    summary=f"2 x T4 in {place}",
                    requests=(request,),
                    samples_per_s=10.0,
                    usd_per_hour=1.0,
                )
        raise UserError("no feasible plan: every place refused", fix="widen constraints")


class FakeCloud:
    def __init__(self, capacity: dict[str, int]) -> None:
        self.capacity = dict(capacity)
        self.alive_nodes: dict[str, str] = {}  # node id -> infra
        self.events: list = []
        self.launched = 0
        self.terminated: list[str] = []
        self.polls = 0
        self.returns: dict[str, tuple[int, int]] = {}  # place -> (at poll number, capacity)
        self.workers: dict[str, list[str]] = {}  # running worker groups -> their nodes
        self.stored: set[int] = set()  # checkpoints in the store (they outlive a driver)

    def launch(self, request: Request, *, gang: str) -> list[str]:
        if self.capacity.get(request.infra, 0) < request.count:
            raise CapacityRefused(
                request.infra, f"{request.infra}: no capacity for {request.count}"
            )
        self.capacity[request.infra] -= request.count
        ids = []
        for _ in range(request.count):
            self.launched += 1
            ids.append(f"n{self.launched}")
            self.alive_nodes[ids[-1]] = request.infra
        return ids

    def terminate(self, node_ids) -> None:
        for node in node_ids:
            self.terminated.append(node)
            infra = self.alive_nodes.pop(node, None)
            if infra is not None:
                self.capacity[infra] += 1

    def alive(self, node_ids) -> set[str]:
        return {n for n in node_ids if n in self.alive_nodes}

    def poll_events(self, *, timeout_s: float = 0.0) -> list:
        self.polls += 1
        for place, (after, count) in list(self.returns.items()):
            if self.polls >= after:  # capacity a test scheduled to come back
                self.capacity[place] = count
                del self.returns[place]
        events, self.events = self.events, []
        return events

    def notice(self, node: str) -> None:
        self.events.append(
            PreemptionNotice(node_id=node, infra=self.alive_nodes[node], deadline_s=0)
        )

    def kill(self, node: str) -> None:
        infra = self.alive_nodes.pop(node)
        self.events.append(NodeLost(node_id=node, infra=infra, reason="preempted"))


class FakeTrainer:
    """Loss of step k is a function of k alone (as the runtime's data is); a step fails when a node
    it runs on is gone; ``script`` maps a step to something to do to the cloud before it runs."""

    def __init__(self, cloud: FakeCloud, script: dict | None = None) -> None:
        self.cloud, self.script = cloud, dict(script or {})
        self.checkpoints: list[int] = []
        self.corrupt: set[int] = set()  # checkpoints that cannot be read back
        self.starts: list[int | None] = []
        self.nodes: list[str] = []
        self.steps_run = 0
        self.name: str | None = None  # the running workers' name
        self.attached: list[str] = []
        self.rescuable = False
        self.skipped: tuple[str, ...] = ()
        self.checked: list[int | None] = []  # check_restorable's calls

    def start(self, plan: Plan, *, restore_step: int | None, same_nodes: bool = False) -> int:
        self.starts.append(restore_step)
        self.nodes = list(self.cloud.alive_nodes)
        self.name = f"workers-{len(self.cloud.workers)}"
        self.cloud.workers[self.name] = list(self.nodes)  # they outlive this trainer's driver
        if restore_step is None:
            return 0
        self.check_restorable(restore_step)
        good = [c for c in self.cloud.stored if c <= restore_step and c not in self.corrupt]
        self.skipped = tuple(
            f"step {c}: corrupt" for c in sorted(self.corrupt) if max(good, default=0) < c
        )
        return max(good)

    def unreadable(self) -> tuple[str, ...]:
        return self.skipped

    def check_restorable(self, restore_step: int | None) -> None:
        self.checked.append(restore_step)
        if restore_step and not any(
            c <= restore_step and c not in self.corrupt for c in self.cloud.stored
        ):
            raise JobBroken(
                "checkpoint",
                f"no readable checkpoint at or before step {restore_step}",
                fix="restore the store",
            )

    def step(self, step: int) -> StepResult:
        action = self.script.pop(step, None)
        if action is not None:
            action(self)
        if any(n not in self.cloud.alive_nodes for n in self.nodes):
            raise WorkersLost(f"a worker of step {step} died")
        self.steps_run += 1
        return StepResult(loss=1.0 / (step + 1), egress_bytes=1e6, egress_usd=0.001)

    def checkpoint(self, step: int) -> None:
        self.checkpoints.append(step)
        self.cloud.stored.add(step)

    def stop(self, *, restart: bool = False) -> None:
        self.cloud.workers.pop(self.name, None)
        self.nodes, self.name = [], None

    def workers_name(self) -> str | None:
        return self.name

    def devices(self) -> str:
        return "4 workers on cpu" if self.name else ""

    def attach(self, plan: Plan, *, workers: str) -> bool:
        nodes = self.cloud.workers.get(workers)
        if not nodes or any(n not in self.cloud.alive_nodes for n in nodes):
            self.cloud.workers.pop(workers, None)
            return False
        self.nodes, self.name = nodes, workers
        self.attached.append(workers)
        return True

    def sweep(self, *, keep: str | None) -> None:
        for name in [n for n in self.cloud.workers if n != keep]:
            del self.cloud.workers[name]

    def measure(self, gpu: str, infra: str):
        """A profile of ``gpu`` timed in ``infra``; raises ``measure_error`` when a test sets one;
        must find the workers not started yet."""
        assert self.name is None or self.name not in self.cloud.workers, "measured before start"
        self.measured = getattr(self, "measured", []) + [(gpu, infra)]
        if getattr(self, "measure_error", None) is not None:
            raise self.measure_error
        return f"profile of {gpu}"

    def rescue(self, step: int) -> bool:
        """Survivors hold every stage when ``rescuable`` (a test's choice)."""
        if self.rescuable:
            self.checkpoints.append(step)
            self.cloud.stored.add(step)
        return self.rescuable


def make_driver(tmp_path, cloud, trainer, *, steps=20, every=5, plans=None, budget=None, **config):
    store = StateStore(tmp_path / "job")
    state = (
        store.load().state
        if store.exists()
        else JobState(job="j", recipe_path="r.yaml", phase="plan")
    )
    clock = iter(range(0, 10**6, 2))  # 2 s per tick
    from orchestrator.driver.events import EventLog

    return Driver(
        store=store,
        events=EventLog(tmp_path / "job" / "events.jsonl"),
        plans=plans or FakePlans(),
        cloud=cloud,
        trainer=trainer,
        config=DriverConfig(steps=steps, checkpoint_every_steps=every, budget_usd=budget, **config),
        state=state,
        clock=lambda: float(next(clock)),
    )


def names(tmp_path) -> list[str]:
    return [e["event"] for e in read_events(tmp_path / "job" / "events.jsonl")]


def test_a_fault_free_run(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})
    trainer = FakeTrainer(cloud)
    state = make_driver(tmp_path, cloud, trainer).run()
    assert state.phase == "done" and state.step == 20
    assert list(state.losses) == [1.0 / (k + 1) for k in range(20)]
    assert trainer.checkpoints == [5, 10, 15, 20]
    assert cloud.alive_nodes == {} and cloud.capacity == {US: 2, EU: 2}  # every node released
    assert state.egress_usd == pytest.approx(0.02) and state.compute_usd > 0
    assert names(tmp_path)[:3] == ["planned", "launched", "started"]
    assert names(tmp_path)[-1] == "finished"
    assert StateStore(tmp_path / "job").load().state == state  # persisted as it ended


def test_a_notice_checkpoints_and_moves_off_the_node_before_it_goes(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})
    noticed: list[str] = []

    def notice(trainer) -> None:
        noticed.append(trainer.nodes[0])
        cloud.notice(trainer.nodes[0])  # seen before step 8

    trainer = FakeTrainer(cloud, {7: notice})
    state = make_driver(tmp_path, cloud, trainer).run()
    assert state.phase == "done" and state.recoveries == 1
    assert list(state.losses) == [1.0 / (k + 1) for k in range(20)]
    assert 8 in trainer.checkpoints  # the notice's checkpoint, before step 8 ran
    assert trainer.starts == [None, 8]  # restarted from it
    assert trainer.steps_run == 20  # no committed step trained twice
    assert noticed[0] in cloud.terminated  # let go of, not kept for the next plan
    events = list(read_events(tmp_path / "job" / "events.jsonl"))
    kinds = [e["event"] for e in events]
    assert kinds.count("preemption_notice") == 1 and kinds.count("moving_off") == 1
    assert "node_lost" not in kinds
    recovered = [e for e in events if e["event"] == "recovered"]
    assert len(recovered) == 1 and recovered[0]["details"]["recovery_s"] > 0


def test_a_noticed_node_that_dies_before_its_checkpoint_rolls_back(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})

    def notice_then_die(trainer) -> None:
        cloud.notice(trainer.nodes[0])
        cloud.kill(trainer.nodes[0])  # gone before the driver sees the notice

    trainer = FakeTrainer(cloud, {7: notice_then_die})
    state = make_driver(tmp_path, cloud, trainer).run()
    assert state.phase == "done" and state.recoveries == 1
    assert trainer.starts == [None, 5]  # the periodic checkpoint
    assert list(state.losses) == [1.0 / (k + 1) for k in range(20)]
    kinds = [e["event"] for e in read_events(tmp_path / "job" / "events.jsonl")]
    assert "node_lost" in kinds and "moving_off" not in kinds


def test_a_loss_without_notice_replays_from_the_periodic_checkpoint(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})
    trainer = FakeTrainer(cloud, {12: lambda t: cloud.kill(t.nodes[1])})
    state = make_driver(tmp_path, cloud, trainer).run()
    assert trainer.starts == [None, 10]
    assert trainer.steps_run == 20 + 2  # steps 10 and 11 trained twice
    assert list(state.losses) == [1.0 / (k + 1) for k in range(20)]


def test_a_loss_without_notice_with_a_surviving_replica_rolls_nothing_back(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})
    trainer = FakeTrainer(cloud, {12: lambda t: cloud.kill(t.nodes[1])})
    trainer.rescuable = True  # the other replica of the (one) stage lives
    state = make_driver(tmp_path, cloud, trainer).run()
    assert trainer.starts == [None, 12]  # from the survivors' state after step 12
    assert trainer.steps_run == 20  # nothing trained twice
    assert list(state.losses) == [1.0 / (k + 1) for k in range(20)]
    events = list(read_events(tmp_path / "job" / "events.jsonl"))
    (rescued,) = [e for e in events if e["event"] == "rescued"]
    assert rescued["details"]["step"] == 12
    # it trains on at once on the node left rather than waiting for a replacement to boot
    planned = [e for e in events if e["event"] == "planned"]
    assert planned[-1]["plan_after"] == f"1 x T4 in {US}"
    assert "nodes left" in planned[-1]["decision"] and cloud.launched == 2  # the first two


def test_capacity_refused_fails_over_to_the_next_place(tmp_path):
    cloud = FakeCloud({US: 1, EU: 2})  # US cannot give two nodes
    plans = FakePlans()
    trainer = FakeTrainer(cloud)
    state = make_driver(tmp_path, cloud, trainer, plans=plans).run()
    assert state.phase == "done"
    assert plans.asked == [frozenset(), frozenset({US})]
    assert "capacity_refused" in names(tmp_path)


def test_no_capacity_anywhere_stops_with_a_clear_event_and_keeps_the_state(tmp_path):
    cloud = FakeCloud({US: 0, EU: 1})
    state = make_driver(tmp_path, cloud, FakeTrainer(cloud)).run()
    assert state.phase == "failed"
    events = list(read_events(tmp_path / "job" / "events.jsonl"))
    assert [e["event"] for e in events[-2:]] == ["no_plan", "failed"]
    assert "no feasible plan" in events[-2]["reason"]
    # the cause named in one line: the places that refused and what the cloud said
    assert state.failure["cause"] == "capacity"
    assert US in state.failure["message"] and EU in state.failure["message"]
    assert StateStore(tmp_path / "job").load().state.phase == "failed"
    assert cloud.alive_nodes == {}  # nothing launched is left


def test_a_cloud_api_failure_at_launch_is_retried_within_the_budget(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})
    failures = iter([WorkersLost("aws: ec2.run_instances failed: an error page")])
    launch = cloud.launch

    def flaky(request, *, gang):
        failure = next(failures, None)
        if failure is not None:
            raise failure
        return launch(request, gang=gang)

    cloud.launch = flaky
    state = make_driver(tmp_path, cloud, FakeTrainer(cloud)).run()
    assert state.phase == "done" and state.step == 20
    kinds = names(tmp_path)
    assert kinds.index("node_lost") < kinds.index("launched")


def test_the_budget_stops_the_job_after_a_checkpoint(tmp_path):
    cloud = FakeCloud({US: 2})
    trainer = FakeTrainer(cloud)
    state = make_driver(tmp_path, cloud, trainer, budget=0.0055).run()
    assert state.phase == "stopped" and state.step < 20  # not done: its steps are not
    assert trainer.checkpoints[-1] == state.step and cloud.alive_nodes == {}
    assert names(tmp_path)[-1] == "budget_reached" and "finished" not in names(tmp_path)
    assert state.compute_usd + state.egress_usd <= 0.0055  # stopped before it was exceeded


def test_a_job_stopped_on_its_budget_and_submitted_again_logs_a_resume(tmp_path):
    """Honest phases: a stop logs no "finished"; a resubmit is a resume, not a restart."""
    cloud = FakeCloud({US: 2})
    stopped = make_driver(tmp_path, cloud, FakeTrainer(cloud), budget=0.0055).run()
    assert stopped.phase == "stopped"
    store = StateStore(tmp_path / "job")  # what submit does with it (job.py: _state)
    store.save(stopped.evolve(phase="recover", resumed_from="stopped"))
    state = make_driver(tmp_path, cloud, FakeTrainer(cloud)).run()  # no budget now
    assert state.phase == "done" and state.step == 20
    kinds = names(tmp_path)
    assert "resumed" in kinds and "driver_restarted" not in kinds
    assert kinds.index("budget_reached") < kinds.index("resumed") < kinds.index("finished")


class DriverDied(BaseException):
    """Stands for the driver's process being killed (not an error the driver handles)."""


def test_a_restarted_driver_takes_over_the_running_workers(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})

    def die(trainer):
        raise DriverDied

    first = FakeTrainer(cloud, {13: die})
    with pytest.raises(DriverDied):
        make_driver(tmp_path, cloud, first).run()
    saved = StateStore(tmp_path / "job").load().state
    assert saved.phase == "train" and saved.step == 13 and saved.checkpoint_step == 10
    assert saved.workers == first.name and saved.choice is not None
    launched = cloud.launched
    second = FakeTrainer(cloud)
    state = make_driver(tmp_path, cloud, second).run()
    # no restart, no rollback: the new driver trains on from step 13 on the same workers/nodes
    assert state.phase == "done" and second.starts == [] and second.attached == [first.name]
    assert first.steps_run + second.steps_run == 20
    assert list(state.losses) == [1.0 / (k + 1) for k in range(20)]
    assert state.driver_restarts == 1 and cloud.launched == launched and not cloud.workers
    restarted = [
        e
        for e in read_events(tmp_path / "job" / "events.jsonl")
        if e["event"] == "driver_restarted"
    ]
    assert "take over the running workers at step 13" in restarted[0]["decision"]
    assert "recovered" in names(tmp_path)  # the pause is measured like a recovery's


def test_a_restarted_driver_whose_workers_died_resumes_from_its_checkpoint(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})

    def die(trainer):
        raise DriverDied

    first = FakeTrainer(cloud, {13: die})
    with pytest.raises(DriverDied):
        make_driver(tmp_path, cloud, first).run()
    cloud.workers.clear()  # the workers went with the driver
    launched = cloud.launched
    second = FakeTrainer(cloud)
    state = make_driver(tmp_path, cloud, second).run()
    assert state.phase == "done" and second.starts == [10]
    assert list(state.losses) == [1.0 / (k + 1) for k in range(20)]
    assert cloud.launched == launched  # the nodes still alive were kept, not launched again
    assert "driver_restarted" in names(tmp_path)


def test_a_driver_that_died_while_starting_workers_frees_them_when_restarted(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})

    class DiesStarting(FakeTrainer):
        def start(self, plan: Plan, *, restore_step: int | None, same_nodes: bool = False) -> int:
            super().start(plan, restore_step=restore_step)
            raise DriverDied  # the group runs, its name never reached the state

    with pytest.raises(DriverDied):
        make_driver(tmp_path, cloud, DiesStarting(cloud)).run()
    assert list(cloud.workers) and StateStore(tmp_path / "job").load().state.workers is None
    second = FakeTrainer(cloud)
    state = make_driver(tmp_path, cloud, second).run()
    assert state.phase == "done" and second.starts == [None] and not cloud.workers


def test_a_notice_for_the_drivers_own_node_checkpoints_at_once(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})

    def notice_driver(trainer):
        cloud.events.append(PreemptionNotice(node_id="controller", infra="local/c", deadline_s=1))

    trainer = FakeTrainer(cloud, {7: notice_driver})
    driver = make_driver(tmp_path, cloud, trainer)
    driver.own_node = "controller"
    state = driver.run()
    assert state.phase == "done" and 8 in trainer.checkpoints  # the step committed after it
    assert trainer.starts == [None] and "driver_notice" in names(tmp_path)


def test_a_corrupt_checkpoint_falls_back_to_the_previous_good_one(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})

    def corrupt_and_kill(trainer):
        trainer.corrupt.add(10)
        cloud.kill(trainer.nodes[0])

    trainer = FakeTrainer(cloud, {12: corrupt_and_kill})
    state = make_driver(tmp_path, cloud, trainer).run()
    assert trainer.starts == [None, 10] and trainer.steps_run == 20 + 7  # steps 5..11 again
    assert list(state.losses) == [1.0 / (k + 1) for k in range(20)]
    events = list(read_events(tmp_path / "job" / "events.jsonl"))
    unreadable = [e for e in events if e["event"] == "checkpoint_unreadable"]
    assert len(unreadable) == 1 and "step 10" in unreadable[0]["reason"]


def test_recovery_keeps_the_surviving_nodes_and_launches_only_what_is_missing(tmp_path):
    cloud = FakeCloud({US: 3, EU: 2})
    plans = FakePlans()
    trainer = FakeTrainer(cloud, {12: lambda t: cloud.kill(t.nodes[0])})
    state = make_driver(tmp_path, cloud, trainer, plans=plans).run()
    assert state.phase == "done" and state.recoveries == 1
    assert cloud.launched == 3  # two at first, one replacement
    assert plans.held == [{}, {US: 1}]  # the survivor is offered back to the planner
    launched = [
        e for e in read_events(tmp_path / "job" / "events.jsonl") if e["event"] == "launched"
    ]
    assert [e["reason"] for e in launched] == ["2 new nodes", "1 new nodes, 1 kept"]
    assert cloud.alive_nodes == {}


def test_a_stop_request_checkpoints_releases_and_a_new_driver_resumes(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})
    trainer = FakeTrainer(cloud)
    driver = make_driver(tmp_path, cloud, trainer)
    driver.stop_requested = lambda: driver.state.step >= 7
    state = driver.run()
    assert state.phase == "stopped" and state.step == 7 and state.checkpoint_step == 7
    assert cloud.alive_nodes == {} and names(tmp_path)[-1] == "stopped"
    resumed = make_driver(tmp_path, cloud, FakeTrainer(cloud))
    resumed.state = resumed.state.evolve(phase="recover")  # what submit does for a stopped job
    final = resumed.run()
    assert final.phase == "done" and list(final.losses) == [1.0 / (k + 1) for k in range(20)]


def test_a_node_lost_while_checkpointing_is_a_recovery_too(tmp_path):
    cloud = FakeCloud({US: 3, EU: 2})

    class DiesInCheckpoint(FakeTrainer):
        def checkpoint(self, step: int) -> None:
            if step == 10 and not self.corrupt:
                self.corrupt.add(-1)  # only once
                cloud.kill(self.nodes[0])
                raise WorkersLost("a worker died while copying its state")
            super().checkpoint(step)

    trainer = DiesInCheckpoint(cloud)
    state = make_driver(tmp_path, cloud, trainer).run()
    assert state.phase == "done" and state.recoveries == 1
    assert trainer.starts == [None, 5]  # back to the checkpoint before the failed one
    assert list(state.losses) == [1.0 / (k + 1) for k in range(20)]


def test_on_a_real_cloud_the_model_is_timed_on_its_first_node_then_planned_again(tmp_path):
    """profile: auto on a real cloud: before the workers start, the T4 nodes' times are measured
    on one of them and the job plans again on them, keeping the nodes that still fit."""
    cloud = FakeCloud({US: 2, EU: 2})
    trainer, plans = FakeTrainer(cloud), FakePlans(measure=("T4",))
    state = make_driver(tmp_path, cloud, trainer, plans=plans).run()
    assert state.phase == "done" and state.step == 20
    assert trainer.measured == [("T4", US)] and plans.learned == {"T4": "profile of T4"}
    assert names(tmp_path)[:6] == [
        "planned",
        "launched",
        "profiled",
        "planned",
        "launched",
        "started",
    ]
    assert cloud.launched == 2  # the second plan kept the nodes the first one launched
    assert trainer.starts == [None]


def test_a_measurement_that_fails_leaves_the_estimate_and_training_goes_on(tmp_path):
    cloud = FakeCloud({US: 2, EU: 2})
    trainer, plans = FakeTrainer(cloud), FakePlans(measure=("T4",))
    trainer.measure_error = RuntimeError("CUDA driver too old")
    state = make_driver(tmp_path, cloud, trainer, plans=plans).run()
    assert state.phase == "done" and plans.learned == {"T4": None}
    events = list(read_events(tmp_path / "job" / "events.jsonl"))
    failed = [e for e in events if e["event"] == "profile_failed"]
    assert len(failed) == 1 and "CUDA driver too old" in failed[0]["reason"]
