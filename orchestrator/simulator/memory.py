"""Peak memory of one GPU of one replica.

- Parameters and gradients: 2 bytes each under mixed precision, 4 under fp32, for this GPU's share
  (the stage's layers at its TP degree).
- Optimizer: Adam/AdamW keep two fp32 moments (8 bytes per parameter), SGD one momentum (4); mixed
  precision adds an fp32 master copy (4).
- Activations: what the stage's layers keep for backward, per sample, times the microbatch size,
  times the microbatches in flight: a stage holds its warm-up plus one (under standard 1F1B, stage
  ``s`` of ``P`` holds up to ``P - s``).
- Buffers: the activation and gradient a stage receives and sends (one microbatch each way), and the
  gradient-sync buffers: two buckets for a flat ring; a flat gradient copy for the hierarchical
  scheme, plus an fp32 error-feedback residual and the compressed copy when the cross-region hop is
  compressed.
- Overhead: the framework's fixed share per GPU (more with TP) and allocator fragmentation.
"""

from __future__ import annotations

from orchestrator.plan import Plan, Replica
from orchestrator.profiles.profile import ModelProfile
from orchestrator.simulator.collectives import compressed_bytes
from orchestrator.simulator.estimate import MemoryParts
from orchestrator.simulator.settings import SimulatorSettings

OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd": 4}


def memory_terms(
    profile: ModelProfile,
    plan: Plan,
    stage_index: int,
    gpu: str,
    tp: int,
    microbatches: int,
    settings: SimulatorSettings,
) -> tuple[float, float, float, float, float, float]:
    """Peak bytes of one GPU of a replica with TP degree ``tp`` in stage ``stage_index``, as the
    fields of MemoryParts (a plain tuple: the planner's inner loop needs only their sum)."""
    start, end = plan.stages[stage_index].layers
    params, kept, received, sent = profile.stage_facts(tp, start, end)
    element = profile.element_bytes
    mbs = plan.microbatch_size
    activations = kept * mbs * min(plan.warmup[stage_index] + 1, microbatches)
    transfers = 2 * (received + sent) * mbs * element  # activation in and out, and their gradients
    gradient_bytes = params * element
    if plan.dp_degree < 2:
        sync = 0.0
    elif plan.allreduce == "flat":
        sync = 2 * min(settings.bucket_bytes, gradient_bytes)
    else:
        sync = gradient_bytes
        if plan.compression != "none":
            sync += 4 * params + compressed_bytes(gradient_bytes, element, plan.compression)
    optimizer = params * (
        OPTIMIZER_STATE_BYTES.get(profile.optimizer, 8) + (4 if element == 2 else 0)
    )
    tensors = 2 * gradient_bytes + optimizer + activations + transfers + sync
    overhead = settings.overhead_bytes(gpu, tp) + settings.fragmentation_fraction * tensors
    return gradient_bytes, gradient_bytes, optimizer, activations, transfers + sync, overhead


def replica_memory(
    profile: ModelProfile,
    plan: Plan,
    stage_index: int,
    replica: Replica,
    microbatches: int,
    settings: SimulatorSettings,
) -> MemoryParts:
    return MemoryParts(
        *memory_terms(profile, plan, stage_index, replica.gpu, replica.tp, microbatches, settings)
    )
