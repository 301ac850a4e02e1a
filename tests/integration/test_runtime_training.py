"""The runtime on a local Ray cluster trains the tiny GPT as the single-process reference does:
same losses step for step, for pure DP, pure PP and DP x PP, with flat and hierarchical sync, with
actors placed in their locations."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from orchestrator.layout import layout_from_plan  # noqa: E402
from orchestrator.plan import Plan, Replica, check_plan  # noqa: E402
from runtime.data.text import ByteCorpus  # noqa: E402
from runtime.models.specs import model_spec  # noqa: E402
from runtime.reference import TrainConfig, reference_losses  # noqa: E402
from runtime.stage import one_f_one_b  # noqa: E402

A1, A2, B1 = "local/sim-us/sim-us-a", "local/sim-us/sim-us-b", "local/sim-eu/sim-eu-a"
A3 = "local/sim-us/sim-us-c"  # two slots: a place a test fills whole with few workers
CONFIG = TrainConfig(steps=6, global_batch_size=16, microbatch_size=2, learning_rate=3e-3, seed=4)
CORPUS_BYTES = 2**20
# Summing the same gradients in another order (per replica, then across replicas; the tied weight's
# two uses on two stages) changes the last bits; Adam carries that into later steps.
RELATIVE_TOLERANCE = 1e-6  # measured: at most 3.5e-8 over 6 steps; step 0 bit for bit


def test_one_f_one_b_order():
    assert one_f_one_b(4, 1) == [
        ("F", 0),
        ("F", 1),
        ("B", 0),
        ("F", 2),
        ("B", 1),
        ("F", 3),
        ("B", 2),
        ("B", 3),
    ]
    assert one_f_one_b(2, 5) == [("F", 0), ("F", 1), ("B", 0), ("B", 1)]


@pytest.fixture(scope="module")
def workers(shared_workers):
    """Each test's group is made of the last one's workers (conftest.ReusedWorkers), on the
    runtime modules' shared cluster (conftest.SharedRuntime: A3 has 2 slots)."""
    return shared_workers


@pytest.fixture(scope="module")
def ray_cluster(shared_workers):
    import ray

    return ray


@pytest.fixture(scope="module")
def expected():
    corpus = ByteCorpus.stdlib(max_bytes=CORPUS_BYTES)
    return reference_losses(model_spec("gpt-tiny"), corpus, CONFIG)


def _plan(layers, places, allreduce="hierarchical", compression="none") -> Plan:
    rows = [(1, [Replica(gpu="T4", infra=p) for _ in layers]) for p in places]
    microbatches = CONFIG.global_batch_size // CONFIG.microbatch_size
    shares = [
        microbatches // len(places) + (i < microbatches % len(places)) for i in range(len(places))
    ]
    plan = Plan.from_pipelines(
        global_batch_size=CONFIG.global_batch_size,
        microbatch_size=CONFIG.microbatch_size,
        layers=layers,
        pipelines=rows,
        allreduce=allreduce,
        compression=compression,
        pipeline_microbatches=None if len(set(shares)) == 1 else tuple(shares),
    )
    check_plan(plan)
    return plan


@pytest.mark.integration
@pytest.mark.parametrize(
    ("layers", "places", "allreduce"),
    [
        ([(0, 6)], [A1, B1], "flat"),  # pure DP across regions
        ([(0, 2), (2, 6)], [A1], "flat"),  # pure PP, uneven split (tied weight on two stages)
        # DP x PP over 2 zones of a region and another region, unequal shares (3, 3, 2 microbatches)
        ([(0, 3), (3, 6)], [A1, A2, B1], "hierarchical"),
    ],
    ids=["dp2", "pp2", "pp2xdp3-hierarchical"],
)
def test_losses_match_the_single_process_run(workers, expected, layers, places, allreduce):
    layout = layout_from_plan(_plan(layers, places, allreduce), model="gpt-tiny")
    group = workers.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES)
    losses = [group.step(step) for step in range(CONFIG.steps)]
    counters = group.counters()
    for got, want in zip(losses, expected, strict=True):
        assert abs(got - want) <= RELATIVE_TOLERANCE * want, (losses, expected)
    if len(layers) > 1:  # activations went forward and gradients back, counted per place pair
        assert any(c["bytes_sent"] for c in counters)
    for c in counters:
        phases = c["last_step_phases_s"]
        assert phases["compute"] > 0 and phases["optimizer"] > 0 and c["peak_memory_bytes"] > 2**20
        if len(places) > 1:
            assert phases["dp_sync"] > 0


@pytest.mark.integration
def test_two_stages_by_two_replicas_over_20_steps_match_the_single_process_run(workers):
    """Issue 6's correctness case as stated: 2 stages x 2 replicas (replicas in two zones of a
    region, hierarchical sync, compression off), 20 steps, against one process with the same global
    batch and seed. Step 0 is bit for bit (the same sums); later steps carry the last bits of the
    different summation order through Adam (tolerance: 1e-6 relative, 5e-4 through a loss spike)."""
    config = TrainConfig(
        steps=20, global_batch_size=16, microbatch_size=2, learning_rate=3e-3, seed=4
    )
    want = reference_losses(
        model_spec("gpt-tiny"), ByteCorpus.stdlib(max_bytes=CORPUS_BYTES), config
    )
    plan = Plan.from_pipelines(
        global_batch_size=16,
        microbatch_size=2,
        layers=[(0, 3), (3, 6)],
        pipelines=[(1, [Replica(gpu="T4", infra=p)] * 2) for p in (A1, A2)],
        allreduce="hierarchical",
    )
    check_plan(plan)
    group = workers.start(
        layout_from_plan(plan, model="gpt-tiny"), config, corpus_bytes=CORPUS_BYTES
    )
    got = [group.step(step) for step in range(config.steps)]
    # measured: 0 at step 0, <= 7e-8 to step 17, then the run's loss spike (3.12 -> 4.29 at step
    # 19, the reference's own) amplifies the last bits to 7.5e-5 .. 2.1e-4 from run to run (gloo
    # sums the region's replicas in arrival order; pure DP and pure PP alike)
    assert got[0] == want[0]
    relative = [abs(g - w) / w for g, w in zip(got, want, strict=True)]
    assert max(relative[:18]) <= RELATIVE_TOLERANCE, relative
    assert max(relative) <= 5e-4, relative


@pytest.mark.integration
@pytest.mark.parametrize(
    "options",
    [
        {"grad_clip_norm": 0.5, "optimizer": "sgd", "momentum": 0.9, "learning_rate": 0.05},
        {"grad_clip_norm": 0.5, "precision": "bf16-mixed"},
        # a first scale that overflows: GradScaler skips steps 0 and 3 of the reference
        {"precision": "fp16-mixed", "initial_loss_scale": 2.0**20},
    ],
    ids=["clip-sgd", "bf16-clip", "fp16-skips"],
)
def test_clipping_and_mixed_precision_match_torchs_own_in_one_process(workers, options):
    """2 stages x 2 replicas (tied weight on both ends) against one process running torch's
    ``clip_grad_norm_``, autocast and GradScaler: the global norm spans every stage and replica
    (the tied weight once), and fp16's skipped steps are skipped by every worker alike."""
    import dataclasses

    from runtime.reference import workload_losses
    from runtime.workload import build_workload

    config = dataclasses.replace(CONFIG, **options)
    skipped: list[int] = []
    workload = build_workload("gpt-tiny", seed=config.seed, corpus_bytes=CORPUS_BYTES)
    want = workload_losses(workload, config, skipped=skipped)
    layout = layout_from_plan(_plan([(0, 3), (3, 6)], [A1, B1]), model="gpt-tiny")
    group = workers.start(layout, config, corpus_bytes=CORPUS_BYTES)
    got = [group.step(step) for step in range(config.steps)]
    if config.precision == "fp16-mixed":
        assert skipped == [0, 3]  # the case tests what it says
    relative = [abs(g - w) / w for g, w in zip(got, want, strict=True)]
    # the last bits of another summation order, which bf16's rounding of the forward carries
    # further (measured: fp32 <= 1e-6; bf16 up to 1.3e-5 over 6 steps)
    assert max(relative) <= (1e-4 if config.precision == "bf16-mixed" else 1e-5), (relative, got)


@pytest.mark.integration
def test_a_layout_the_cluster_cannot_hold_fails_fast_and_says_why(ray_cluster):
    from runtime.group import WorkerGroup, WorkerPlacementError

    layout = layout_from_plan(_plan([(0, 6)], ["local/sim-asia/sim-asia-a"]), model="gpt-tiny")
    with pytest.raises(WorkerPlacementError, match="infra:local/sim-asia/sim-asia-a"):
        WorkerGroup.start(layout, CONFIG, timeout_s=3)


@pytest.mark.integration
def test_a_start_that_fails_in_setup_frees_its_slots(ray_cluster):
    """A worker failing in setup must not leave actors or the gang's placement groups behind: the
    next start (the driver's retry) would wait for slots nobody will free."""
    import dataclasses

    from runtime.group import WorkerGroup

    # both of A3's slots: a leaked gang would leave none for the second start
    layout = layout_from_plan(_plan([(0, 6)], [A3] * 2), model="gpt-tiny")
    broken = dataclasses.replace(layout, model="no-such-model")  # every worker's setup fails
    with pytest.raises(Exception, match="no-such-model"):
        WorkerGroup.start(broken, CONFIG, corpus_bytes=CORPUS_BYTES, timeout_s=30)
    group = WorkerGroup.start(layout, CONFIG, corpus_bytes=CORPUS_BYTES, timeout_s=20)
    try:
        assert group.step(0) > 0
    finally:
        group.shutdown()


@pytest.mark.integration
def test_a_start_that_reuses_a_group_keeps_its_workers_where_the_layout_has_room(workers, expected):
    """DP over two regions, then a pipeline of two stages in the first: the first region's worker
    process takes stage 0, the other region's is stopped and its slot freed, stage 1 is a new
    worker; the reused one trains from step 0 as a new one would (the single process's losses).
    A start under another name is refused: a named worker's name says its group."""
    import os

    import ray

    from runtime.group import WorkerGroup
    from tests.integration.jobs import until

    workers.shutdown()  # this test counts the cluster's free slots

    def pids(group) -> list[int]:
        return ray.get([a.__ray_call__.remote(lambda _: os.getpid()) for a in group.actors])

    dp = layout_from_plan(_plan([(0, 6)], [A1, B1], "flat"), model="gpt-tiny")
    first = WorkerGroup.start(dp, CONFIG, corpus_bytes=CORPUS_BYTES)
    before, gone = pids(first), first.actors[1]
    first.step(0)
    pp = layout_from_plan(_plan([(0, 2), (2, 6)], [A1], "flat"), model="gpt-tiny")
    with pytest.raises(ValueError, match="keeps its name"):
        WorkerGroup.start(pp, CONFIG, name="job-w1", reuse=first)
    second = WorkerGroup.start(pp, CONFIG, corpus_bytes=CORPUS_BYTES, reuse=first)
    try:
        after = pids(second)
        assert after[0] == before[0] and after[1] not in before, (before, after)
        assert first.actors == [] and first.placements == []  # handed over: nothing to stop
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(gone.node.remote(), timeout=30)
        losses = [second.step(step) for step in range(CONFIG.steps)]
    finally:
        second.shutdown()
    for got, want in zip(losses, expected, strict=True):
        assert abs(got - want) <= RELATIVE_TOLERANCE * want, (losses, expected)
    # every slot is free again (placement groups are removed asynchronously)
    every = ray.cluster_resources()["CPU"]
    until("the slots back", lambda: ray.available_resources().get("CPU") == every, timeout_s=30)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("layers", "places", "floor_s"),
    [
        # 2 stages across regions, 8 microbatches, warm-up 1: every other backward waits a round
        # trip (2 x 50 ms), so a step takes at least 4 round trips
        ([(0, 3), (3, 6)], [A1], 0.4),
        # DP across regions: the ring all-reduce of ~0.9 MB over 10 MB/s and 50 ms takes
        # 2 x (50 ms + 0.45 MB / 10 MB/s) ~ 0.19 s
        ([(0, 6)], [A1, B1], 0.18),
    ],
    ids=["pp-across-regions", "dp-across-regions"],
)
def test_emulated_links_slow_steps_as_modeled_and_keep_the_losses(
    workers, expected, layers, places, floor_s
):
    import dataclasses
    import time

    from runtime.layout import Link

    layout = layout_from_plan(_plan(layers, places, "flat"), model="gpt-tiny")
    if len(layers) > 1:  # put stage 1 of the single pipeline in the other region
        moved = (layout.workers[0], dataclasses.replace(layout.workers[1], place=B1))
        layout = dataclasses.replace(layout, workers=moved)
    slow = tuple(
        Link(src=a, dst=b, latency_s=0.05, bandwidth_bytes_per_s=10e6)
        for a, b in ((A1, B1), (B1, A1))
    )
    group = workers.start(
        dataclasses.replace(layout, links=slow), CONFIG, corpus_bytes=CORPUS_BYTES
    )
    durations, losses = [], []
    for step in range(3):
        start = time.perf_counter()
        losses.append(group.step(step))
        durations.append(time.perf_counter() - start)
    assert min(durations) >= floor_s, durations
    for got, want in zip(losses, expected, strict=False):
        assert abs(got - want) <= RELATIVE_TOLERANCE * want


@pytest.mark.integration
@pytest.mark.parametrize(("compression", "closeness"), [("fp16", 1e-3), ("int8", 1e-2)])
def test_compressed_cross_region_hop_trains_close_to_the_exact_run(
    workers, expected, compression, closeness
):
    """DP over three replicas in two regions: the region leaders exchange fp16 or int8 gradients
    (with error feedback); losses stay within ``closeness`` of the exact run's, and differ from it
    (the compression is really applied)."""
    plan = _plan([(0, 6)], [A1, A2, B1], "hierarchical", compression)
    group = workers.start(
        layout_from_plan(plan, model="gpt-tiny"), CONFIG, corpus_bytes=CORPUS_BYTES
    )
    losses = [group.step(step) for step in range(CONFIG.steps)]
    gaps = [abs(got - want) / want for got, want in zip(losses, expected, strict=True)]
    assert max(gaps) <= closeness, gaps
    assert max(gaps[1:]) > 1e-7, "compression changed nothing"


@pytest.mark.integration
def test_the_cnn_trains_as_a_pipeline_like_the_single_process_run(workers):
    """The ConvNeXt-style CNN on synthetic images, 2 stages x 2 replicas (activation shapes differ
    at every cut): the same losses as one process."""
    from runtime.reference import workload_losses
    from runtime.workload import build_workload

    config = TrainConfig(
        steps=4, global_batch_size=8, microbatch_size=2, learning_rate=3e-3, seed=2
    )
    want = workload_losses(build_workload("cnn-tiny", seed=config.seed), config)
    rows = [(1, [Replica(gpu="T4", infra=p)] * 2) for p in (A1, A2)]
    plan = Plan.from_pipelines(
        global_batch_size=8, microbatch_size=2, layers=[(0, 3), (3, 7)], pipelines=rows
    )
    group = workers.start(layout_from_plan(plan, model="cnn-tiny"), config)
    got = [group.step(step) for step in range(config.steps)]
    for a, b in zip(got, want, strict=True):
        assert abs(a - b) <= RELATIVE_TOLERANCE * b, (got, want)
