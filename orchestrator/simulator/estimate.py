"""What the simulator predicts for one plan: time, memory, dollars, and their breakdown."""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class MemoryParts:
    """Peak bytes on one GPU of one replica, by what holds them."""

    parameters: float
    gradients: float
    optimizer: float  # optimizer state, plus the fp32 master copy under mixed precision
    activations: float  # kept for the microbatches in flight
    buffers: float  # send/receive buffers and gradient-sync buffers
    overhead: float  # framework (CUDA context, kernels) and allocator fragmentation

    @property
    def total(self) -> float:
        return (
            self.parameters
            + self.gradients
            + self.optimizer
            + self.activations
            + self.buffers
            + self.overhead
        )


@dataclass(frozen=True)
class ReplicaMemory:
    stage: int
    replica: int
    gpu: str
    infra: str
    tp: int
    parts: MemoryParts
    capacity_bytes: float

    @property
    def peak_memory_bytes(self) -> float:
        return self.parts.total

    @property
    def oom(self) -> bool:
        return self.parts.total > self.capacity_bytes


@dataclass(frozen=True)
class StageTime:
    stage: int
    layers: tuple[int, int]
    forward_s: float  # per microbatch, slowest replica
    backward_s: float
    update_s: float  # optimizer step, slowest replica
    send_s: (
        float  # activation to the next stage per microbatch: latency + bytes / bandwidth (slowest)
    )
    dp_sync_s: float  # gradient all-reduce across this stage's replicas
    dp_sync_exposed_s: float  # the part not hidden behind the last backward
    finish_s: float  # when this stage's optimizer step ends
    # waiting on a tied embedding's gradient from the pipeline's other end (first and last stage)
    tied_wait_s: float = 0.0


@dataclass(frozen=True)
class EgressLink:
    src: str
    dst: str
    bytes_per_iteration: float
    usd_per_iteration: float


@dataclass(frozen=True)
class Breakdown:
    """The parts of an estimate people read; built only when asked for (the planner does not)."""

    stages: tuple[StageTime, ...]
    memory: tuple[ReplicaMemory, ...]
    egress: tuple[EgressLink, ...]
    notes: tuple[str, ...]


@dataclass(frozen=True, eq=False)
class Estimate:
    iteration_time_s: float
    samples_per_s: float
    tokens_per_s: float | None
    microbatches: tuple[int, ...]  # per pipeline
    pipeline_s: float  # the slowest pipeline's 1F1B work (fill, steady state, drain)
    period_s: float  # steady-state seconds per microbatch of that pipeline
    bottleneck: str  # what sets the period: "stage 2", "loop 0-3", "link 1->2 (forward)"
    bubble_s: float  # pipeline time beyond microbatches x period (fill and drain)
    oom: bool
    peak_memory_bytes: float  # the highest of all GPUs
    cost_per_hour_usd: float
    compute_usd_per_iteration: float
    egress_usd_per_iteration: float
    granularity: float  # compute time / communication time (Erben et al.)
    speedup_if_doubled: float  # (g + 1) / (g / 2 + 1): what doubling the GPUs would give
    global_batch_size: int
    profile_source: str  # measured | imported | estimated (the weakest over the plan's GPUs)
    profile_sources: tuple[tuple[str, str], ...]  # (gpu, source)
    breakdown_fn: Callable[[], Breakdown] = field(repr=False)

    @classmethod
    def of(cls, fields: dict) -> Estimate:
        """The estimate whose fields, all of them, are ``fields`` (a new dict, which becomes the
        instance's ``__dict__``), for the planner's inner loop: a frozen dataclass's ``__init__``
        sets each field through ``object.__setattr__``, which costs more than many of the
        simulator's sums (tests check both ways give the same object)."""
        estimate = object.__new__(cls)
        object.__setattr__(estimate, "__dict__", fields)
        return estimate

    @functools.cached_property
    def breakdown(self) -> Breakdown:
        return self.breakdown_fn()

    @property
    def stages(self) -> tuple[StageTime, ...]:
        return self.breakdown.stages

    @property
    def memory(self) -> tuple[ReplicaMemory, ...]:
        return self.breakdown.memory

    @property
    def egress(self) -> tuple[EgressLink, ...]:
        return self.breakdown.egress

    @property
    def notes(self) -> tuple[str, ...]:
        return self.breakdown.notes

    @property
    def cost_per_iteration_usd(self) -> float:
        return self.compute_usd_per_iteration + self.egress_usd_per_iteration

    @property
    def cost_per_million_samples_usd(self) -> float:
        return self.cost_per_iteration_usd / self.global_batch_size * 1e6

    def to_dict(self) -> dict:
        return {
            "iteration_time_s": self.iteration_time_s,
            "samples_per_s": self.samples_per_s,
            "tokens_per_s": self.tokens_per_s,
            "oom": self.oom,
            "peak_memory_bytes": [
                [m.peak_memory_bytes for m in self.memory if m.stage == s.stage]
                for s in self.stages
            ],
            "cost_per_hour_usd": self.cost_per_hour_usd,
            "cost_per_iteration_usd": self.cost_per_iteration_usd,
            "compute_usd_per_iteration": self.compute_usd_per_iteration,
            "egress_usd_per_iteration": self.egress_usd_per_iteration,
            "cost_per_million_samples_usd": self.cost_per_million_samples_usd,
            "granularity": self.granularity,
            "speedup_if_doubled": self.speedup_if_doubled,
            "profile_source": self.profile_source,
            "profile_sources": dict(self.profile_sources),
            "breakdown": {
                "microbatches_per_pipeline": list(self.microbatches),
                "pipeline_s": self.pipeline_s,
                "period_s": self.period_s,
                "bottleneck": self.bottleneck,
                "bubble_s": self.bubble_s,
                "stages": [_stage_dict(s) for s in self.stages],
                "memory": [_memory_dict(m) for m in self.memory],
                "egress": [
                    {
                        "from": e.src,
                        "to": e.dst,
                        "bytes_per_iteration": e.bytes_per_iteration,
                        "usd_per_iteration": e.usd_per_iteration,
                    }
                    for e in self.egress
                ],
            },
            "notes": list(self.notes),
        }


def _stage_dict(stage: StageTime) -> dict:
    return {
        "stage": stage.stage,
        "layers": list(stage.layers),
        "forward_s": stage.forward_s,
        "backward_s": stage.backward_s,
        "update_s": stage.update_s,
        "send_s": stage.send_s,
        "dp_sync_s": stage.dp_sync_s,
        "dp_sync_exposed_s": stage.dp_sync_exposed_s,
        "finish_s": stage.finish_s,
        "tied_wait_s": stage.tied_wait_s,
    }


def _memory_dict(memory: ReplicaMemory) -> dict:
    parts = memory.parts
    return {
        "stage": memory.stage,
        "replica": memory.replica,
        "gpu": memory.gpu,
        "infra": memory.infra,
        "tp": memory.tp,
        "peak_memory_bytes": memory.peak_memory_bytes,
        "capacity_bytes": memory.capacity_bytes,
        "oom": memory.oom,
        "parameters_bytes": parts.parameters,
        "gradients_bytes": parts.gradients,
        "optimizer_bytes": parts.optimizer,
        "activations_bytes": parts.activations,
        "buffers_bytes": parts.buffers,
        "overhead_bytes": parts.overhead,
    }
