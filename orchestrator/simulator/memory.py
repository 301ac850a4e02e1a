"""Peak memory of one GPU of one replica, as the runtime (runtime/stage.py) holds it.

- Parameters and gradients: 2 bytes each under mixed precision, 4 under fp32, for this GPU's share
  (the stage's layers at its TP degree); the last stage of a pipeline also holds its copy of a
  tied embedding. Gradients live in one flat buffer that the all-reduce works on in place.
- Optimizer: Adam/AdamW keep two fp32 moments (8 bytes per parameter), SGD one momentum (4); mixed
  precision adds an fp32 master copy (4).
- Activations: per microbatch in flight, what the stage's layers keep for backward and the output
  it sent on (held until that microbatch's gradient comes back); a stage holds its warm-up plus
  one (under standard 1F1B, stage ``s`` of ``P`` holds up to ``P - s``).
- Buffers: the activation and gradient a stage receives and sends (one microbatch each way). When
  the cross-region hop is compressed, a region leader keeps an fp32 error-feedback residual, and
  while it syncs (after the backward, when the activations are gone) one fp32 working copy and the
  compressed gradients of every region leader; the peak counts the larger of that and the
  activations.
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
    fields of MemoryParts (a plain tuple; the planner's inner loop uses ``memory_shape``)."""
    gradient, optimizer, per_flight, transfers, residual, working = _pieces(
        profile, plan, stage_index, tp
    )
    activations = per_flight * min(plan.warmup[stage_index] + 1, microbatches)
    # the sync's working memory replaces the activations and transfer buffers it follows
    buffers = residual + transfers + max(0.0, working - transfers - activations)
    tensors = 2 * gradient + optimizer + activations + buffers
    overhead = settings.overhead_bytes(gpu, tp) + settings.fragmentation_fraction * tensors
    return gradient, gradient, optimizer, activations, buffers, overhead


def memory_shape(
    profile: ModelProfile, plan: Plan, stage_index: int, gpu: str, tp: int, settings
) -> tuple[float, float, float]:
    """The same peak as ``fixed + max(per_flight * flights, sync)`` for ``flights`` microbatches
    in flight: three numbers per stage and GPU, for the planner's inner loop."""
    gradient, optimizer, per_flight, transfers, residual, working = _pieces(
        profile, plan, stage_index, tp
    )
    scale = 1 + settings.fragmentation_fraction
    fixed = scale * (2 * gradient + optimizer + residual + transfers)
    return (
        settings.overhead_bytes(gpu, tp) + fixed,
        scale * per_flight,
        scale * (working - transfers),
    )


def _pieces(
    profile: ModelProfile, plan: Plan, stage_index: int, tp: int
) -> tuple[float, float, float, float, float, float]:
    """Bytes of: the gradient (= the parameters), optimizer state, activations per microbatch in
    flight, transfer buffers, the compression residual, and the compressed sync's working copy."""
    start, end = plan.stages[stage_index].layers
    params, kept, received, sent = profile.stage_facts(tp, start, end)
    if end == profile.num_layers and start > 0:  # the last of several stages: its tied copy
        params += profile.tied_elements / tp
    element = profile.element_bytes
    mbs = plan.microbatch_size
    per_flight = (kept + sent * element) * mbs
    transfers = 2 * (received + sent) * mbs * element  # activation in and out, and their gradients
    gradient = params * element
    residual, working = _compression_bytes(plan, stage_index, params, gradient, element)
    optimizer = params * (
        OPTIMIZER_STATE_BYTES.get(profile.optimizer, 8) + (4 if element == 2 else 0)
    )
    return gradient, optimizer, per_flight, transfers, residual, working


def stage_regions(stage) -> int:
    """Regions a stage's replicas span (places are ``cloud/region[/zone]``)."""
    return len({"/".join(r.infra.split("/")[:2]) for r in stage.replicas})


def _compression_bytes(
    plan: Plan, stage_index: int, params: float, gradient_bytes: float, element: int
) -> tuple[float, float]:
    """(Kept, working) bytes of a region leader compressing the cross-region hop: the fp32
    residual, and one fp32 copy plus every leader's compressed gradient while it syncs."""
    if plan.dp_degree < 2 or plan.allreduce != "hierarchical" or plan.compression == "none":
        return 0.0, 0.0
    regions = stage_regions(plan.stages[stage_index])
    if regions < 2:
        return 0.0, 0.0
    payload = compressed_bytes(gradient_bytes, element, plan.compression)
    return 4 * params, 4 * params + (regions + 1) * payload


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
