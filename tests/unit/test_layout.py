"""Plan → Layout and the Layout's groups: ranks, pipelines, data-parallel and hierarchical groups."""

from __future__ import annotations

import pytest

from orchestrator.errors import UserError
from orchestrator.layout import layout_from_plan
from orchestrator.plan import Plan, Replica
from runtime.layout import Layout, LayoutError, WorkerSpec

A1, A2, B1 = "local/sim-us/sim-us-a", "local/sim-us/sim-us-b", "local/sim-eu/sim-eu-a"


def _plan(places: list[str], *, tp: int = 1) -> Plan:
    rows = [
        (1, [Replica(gpu="T4", tp=tp, infra=p), Replica(gpu="T4", tp=tp, infra=p)]) for p in places
    ]
    return Plan.from_pipelines(
        global_batch_size=8 * len(places),
        microbatch_size=2,
        layers=[(0, 3), (3, 6)],
        pipelines=rows,
    )


def test_ranks_pipelines_and_groups():
    layout = layout_from_plan(_plan([A1, A1, A2, B1]), model="gpt-tiny")
    assert layout.world_size == 8 and layout.replicas == 4 and layout.num_stages == 2
    assert layout.pipeline(2) == (2, 6)
    assert layout.dp_group(1) == (4, 5, 6, 7)
    assert layout.zone_groups(0) == ((0, 1), (2,), (3,))
    assert layout.region_groups(0) == ((0, 1, 2), (3,))
    assert layout.cross_region_group(1) == (4, 7)
    assert layout.worker(1, 3).region == "local/sim-eu" and layout.worker(0, 0).microbatches == 4
    assert layout.warmup == (1, 0) and layout.places() == (B1, A1, A2)


def test_a_tensor_parallel_replica_is_a_row_of_workers_in_one_place():
    layout = layout_from_plan(_plan([A1, B1], tp=2), model="gpt-tiny")
    assert layout.world_size == 8 and layout.replicas == 2 and layout.uses_tp
    assert [(w.stage, w.replica, w.tp_rank) for w in layout.workers[:4]] == [
        (0, 0, 0),
        (0, 0, 1),
        (0, 1, 0),
        (0, 1, 1),
    ]
    assert layout.tp_group(1, 1) == (6, 7) and layout.pipeline(1) == (2, 6)
    assert layout.dp_group(0, 1) == (1, 3) and layout.cross_region_group(1, 1) == (5, 7)
    assert layout.model_group(0) == (0, 1, 4, 5)
    assert layout.peer_rank(5, 0) == 1 and layout.fanout(1, 1) == (5,)


def test_stages_of_other_degrees_fan_activations_out_and_gradients_back():
    """A TP-2 stage feeding a whole stage: only the first worker sends forward; the whole stage's
    worker sends each gradient to both."""
    workers = (
        WorkerSpec(stage=0, replica=0, place=A1, microbatches=2, tp=2, tp_rank=0),
        WorkerSpec(stage=0, replica=0, place=A1, microbatches=2, tp=2, tp_rank=1),
        WorkerSpec(stage=1, replica=0, place=A1, microbatches=2),
    )
    layout = Layout(
        model="gpt-tiny", layers=((0, 3), (3, 6)), workers=workers, microbatch_size=2, warmup=(1, 0)
    )
    assert layout.fanout(0, 1) == (2,) and layout.fanout(1, 1) == ()
    assert layout.fanout(2, 0) == (0, 1) and layout.peer_rank(1, 1) == 2
    assert layout.peer_rank(2, 0) == 0


def test_replicas_of_one_stage_must_share_their_degree():
    plan = Plan.from_pipelines(
        global_batch_size=8,
        microbatch_size=2,
        layers=[(0, 6)],
        pipelines=[(1, [Replica(gpu="T4", tp=2, infra=A1)]), (1, [Replica(gpu="T4", infra=B1)])],
    )
    with pytest.raises(UserError, match="same tp"):
        layout_from_plan(plan, model="gpt-tiny")


def test_a_broken_layout_names_every_problem():
    workers = (
        WorkerSpec(stage=0, replica=0, place=A1, microbatches=4),
        WorkerSpec(stage=1, replica=0, place=A1, microbatches=3),
    )
    with pytest.raises(LayoutError) as caught:
        Layout(
            model="gpt-tiny",
            layers=((0, 3), (4, 6)),
            workers=workers,
            microbatch_size=1,
            warmup=(1,),
        )
    text = str(caught.value)
    assert "follow each other" in text and "warm-up" in text and "different microbatch" in text


def test_devices_per_place_and_which_groups_take_nccl():
    layout = layout_from_plan(
        _plan([A1, A1, A2, B1]), model="gpt-tiny", devices={A1: "cuda", A2: "cuda"}
    )
    assert [w.device for w in layout.workers[:4]] == ["cuda", "cuda", "cuda", "cpu"]
    assert layout.uses_cuda
    assert layout.on_nccl((0, 1))  # GPUs of one place
    assert not layout.on_nccl((1, 2))  # GPUs of two places: through host memory over gloo
    assert not layout.on_nccl((2, 3))  # a GPU and a CPU worker
    assert not layout.on_nccl((0, 0)) and not layout.on_nccl((0,))  # no peer: nothing to send
    assert layout.on_nccl((0, 4))  # a pipeline's two stages in one place
    plain = layout_from_plan(_plan([A1, A2]), model="gpt-tiny")
    assert not plain.uses_cuda and all(w.device == "cpu" for w in plain.workers)


def test_an_unknown_device_is_refused():
    with pytest.raises(LayoutError, match="device 'tpu'"):
        Layout(
            model="gpt-tiny",
            layers=((0, 6),),
            workers=(WorkerSpec(stage=0, replica=0, place=A1, device="tpu", microbatches=1),),
            microbatch_size=1,
            warmup=(0,),
        )


def test_place_devices_reads_the_gpus_of_each_places_live_nodes(monkeypatch):
    import ray

    from runtime.group import place_devices

    def node(place, gpus, alive=True):
        resources = {"CPU": 4.0, f"infra:{place}": 1.0, **({"GPU": gpus} if gpus else {})}
        return {"Alive": alive, "Resources": resources}

    nodes = [node(A1, 1), node(A1, 8), node(A2, 0), node(A2, 1), node(B1, 0, alive=False)]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    # every live node of A1 has a GPU; A2 has a CPU node (a worker may land there); B1 has none
    assert place_devices((A1, A2, B1)) == {A1: "cuda", A2: "cpu", B1: "cpu"}


def test_workers_listen_where_ray_does_off_loopback(monkeypatch):
    import os
    from types import SimpleNamespace

    import psutil

    from runtime.actor import pin_interfaces

    addresses = {"lo": [SimpleNamespace(address="127.0.0.1")]}
    addresses["wg0"] = [SimpleNamespace(address="100.64.0.7")]
    monkeypatch.setattr(psutil, "net_if_addrs", lambda: addresses)
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.setenv(name, "unset")  # recorded, so the test's own setting is undone after
        monkeypatch.delenv(name)
    pin_interfaces("127.0.0.1")
    assert "GLOO_SOCKET_IFNAME" not in os.environ
    assert os.environ["NCCL_SOCKET_IFNAME"] == "lo"  # NCCL leaves lo out unless told
    monkeypatch.delenv("NCCL_SOCKET_IFNAME")
    pin_interfaces("100.64.0.7")
    assert os.environ["GLOO_SOCKET_IFNAME"] == os.environ["NCCL_SOCKET_IFNAME"] == "wg0"
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")  # the operator's own choice stays
    pin_interfaces("100.64.0.7")
    assert os.environ["NCCL_SOCKET_IFNAME"] == "ib0"
