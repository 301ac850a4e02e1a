"""On a machine with a GPU: the runtime trains a Hugging Face GPT-2 on CUDA as the CPU's single
process does, in bf16 too; and as 2 stages in one place, whose activations and gradients then go
over NCCL: GPU to GPU with two GPUs or more, and on one GPU between two ranks that are NCCL hosts
of their own (runtime/devices.py). Without a CUDA device every test here skips and says so
(the project's CI machine has none; a GPU is lent to some sessions only)."""

from __future__ import annotations

import dataclasses

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from runtime.layout import Layout, WorkerSpec  # noqa: E402
from runtime.models.protocol import ModelSource  # noqa: E402
from runtime.reference import TrainConfig, workload_losses  # noqa: E402
from runtime.workload import build_workload  # noqa: E402
from tests.integration.conftest import local_ray  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
pytestmark = pytest.mark.skipif(
    GPUS == 0, reason="no CUDA device on this machine: the GPU tests run where a GPU is lent"
)
PLACE = "local/gpu/gpu-a"
GPT2 = ModelSource(
    kind="hf",
    target="gpt2",
    args={
        "n_layer": 4,
        "n_embd": 128,
        "n_head": 4,
        "n_positions": 64,
        "vocab_size": 512,
        "resid_pdrop": 0.0,
        "embd_pdrop": 0.0,
        "attn_pdrop": 0.0,
    },
)
CONFIG = TrainConfig(
    steps=5, global_batch_size=8, microbatch_size=2, learning_rate=3e-3, seed=1, grad_clip_norm=1.0
)
# the GPU's kernels sum in other orders than the CPU's (measured with gpt-mini: 3e-7 in fp32)
TOLERANCE = {"fp32": 1e-4, "bf16-mixed": 2e-2}


def _layout(stages: int) -> Layout:
    layers = 6  # embedding, 4 blocks, head
    bounds = [(0, layers)] if stages == 1 else [(0, 3), (3, layers)]
    workers = tuple(
        WorkerSpec(stage=s, replica=0, place=PLACE, device="cuda", microbatches=4)
        for s in range(stages)
    )
    return Layout(
        model=GPT2.label,
        layers=tuple(bounds),
        workers=workers,
        microbatch_size=2,
        warmup=tuple(stages - 1 - s for s in range(stages)),
    )


def _run(layout: Layout, config: TrainConfig) -> tuple[list[float], list[dict]]:
    """The losses of ``config.steps`` steps, and each worker's counters after them."""
    from runtime.group import WorkerGroup

    share = 1.0 if GPUS >= layout.world_size else 1.0 / layout.world_size
    with local_ray(num_cpus=4, resources={f"infra:{PLACE}": 4}):
        group = WorkerGroup.start(layout, config, model=GPT2, timeout_s=300, gpu_share=share)
        try:
            return [group.step(step) for step in range(config.steps)], group.counters()
        finally:
            group.shutdown()


@pytest.mark.integration
@pytest.mark.parametrize("precision", ["fp32", "bf16-mixed"])
def test_a_gpt2_on_one_gpu_trains_as_the_cpu_does(precision):
    config = dataclasses.replace(CONFIG, precision=precision)
    want = workload_losses(build_workload(GPT2, seed=config.seed), config)
    got, _ = _run(_layout(1), config)
    relative = max(abs(g - w) / w for g, w in zip(got, want, strict=True))
    assert relative <= TOLERANCE[precision], (got, want)


@pytest.mark.integration
def test_two_stages_of_one_place_talk_over_nccl():
    want = workload_losses(build_workload(GPT2, seed=CONFIG.seed), CONFIG)
    got, counters = _run(_layout(2), CONFIG)
    relative = max(abs(g - w) / w for g, w in zip(got, want, strict=True))
    assert relative <= TOLERANCE["fp32"], (got, want)
    assert all(c["nccl_groups"] >= 1 for c in counters), counters
    assert all(c["gpu_shared"] is (GPUS < 2) for c in counters), counters
