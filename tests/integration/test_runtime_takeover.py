"""Workers outliving their driver, and surviving replicas rescuing a step: a named group is found
again by a new driver and a step asked for twice is trained once; after a worker dies mid-run, the
replicas still alive write the state of the last committed step, and training resumed from it
gives the uninterrupted run's losses."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from orchestrator.layout import layout_from_plan  # noqa: E402
from orchestrator.plan import Plan, Replica, check_plan  # noqa: E402
from runtime.data.text import ByteCorpus  # noqa: E402
from runtime.models.specs import model_spec  # noqa: E402
from runtime.reference import TrainConfig, reference_losses  # noqa: E402
from tests.integration.conftest import local_ray  # noqa: E402

A1 = "local/sim-us/sim-us-a"
CONFIG = TrainConfig(steps=6, global_batch_size=8, microbatch_size=2, learning_rate=3e-3, seed=4)
CORPUS_BYTES = 2**20
RELATIVE_TOLERANCE = (
    1e-6  # DP sums in another order than the single process (see test_runtime_training)
)


@pytest.fixture(scope="module")
def ray_cluster():
    with local_ray(num_cpus=4, resources={f"infra:{A1}": 4}) as ray:
        yield ray


@pytest.fixture(scope="module")
def expected():
    corpus = ByteCorpus.stdlib(max_bytes=CORPUS_BYTES)
    return reference_losses(model_spec("gpt-tiny"), corpus, CONFIG)


def _layout(stages: int, replicas: int):
    spec = model_spec("gpt-tiny")
    cut = spec.num_layers // stages
    layers = [
        (i * cut, spec.num_layers if i == stages - 1 else (i + 1) * cut) for i in range(stages)
    ]
    plan = Plan.from_pipelines(
        global_batch_size=CONFIG.global_batch_size,
        microbatch_size=CONFIG.microbatch_size,
        layers=layers,
        pipelines=[(1, [Replica(gpu="T4", infra=A1) for _ in layers]) for _ in range(replicas)],
    )
    check_plan(plan)
    return layout_from_plan(plan, model="gpt-tiny")


def _close(*values, expected) -> None:
    for got, want in zip(values, expected, strict=False):
        assert abs(got - want) <= RELATIVE_TOLERANCE * want, (values, expected)


@pytest.mark.integration
def test_a_named_group_is_taken_over_and_a_repeated_step_is_trained_once(ray_cluster, expected):
    from runtime.group import WorkerGroup

    layout = _layout(1, 2)
    first = WorkerGroup.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES, name="takeover-test")
    try:
        losses = [first.step(0), first.step(1)]
        # a new driver finds the workers by name; the step the old one may have been waiting on
        # is answered from what the workers did, not trained again
        second = WorkerGroup.attach(layout, "takeover-test")
        assert second.step(1) == losses[1]
        losses += [second.step(step) for step in range(2, CONFIG.steps)]
    finally:
        first.shutdown()
    _close(*losses, expected=expected)
    with pytest.raises(Exception, match="not all alive"):
        WorkerGroup.attach(layout, "never-started")


@pytest.mark.integration
def test_a_restart_keeps_the_named_workers_whose_rank_and_role_stay(ray_cluster, expected):
    """A recovery's restart (the driver's ``stop(restart=True)``, then ``start``): from 2 replicas
    to 1, the kept group's name stays; the worker whose name (rank, role, place) the new layout
    has again is the same process, the other is stopped. A driver restarted then takes the group
    over by that name, finds its slots, and ``sweep`` keeps it while freeing an older group."""
    import os

    import ray

    from runtime.group import WorkerGroup

    def pids(group) -> list[int]:
        return ray.get([a.__ray_call__.remote(lambda _: os.getpid()) for a in group.actors])

    old = WorkerGroup.start(_layout(1, 1), CONFIG, corpus_bytes=CORPUS_BYTES, name="job-wold")
    first = WorkerGroup.start(_layout(1, 2), CONFIG, corpus_bytes=CORPUS_BYTES, name="job-wkept")
    try:
        before = pids(first)
        first.step(0)
        assert first.park()
        with pytest.raises(ValueError, match="keeps its name"):
            WorkerGroup.start(_layout(1, 1), CONFIG, name="job-wnew", reuse=first)
        layout = _layout(1, 1)
        second = WorkerGroup.start(
            layout, CONFIG, corpus_bytes=CORPUS_BYTES, name="job-wkept", reuse=first
        )
        assert pids(second) == before[:1] and second.names == first.names[:1]
        losses = [second.step(step) for step in range(3)]
        taken = WorkerGroup.attach(layout, "job-wkept")  # as a restarted driver does
        assert len(taken.placements) == 1
        assert WorkerGroup.sweep("job-w", keep="job-wkept") == ["job-wold"]
        losses += [taken.step(step) for step in range(3, CONFIG.steps)]
        taken.shutdown()
    finally:
        first.shutdown()  # handed over: nothing left to stop
        old.shutdown(graceful=False)  # swept already, when the test got that far
    _close(*losses, expected=expected)


@pytest.mark.integration
def test_a_step_handed_to_one_worker_only_is_taken_over_and_finished(ray_cluster, expected):
    """The driver died after handing step 2 to the first worker and before the second: the first
    sits in the step's all-reduce. The new driver still finds both (``node`` and ``counters``
    answer beside the running step) and hands step 2 to both: it is trained once."""
    from runtime.group import WorkerGroup

    layout = _layout(1, 2)
    first = WorkerGroup.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES, name="half-step-test")
    try:
        losses = [first.step(0), first.step(1)]
        waiting = first.actors[0].step.remote(2)  # the second worker never got it
        second = WorkerGroup.attach(layout, "half-step-test", timeout_s=20.0)
        assert len(second.counters()) == 2
        losses.append(second.step(2, timeout_s=60.0))
        ray_cluster.get(waiting, timeout=60)  # the first call ended with the step
        losses += [second.step(step) for step in range(3, CONFIG.steps)]
    finally:
        first.shutdown()
    _close(*losses, expected=expected)


@pytest.mark.integration
def test_a_sweep_frees_the_groups_a_dead_driver_left(ray_cluster):
    from runtime.group import WorkerGroup

    layout = _layout(1, 2)
    kept = WorkerGroup.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES, name="job-wkept")
    WorkerGroup.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES, name="job-worphan")
    try:
        assert WorkerGroup.sweep("job-w", keep="job-wkept") == ["job-worphan"]
        with pytest.raises(Exception, match="not all alive"):
            WorkerGroup.attach(layout, "job-worphan")
        # its slots are free again: a new group of the same size is placed
        again = WorkerGroup.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES, timeout_s=30)
        again.shutdown()
        kept.step(0)  # the kept group trains on
    finally:
        kept.shutdown()


@pytest.mark.integration
def test_survivors_rescue_the_last_committed_step_after_a_worker_dies(
    ray_cluster, expected, tmp_path
):
    import ray

    from runtime.group import WorkerGroup

    layout, store = _layout(1, 2), str(tmp_path / "checkpoints")
    group = WorkerGroup.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES)
    try:
        losses = [group.step(step) for step in range(3)]
        ray.kill(group.actors[1])  # a replica's node vanishes; step 3 cannot finish
        with pytest.raises(ray.exceptions.RayError):
            group.step(3, timeout_s=60)
        # the other replica is stuck on (or failed out of) step 3's sync: its weights hold 3 steps
        assert group.rescue(store, "job", 2, timeout_s=30)
    finally:
        group.shutdown(graceful=False)
    resumed = WorkerGroup.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES)
    try:
        assert resumed.restore(store, "job") == 2
        losses += [resumed.step(step) for step in range(3, CONFIG.steps)]
    finally:
        resumed.shutdown()
    _close(*losses, expected=expected)


@pytest.mark.integration
def test_no_rescue_when_a_stage_lost_its_only_worker(ray_cluster, tmp_path):
    import ray

    from runtime.group import WorkerGroup

    layout = _layout(2, 1)  # one pipeline: each stage has one worker
    group = WorkerGroup.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES)
    try:
        group.step(0)
        ray.kill(group.actors[1])
        assert not group.rescue(str(tmp_path / "checkpoints"), "job", 0, timeout_s=30)
    finally:
        group.shutdown(graceful=False)
