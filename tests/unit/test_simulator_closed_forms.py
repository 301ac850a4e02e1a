"""The simulator against closed forms: one GPU, pure data parallelism, pure pipelines, a slow stage,
memory by precision and optimizer, and the egress of a plan that crosses a region and a cloud."""

from __future__ import annotations

import pytest

from orchestrator.catalog import default_catalog
from orchestrator.simulator import simulate, views_for

from .fakes import FakeNetwork, FakePrices, plan, settings, uniform_profile

F, B, U = 0.01, 0.02, 0.001  # per layer: forward, backward, update seconds for microbatch 1
PARAMS = 1_000_000


def run(profile, a_plan, network=None, prices=None, sim_settings=None):
    return simulate(
        profile,
        a_plan,
        network=network or FakeNetwork(),
        prices=prices or FakePrices(),
        settings=sim_settings or settings(),
    )


def test_one_gpu():
    profile = uniform_profile()
    one = plan([(0, 8)], [["gcp/us-central1/us-central1-a"]], batch=8)
    e = run(profile, one)
    assert e.microbatches == (8,)
    assert e.iteration_time_s == pytest.approx(8 * 8 * (F + B) + 8 * U)
    assert e.samples_per_s == pytest.approx(8 / e.iteration_time_s)
    assert e.stages[0].dp_sync_s == 0 and e.egress_usd_per_iteration == 0
    assert e.cost_per_hour_usd == pytest.approx(1.0)
    assert e.granularity == float("inf")


@pytest.mark.parametrize("replicas", [2, 4, 8])
@pytest.mark.parametrize("latency", [0.0, 0.002])
def test_pure_data_parallel_ring(replicas, latency):
    profile = uniform_profile()
    bandwidth = 1e9
    places = [[f"gcp/us-central1/us-central1-{z}" for z in "abcdefgh"[:replicas]]]
    dp = plan([(0, 8)], places, batch=8 * replicas)
    e = run(profile, dp, network=FakeNetwork(default=(latency, bandwidth)))
    message = 8 * PARAMS * 4  # fp32 gradients of the whole model
    ring = 2 * (replicas - 1) * (latency + message / replicas / bandwidth)
    assert e.stages[0].dp_sync_s == pytest.approx(ring)
    if latency == 0:
        assert ring == pytest.approx(2 * (replicas - 1) / replicas * message / bandwidth)
    assert e.iteration_time_s == pytest.approx(8 * 8 * (F + B) + ring + 8 * U)


def test_sync_overlaps_the_last_backward():
    profile = uniform_profile()
    places = [[f"gcp/us-central1/us-central1-{z}" for z in "ab"]]
    dp = plan([(0, 8)], places, batch=16)
    e = run(
        profile, dp, network=FakeNetwork(default=(0.0, 1e9)), sim_settings=settings(overlap=True)
    )
    ring = 2 * (2 - 1) / 2 * 8 * PARAMS * 4 / 1e9
    exposed = max(
        ring * 25 * 2**20 / (8 * PARAMS * 4), ring - 8 * B
    )  # buckets reduced during the last backward
    assert e.stages[0].dp_sync_exposed_s == pytest.approx(exposed)
    assert e.iteration_time_s == pytest.approx(8 * 8 * (F + B) + exposed + 8 * U)


@pytest.mark.parametrize("overlap", [False, True])
def test_a_rounds_fixed_cost_is_paid_once_per_iteration_and_never_hidden(overlap):
    """A framework's coordination per averaging round (Hivemind's matchmaking): added to the
    all-reduce of every stage with replicas, after the bytes, whatever overlaps; a stage without
    replicas pays nothing; the granularity counts it as communication."""
    profile, round_s = uniform_profile(), 0.5
    places = [[f"gcp/us-central1/us-central1-{z}" for z in "ab"]]
    dp = plan([(0, 8)], places, batch=16)
    network = FakeNetwork(default=(0.0, 1e9))
    without = run(profile, dp, network=network, sim_settings=settings(overlap=overlap))
    e = run(profile, dp, network=network, sim_settings=settings(overlap=overlap, round_s=round_s))
    assert e.stages[0].dp_sync_s == pytest.approx(without.stages[0].dp_sync_s + round_s)
    assert e.stages[0].dp_sync_exposed_s == pytest.approx(
        without.stages[0].dp_sync_exposed_s + round_s
    )
    assert e.iteration_time_s == pytest.approx(without.iteration_time_s + round_s)
    busy = 8 * 8 * (F + B) + 8 * U
    assert e.granularity == pytest.approx(busy / e.stages[0].dp_sync_s)
    one = plan([(0, 8)], [["gcp/us-central1/us-central1-a"]], batch=8)
    alone = run(profile, one, network=network, sim_settings=settings(round_s=round_s))
    assert alone.iteration_time_s == pytest.approx(8 * 8 * (F + B) + 8 * U)


@pytest.mark.parametrize(("stages", "m"), [(2, 8), (4, 8), (4, 16)])
def test_pure_pipeline_equal_stages(stages, m):
    per_stage = 8 // stages
    profile = uniform_profile()
    layers = [(s * per_stage, (s + 1) * per_stage) for s in range(stages)]
    pp = plan(layers, [["gcp/us-central1/us-central1-a"]] * stages, batch=m)
    e = run(profile, pp, network=FakeNetwork(default=(0.0, float("inf"))))
    work = per_stage * (F + B)
    assert e.pipeline_s == pytest.approx((m + stages - 1) * work)
    assert e.iteration_time_s == pytest.approx((m + stages - 1) * work + per_stage * U)
    assert e.bubble_s == pytest.approx((stages - 1) * work)


def test_heterogeneous_pipeline_paced_by_its_slowest_stage():
    profile = uniform_profile(slow={4: 3.0, 5: 3.0})  # stage 2 (layers 4-5) is three times slower
    layers = [(0, 2), (2, 4), (4, 6), (6, 8)]
    m = 32
    pp = plan(layers, [["gcp/us-central1/us-central1-a"]] * 4, batch=m)
    e = run(profile, pp, network=FakeNetwork(default=(0.0, float("inf"))))
    fast, slow = 2 * (F + B), 2 * 3 * (F + B)
    assert e.bottleneck == "stage 2" and e.period_s == pytest.approx(slow)
    # the slow stage works m times; before it the first microbatch's forward through stages 0-1,
    # after it the last gradient's backward through stages 1-0; stage 3 hides behind it
    assert e.pipeline_s == pytest.approx(2 * 2 * F + m * slow + 2 * 2 * B)
    assert e.pipeline_s < (4 - 1) * fast + slow + (m - 1) * slow  # below the straggler formula


def test_transfers_between_stages_use_latency_and_bandwidth():
    profile = uniform_profile()
    a, b = "gcp/us-central1/us-central1-a", "gcp/us-west1/us-west1-b"
    pp = plan([(0, 4), (4, 8)], [[a], [b]], batch=8)
    latency, bandwidth = 0.015, 1e8
    e = run(profile, pp, network=FakeNetwork({(a, b): (latency, bandwidth)}))
    size = 100_000 * 4  # elements sent on per sample, fp32
    assert e.stages[0].send_s == pytest.approx(latency + size / bandwidth)


def test_memory_by_precision_and_optimizer():
    for precision, optimizer, static_per_param in [
        ("fp16-mixed", "adam", 16),
        ("fp32", "adam", 16),
        ("fp16-mixed", "sgd", 12),
        ("fp32", "sgd", 12),
    ]:
        profile = uniform_profile(precision=precision, optimizer=optimizer)
        e = run(profile, plan([(0, 8)], [["gcp/us-central1/us-central1-a"]], batch=8))
        parts = e.memory[0].parts
        assert parts.parameters + parts.gradients + parts.optimizer == pytest.approx(
            8 * PARAMS * static_per_param
        )
    profile = uniform_profile(precision="fp16-mixed")
    e = run(profile, plan([(0, 8)], [["x/y/z"]], batch=8))
    assert e.memory[0].parts.optimizer == pytest.approx(
        8 * PARAMS * 12
    )  # two fp32 moments + fp32 master


def test_activations_in_flight_under_1f1b():
    profile = uniform_profile()
    layers = [(0, 2), (2, 4), (4, 6), (6, 8)]
    e = run(profile, plan(layers, [["p/r/z"]] * 4, batch=16, mbs=2))
    # stage s of P keeps up to P - s microbatches of 2 samples: what its two layers keep for
    # backward, and (but the last) the output it sent on, until that microbatch's gradient returns
    sent = 100_000 * 4
    for memory in e.memory:
        per_sample = 2 * 1e6 + (sent if memory.stage < 3 else 0)
        assert memory.parts.activations == pytest.approx(per_sample * 2 * (4 - memory.stage))
    e = run(profile, plan(layers, [["p/r/z"]] * 4, batch=2, mbs=1))  # only 2 microbatches exist
    assert e.memory[0].parts.activations == pytest.approx((2 * 1e6 + sent) * 1 * 2)


def test_oom_flag_against_the_gpu():
    profile = uniform_profile(params=400_000_000, gpus=("V100",))
    e = run(profile, plan([(0, 8)], [["p/r/z"]], gpu="V100", batch=8))
    assert e.oom and e.peak_memory_bytes > 16 * 2**30
    assert e.to_dict()["oom"] is True


def test_egress_of_a_plan_crossing_a_region_and_a_cloud():
    """Stage 0 in gcp/us-central1, stage 1 in gcp/us-east1 (a region boundary), stage 2 in aws/us-east-1
    (a cloud boundary): every activation and gradient crossing pays the sender's egress price."""
    catalog = default_catalog()
    network, prices, sim_settings = views_for(catalog, catalog.market("skypilot"))
    profile = uniform_profile(layers=6, gpus=("T4",))
    places = ["gcp/us-central1/us-central1-a", "gcp/us-east1/us-east1-c", "aws/us-east-1"]
    m = 8
    crossing = plan([(0, 2), (2, 4), (4, 6)], [[p] for p in places], gpu="T4", batch=m)
    e = simulate(profile, crossing, network=network, prices=prices, settings=sim_settings)
    size = 100_000 * 4 * m  # bytes each way per link per iteration
    usd = {
        pair: catalog.egress_price(*pair).usd_per_gb
        for pair in [
            (places[0], places[1]),
            (places[1], places[0]),
            (places[1], places[2]),
            (places[2], places[1]),
        ]
    }
    assert usd[(places[0], places[1])] == 0.02 and usd[(places[1], places[2])] == 0.12
    assert usd[(places[2], places[1])] == 0.09
    assert e.egress_usd_per_iteration == pytest.approx(size / 1e9 * sum(usd.values()))
    assert {(x.src, x.dst) for x in e.egress} == set(usd)
    t4_hour = prices.gpu_hour_usd("T4", places[0], spot=True, tp=1)
    assert e.cost_per_hour_usd > t4_hour > 0
    assert e.cost_per_million_samples_usd == pytest.approx(e.cost_per_iteration_usd / m * 1e6)


def test_framework_overhead_by_gpu_type():
    from orchestrator.catalog.per_gpu import PerGpu

    base = settings()
    by_type = type(base)(
        **{**base.__dict__, "framework_overhead_bytes": PerGpu(1e9, (("V100", 3e9),))}
    )
    profile = uniform_profile()
    a100 = run(profile, plan([(0, 8)], [["p/r/z"]], gpu="A100", batch=8), sim_settings=by_type)
    v100 = run(profile, plan([(0, 8)], [["p/r/z"]], gpu="V100", batch=8), sim_settings=by_type)
    assert a100.memory[0].parts.overhead == pytest.approx(1e9)
    assert v100.memory[0].parts.overhead == pytest.approx(3e9)
