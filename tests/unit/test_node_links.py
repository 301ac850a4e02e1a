"""What a node's type does to its links, and runtimes whose pipeline transfers block.

- The catalog's network answers per pair of GPU types where SAILOR measured one (its zone table
  is per GPU type: a VM's type caps its network), and per pair of places otherwise.
- The simulator moves a pipeline's activations and a stage's gradients over the links of the nodes
  that hold them; the planner's link bounds stay optimistic over every GPU pair of a market.
- ``blocking_p2p`` (DeepSpeed's pipeline engine) adds each transfer to the work of both its ends.
- bench/sailor_validation.py's runs build into plans the simulator takes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import sys
from pathlib import Path

import pytest

from orchestrator.catalog import Location, default_catalog
from orchestrator.errors import UserError
from orchestrator.plan import Plan, Replica, Stage
from orchestrator.simulator import simulate, views_for
from orchestrator.simulator.settings import load_settings, runtimes

REPO = Path(__file__).resolve().parents[2]
ZONE_A = Location.parse("gcp/us-central1/us-central1-a")
ZONE_B = Location.parse("gcp/us-central1/us-central1-b")


@pytest.fixture(scope="module")
def catalog():
    return default_catalog()


@pytest.mark.parametrize(
    ("gpus", "low_gb_s", "high_gb_s"),
    [
        (("GH200", "GH200"), 20, 25),  # SAILOR's GH200 nodes (one GPU's NIC)
        (("V100", "V100"), 1.6, 1.8),  # slower than the A100 VMs that set the zone's figure
        (("RTX-3090", "Titan-RTX"), 0.1, 0.13),  # the RTX-3090 node's 1 Gbit/s port
    ],
)
def test_a_measured_pair_of_gpu_types_sets_the_link(catalog, gpus, low_gb_s, high_gb_s):
    link = catalog.network.link(ZONE_A, ZONE_A, gpus)
    assert link.bandwidth_from == "measured node pair"
    assert low_gb_s <= link.bandwidth_bytes_per_s / 1e9 <= high_gb_s
    assert "->" in link.bandwidth_table  # names the pair of GPU types it came from


def test_gpu_types_nobody_measured_fall_back_to_the_places(catalog):
    plain = catalog.network.link(ZONE_A, ZONE_B)
    t4 = catalog.network.link(ZONE_A, ZONE_B, ("T4", "T4"))
    assert t4 == plain and plain.bandwidth_from == "measured pair"
    # a region-level place has no zone pair to match a node measurement against
    region = Location.parse("gcp/us-central1")
    assert catalog.network.link(region, region, ("GH200", "GH200")).bandwidth_from != (
        "measured node pair"
    )


def _offer_market(catalog, tmp_path, gpus):
    from orchestrator.catalog import OFFER_COLUMNS

    rows = [",".join(OFFER_COLUMNS)]
    rows += [
        f"gcp,us-central1,us-central1-a,test-{g.lower()},{g},8,64,512,8.00,2.00,64,,test,2026-12-07"
        for g in gpus
    ]
    path = tmp_path / "market.csv"
    path.write_text("\n".join(rows) + "\n")
    return catalog.load_market(path)


def _plan(gpu: str, *, stages: int, dp: int, tp: int = 1) -> Plan:
    bounds = [round(i * 26 / stages) for i in range(stages + 1)]
    replica = Replica(gpu=gpu, tp=tp, infra=str(ZONE_A))
    return Plan(
        global_batch_size=64 * dp,
        microbatch_size=2,
        stages=tuple(
            Stage(layers=(bounds[s], bounds[s + 1]), replicas=(replica,) * dp)
            for s in range(stages)
        ),
        allreduce="flat",
    )


@pytest.fixture(scope="module")
def views(catalog, tmp_path_factory):
    from orchestrator.profiles import sailor_profile

    market = _offer_market(catalog, tmp_path_factory.mktemp("m"), ["A100", "GH200"])
    network, prices, settings = views_for(catalog, market)
    profiles = {g: sailor_profile("opt-350m", [g], catalog) for g in ("A100", "GH200")}
    return network, prices, settings, profiles


def test_data_parallel_sync_uses_the_nodes_links(views):
    network, prices, settings, profiles = views
    plan = _plan("GH200", stages=1, dp=8, tp=4)
    sync = (
        simulate(profiles["GH200"], plan, network=network, prices=prices, settings=settings)
        .stages[0]
        .dp_sync_s
    )
    # the ring moves 2(n-1)/n of the stage's gradients over the slowest pair's link
    gradient_bytes = profiles["GH200"].stage_gradient_elements(0, 26, 4) * 2
    gh200 = network.link(str(ZONE_A), str(ZONE_A), 8, ("GH200", "GH200"))[1]
    a100 = network.link(str(ZONE_A), str(ZONE_A), 8, ("A100", "A100"))[1]
    assert gh200 > 5 * a100
    assert sync < 2 * 7 / 8 * gradient_bytes / gh200 * 1.5
    assert sync > 2 * 7 / 8 * gradient_bytes / gh200


def test_blocking_transfers_add_to_both_ends(views):
    network, prices, settings, profiles = views
    plan = _plan("A100", stages=2, dp=1)
    free = simulate(profiles["A100"], plan, network=network, prices=prices, settings=settings)
    blocking = dataclasses.replace(settings, blocking_p2p=True)
    held = simulate(profiles["A100"], plan, network=network, prices=prices, settings=blocking)
    send = free.stages[0].send_s
    assert send > 0
    # every microbatch's activation and gradient now hold both stages: the slower stage's
    # per-microbatch work grows by one send each way
    m = free.microbatches[0]
    grown = held.iteration_time_s - free.iteration_time_s
    assert 2 * send * (m - 1) < grown < 2 * send * (m + 2)
    assert held.period_s == pytest.approx(free.period_s + 2 * send, rel=0.05)


def test_runtimes_are_data(catalog):
    assert "megatron-deepspeed" in runtimes(catalog)
    other = load_settings(catalog, "megatron-deepspeed")
    ours = load_settings(catalog)
    assert other.blocking_p2p and not ours.blocking_p2p
    assert not other.overlap_grad_sync and ours.overlap_grad_sync
    assert other.framework_overhead_bytes == ours.framework_overhead_bytes
    with pytest.raises(UserError) as error:
        load_settings(catalog, "horovod")
    assert "megatron-deepspeed" in error.value.fix


def test_planner_link_bounds_take_the_fastest_node_pair(catalog, tmp_path):
    from orchestrator.planner.links import LinkBounds
    from orchestrator.planner.space import Resource

    network, _, _ = views_for(catalog, _offer_market(catalog, tmp_path, ["A100", "GH200"]))

    class Space:
        streams = 8
        resources = [
            Resource(
                infra=str(ZONE_A),
                region="gcp/us-central1",
                cloud="gcp",
                gpu=g,
                capacity=8,
                max_node_gpus=8,
                has_spot=True,
                preemption_rate_per_hour=None,
            )
            for g in ("A100", "GH200")
        ]

    bounds = LinkBounds.of(Space, network)
    assert bounds.best[1] == network.link(str(ZONE_A), str(ZONE_A), 8, ("GH200", "GH200"))[1]


def test_the_validation_runs_build_and_simulate():
    spec = importlib.util.spec_from_file_location(
        "sailor_validation", REPO / "bench" / "sailor_validation.py"
    )
    bench = importlib.util.module_from_spec(spec)
    sys.modules["sailor_validation"] = bench
    spec.loader.exec_module(bench)
    doc = json.loads(bench.DATA.read_text())
    assert "cf2c8e3" in doc["source"] and len(doc["runs"]) == 24
    catalog = default_catalog()
    for run in doc["runs"]:
        plan, gpus = bench.build(run, catalog)
        assert plan.num_layers == 26 and gpus
        # the plan files' numbers of nodes: N<nodes>_D<replicas>
        nodes, dp = run["name"].split()[1].split("_")[:2]
        assert plan.dp_degree == int(dp[1:])
        assert sum(count for s in run["stages"] for *_, count in s["replicas"]) == int(nodes[1:])
        assert run["iteration_s"] > 0 and run["peak_bytes"] > 1e9
