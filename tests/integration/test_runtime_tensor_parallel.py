"""Tensor parallelism on the runtime (gloo on the CPU): torch's ``parallelize_module`` with the
model's plan, combined with pipeline stages and data-parallel replicas, trains as one process
does; stages of different degrees pass activations between them; a checkpoint written at one
degree restores at another."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from orchestrator.layout import layout_from_plan  # noqa: E402
from orchestrator.plan import Plan, Replica, check_plan  # noqa: E402
from runtime.models.protocol import ModelSource  # noqa: E402
from runtime.reference import TrainConfig, workload_losses  # noqa: E402
from runtime.workload import build_workload  # noqa: E402
from tests.integration.conftest import SMALL_GPT2  # noqa: E402

A1, B1 = "local/sim-us/sim-us-a", "local/sim-eu/sim-eu-a"
CONFIG = TrainConfig(
    steps=4, global_batch_size=8, microbatch_size=2, learning_rate=3e-3, seed=5, grad_clip_norm=1.0
)
CORPUS_BYTES = 2**18
GPT2 = ModelSource(kind="hf", target="gpt2", args=SMALL_GPT2)
# a user's LLaMA-shaped model that declares its own plan (its package shipped by runtime_env)
USER_PACKAGE = Path(__file__).parents[1] / "fixtures" / "usermodels" / "llama_lm"
LLAMA = ModelSource(kind="module", target="llama_lm:build", args={"depth": 4})
# A split matrix product sums its terms in two halves and the all-reduce adds them: the last bits
# differ from one process's product, and Adam carries that on (measured: below 2e-6 in 4 steps)
RELATIVE_TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def workers(shared_workers):
    """The runtime modules' shared pool (conftest.SharedRuntime), whose workers Ray ships this
    module's user package to."""
    return shared_workers


def _plan(layers, pipelines: list[list[tuple[str, int]]]) -> Plan:
    """``pipelines``: per replica, (place, tp) of each stage."""
    plan = Plan.from_pipelines(
        global_batch_size=CONFIG.global_batch_size,
        microbatch_size=CONFIG.microbatch_size,
        layers=layers,
        pipelines=[(1, [Replica(gpu="T4", infra=p, tp=t) for p, t in row]) for row in pipelines],
        allreduce="hierarchical",
    )
    check_plan(plan)
    return plan


def _train(
    workers, model: ModelSource, plan: Plan, config: TrainConfig, *, store=None
) -> list[float]:
    layout = layout_from_plan(plan, model=model.label)
    group = workers.start(layout, config, corpus_bytes=CORPUS_BYTES, model=model)
    losses = [group.step(step) for step in range(config.steps)]
    if store is not None:
        group.checkpoint(store, "tp-job", config.steps - 1)
    return losses


def _close(got: list[float], want: list[float]) -> None:
    relative = [abs(g - w) / w for g, w in zip(got, want, strict=True)]
    assert max(relative) <= RELATIVE_TOLERANCE, (relative, got, want)


def _reference(model: ModelSource, config: TrainConfig) -> list[float]:
    return workload_losses(
        build_workload(model, seed=config.seed, corpus_bytes=CORPUS_BYTES), config
    )


@pytest.mark.integration
def test_a_hugging_face_gpt2_as_two_stages_of_tp2_trains_as_one_process_does(workers):
    plan = _plan([(0, 3), (3, 6)], [[(A1, 2), (A1, 2)]])
    _close(_train(workers, GPT2, plan, CONFIG), _reference(GPT2, CONFIG))


@pytest.mark.integration
def test_tp_with_replicas_in_two_regions_and_stages_of_other_degrees(workers, monkeypatch):
    """2 stages x 2 replicas (hierarchical sync per tensor-parallel rank), the first stage TP 2
    feeding a whole second stage, in bf16; a user's grouped-query, SwiGLU model with its own
    plan (its gate split too)."""
    monkeypatch.syspath_prepend(str(USER_PACKAGE.parent))  # this process's reference run only
    plan = _plan([(0, 3), (3, 6)], [[(A1, 2), (A1, 1)], [(B1, 2), (B1, 1)]])
    config = dataclasses.replace(CONFIG, precision="bf16-mixed")
    got, want = _train(workers, LLAMA, plan, config), _reference(LLAMA, config)
    relative = [abs(g - w) / w for g, w in zip(got, want, strict=True)]
    assert max(relative) <= 1e-3, (relative, got, want)  # bf16: rounding of two halves' sums


@pytest.mark.integration
def test_a_tp_checkpoint_restores_into_a_layout_without_tp(workers, tmp_path):
    """Shards joined and cut again: TP 2 x 2 stages for 4 steps, then 1 stage without TP goes on
    from the checkpoint; the losses are the 8-step single-process run's."""
    store = str(tmp_path)
    first = dataclasses.replace(CONFIG, steps=4)
    tp_plan = _plan([(0, 3), (3, 6)], [[(A1, 2), (A1, 2)]])
    losses = _train(workers, GPT2, tp_plan, first, store=store)
    plain = layout_from_plan(_plan([(0, 6)], [[(A1, 1)]]), model=GPT2.label)
    group = workers.start(plain, CONFIG, corpus_bytes=CORPUS_BYTES, model=GPT2)
    group.restore(store, "tp-job")
    losses += [group.step(step) for step in range(4, 8)]
    _close(losses, _reference(GPT2, dataclasses.replace(CONFIG, steps=8)))
