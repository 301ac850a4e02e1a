"""Analytic profiles: per-layer times estimated from FLOPs, bytes and the GPU's peak figures.

Per layer and pass: ``t = overhead + matmul FLOPs / (peak x compute_efficiency) + elementwise bytes /
(memory bandwidth x memory_efficiency) + tensor-parallel all-reduces over the node's interconnect``.
Backward does ``backward_factor`` times the forward's matmul work and elementwise traffic (2 in
theory; SAILOR's measurements say more). The optimizer step is memory-bound: bytes touched per
parameter / (bandwidth x update_memory_efficiency), a factor of its own because the step's kernels
are not the forward's elementwise ones. ``compute_efficiency``, ``memory_efficiency`` and
``update_memory_efficiency`` may differ per GPU (``{default: 0.4, A100: 0.46}``, keyed by catalog
names); a GPU without its own value takes ``default``. Activations kept for backward follow
Korthikanti et al. (2022), "Reducing Activation Recomputation in Large Transformer Models".
The factors are fitted on SAILOR's measured profiles (bench/calibrate_analytic.py) and live in
configs/simulator.yaml. Every such profile is marked ``estimated``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from orchestrator.catalog.gpus import GpuSpec, GpuTable
from orchestrator.catalog.per_gpu import PerGpu, read_per_gpu
from orchestrator.catalog.records import Entry, read_yaml
from orchestrator.errors import UserError
from orchestrator.profiles.profile import (
    ELEMENT_BYTES,
    GpuProfile,
    LayerTable,
    ModelProfile,
    TimeTable,
)
from orchestrator.yamlsrc import YamlDoc
from runtime.models.specs import CnnSpec, GptSpec, ModelSpec

# Bytes read and written per parameter by one optimizer step (gradient in, state and weights in/out).
UPDATE_BYTES_PER_PARAM = {
    ("adam", "mixed"): 2
    + 3 * 4
    + 3 * 4
    + 2,  # fp16 grad; fp32 master, m, v read and written; fp16 copy
    ("adam", "fp32"): 4 + 3 * 4 + 3 * 4,
    ("sgd", "mixed"): 2 + 2 * 4 + 2 * 4 + 2,  # fp32 master and momentum
    ("sgd", "fp32"): 4 + 2 * 4 + 2 * 4,
}


@dataclass(frozen=True, kw_only=True)
class AnalyticSettings:
    """Efficiency factors of the analytic estimate (configs/simulator.yaml, section analytic).

    The three efficiencies accept a number (every GPU) or a mapping with ``default`` and catalog GPU
    names; they are stored as ``PerGpu`` and read with ``compute_for``, ``memory_for`` and
    ``update_memory_for``. ``update_memory_efficiency`` left out (None) means the GPU's
    ``memory_efficiency``, as before the two were separated.
    """

    compute_efficiency: PerGpu  # achieved fraction of peak matmul FLOPS
    memory_efficiency: PerGpu  # achieved fraction of peak memory bandwidth for elementwise work
    layer_overhead_s: float  # fixed cost per layer and pass (kernel launches, framework)
    elementwise_bytes_per_token_hidden: (
        float  # elementwise traffic of a block per token x hidden x element
    )
    source: str
    backward_factor: float = 2.0  # backward matmul work and elementwise traffic / forward's
    update_memory_efficiency: PerGpu | None = None  # fraction of bandwidth the optimizer step gets

    def __post_init__(self) -> None:
        object.__setattr__(self, "compute_efficiency", PerGpu.of(self.compute_efficiency))
        object.__setattr__(self, "memory_efficiency", PerGpu.of(self.memory_efficiency))
        if self.update_memory_efficiency is not None:
            object.__setattr__(
                self, "update_memory_efficiency", PerGpu.of(self.update_memory_efficiency)
            )

    def compute_for(self, gpu: str | GpuSpec) -> float:
        return self.compute_efficiency.for_gpu(gpu)

    def memory_for(self, gpu: str | GpuSpec) -> float:
        return self.memory_efficiency.for_gpu(gpu)

    def update_memory_for(self, gpu: str | GpuSpec) -> float:
        if self.update_memory_efficiency is None:
            return self.memory_for(gpu)
        return self.update_memory_efficiency.for_gpu(gpu)

    @classmethod
    def load(
        cls, path: Path, display: str, *, gpus: GpuTable | None = None, doc: YamlDoc | None = None
    ) -> AnalyticSettings:
        """Read section ``analytic`` (of ``doc`` when given, already parsed from ``path``); per-GPU
        keys are checked against ``gpus`` (by default the gpus.yaml beside ``path``)."""
        doc = doc if doc is not None else read_yaml(path, display)
        if gpus is None:
            gpus = GpuTable.load(path.parent / "gpus.yaml", str(Path(display).parent / "gpus.yaml"))
        entry = Entry(doc, ("analytic",))
        backward = entry.number("backward_factor", required=False)
        update = (
            read_per_gpu(entry, "update_memory_efficiency", gpus)
            if "update_memory_efficiency" in entry.value
            else None
        )
        entry.used.add("update_memory_efficiency")
        settings = cls(
            compute_efficiency=read_per_gpu(entry, "compute_efficiency", gpus),
            memory_efficiency=read_per_gpu(entry, "memory_efficiency", gpus),
            layer_overhead_s=entry.number("layer_overhead_s", strictly_positive=False),
            elementwise_bytes_per_token_hidden=entry.number(
                "elementwise_bytes_per_token_hidden", strictly_positive=False
            ),
            backward_factor=2.0 if backward is None else backward,
            update_memory_efficiency=update,
            source=entry.text("source"),
        )
        entry.done()
        return settings


def _optimizer_key(optimizer: str, precision: str) -> tuple[str, str]:
    return ("sgd" if optimizer == "sgd" else "adam", "fp32" if precision == "fp32" else "mixed")


def update_seconds(
    gpu: GpuSpec, params: float, *, optimizer: str, precision: str, settings: AnalyticSettings
) -> float:
    """A memory-bound optimizer step over ``params`` parameters on ``gpu``."""
    touched = UPDATE_BYTES_PER_PARAM[_optimizer_key(optimizer, precision)] * params
    bandwidth = gpu.memory_bandwidth_gb_per_s * 1e9 * settings.update_memory_for(gpu.name)
    return touched / bandwidth


def _peak_flops(gpu: GpuSpec, precision: str) -> float:
    tflops = {
        "fp32": gpu.peak_fp32_tflops,
        "fp16-mixed": gpu.peak_fp16_tflops,
        "bf16-mixed": gpu.peak_bf16_tflops,
    }[precision]
    if tflops is None:
        raise UserError(
            f"{gpu.name} has no {precision.split('-')[0]} support",
            field="training.precision",
            fix="choose fp16-mixed or fp32 for this GPU",
        )
    return tflops * 1e12


@dataclass(frozen=True)
class _Pass:
    """Work of one layer for one microbatch, forward pass."""

    matmul_flops: float
    elementwise_bytes: float
    tp_allreduce_bytes: float  # per all-reduce; a block does two in forward and two in backward
    tp_allreduces: int


class _Estimator:
    def __init__(self, gpu: GpuSpec, precision: str, settings: AnalyticSettings) -> None:
        self.gpu = gpu
        self.settings = settings
        self.flops = _peak_flops(gpu, precision) * settings.compute_for(gpu.name)  # achieved
        self.bandwidth = gpu.memory_bandwidth_gb_per_s * 1e9 * settings.memory_for(gpu.name)
        self.link = gpu.interconnect_bidirectional_gb_per_s * 1e9 / 2  # one direction

    def seconds(self, work: _Pass, tp: int, *, backward: bool) -> float:
        factor = self.settings.backward_factor if backward else 1.0
        compute = factor * work.matmul_flops / self.flops
        memory = factor * work.elementwise_bytes / self.bandwidth
        comm = 0.0
        if tp > 1 and work.tp_allreduces:
            comm = work.tp_allreduces * 2 * (tp - 1) / tp * work.tp_allreduce_bytes / self.link
        return self.settings.layer_overhead_s + compute + memory + comm


def _gpt_layers(
    spec: GptSpec, mbs: int, tp: int, element: int, settings: AnalyticSettings
) -> list[_Pass]:
    tokens, h, s = mbs * spec.seq_len, spec.hidden_size, spec.seq_len
    kv = spec.num_kv_heads or spec.num_heads
    block_matmul_params = (
        2 * h * h
        + 2 * h * kv * (h // spec.num_heads)
        + (3 if spec.gated_mlp else 2) * h * spec.ffn_hidden_size
    )
    block = _Pass(
        matmul_flops=(2 * tokens * block_matmul_params + 4 * tokens * s * h) / tp,
        elementwise_bytes=(
            settings.elementwise_bytes_per_token_hidden * tokens * h
            + 2 * spec.num_heads * s * tokens
        )
        * element
        / tp,
        tp_allreduce_bytes=tokens * h * element,
        tp_allreduces=2,
    )
    embedding = _Pass(0.0, 2 * tokens * h * element, tokens * h * element, 1)
    head = _Pass(
        2 * tokens * h * spec.vocab_size / tp, 3 * tokens * spec.vocab_size * element / tp, 0.0, 0
    )
    return [embedding, *([block] * spec.num_blocks), head]


def _gpt_sizes(spec: GptSpec, tp: int, element: int) -> LayerTable:
    s, h, a = spec.seq_len, spec.hidden_size, spec.num_heads
    # Korthikanti et al.: bytes per sample kept by a block under fp16 with tensor parallelism t
    # (no sequence parallelism, no recomputation): s*h*(10 + 24/t + 5*a*s/(h*t)).
    block_kept = s * h * (10 + 24 / tp + 5 * a * s / (h * tp)) * element / 2
    params = spec.layer_parameters()
    return LayerTable(
        params=tuple(int(p / tp) for p in params),
        act_out_elements=(s * h,) * (spec.num_blocks + 1) + (0,),
        act_kept_bytes=(s * h * element,)
        + (block_kept,) * spec.num_blocks
        + (s * spec.vocab_size * element / tp,),
    )


def _cnn_layers(spec: CnnSpec, mbs: int, element: int) -> tuple[list[_Pass], LayerTable]:
    passes, outs, kept = [], [], []
    size = spec.image_size // 4
    c0 = spec.widths[0]
    passes.append(
        _Pass(2 * 3 * 16 * c0 * size * size * mbs, 4 * c0 * size * size * element * mbs, 0.0, 0)
    )
    outs.append(c0 * size * size)
    kept.append(3 * c0 * size * size * element)
    for stage, (depth, width) in enumerate(zip(spec.depths, spec.widths, strict=True)):
        pixels = (size >> stage) ** 2
        for _ in range(depth):
            flops = (2 * 49 * width + 2 * 2 * spec.mlp_ratio * width * width) * pixels
            passes.append(_Pass(flops * mbs, 20 * width * pixels * element * mbs, 0.0, 0))
            outs.append(width * pixels)
            kept.append(10 * width * pixels * element)
    last = spec.widths[-1]
    passes.append(
        _Pass(
            2 * last * spec.num_classes * mbs, 2 * last * (size >> 3) ** 2 * element * mbs, 0.0, 0
        )
    )
    outs.append(0)
    kept.append(last * element)
    sizes = LayerTable(spec.layer_parameters(), tuple(outs), tuple(float(k) for k in kept))
    return passes, sizes


def analytic_profile(
    spec: ModelSpec,
    gpus: Iterable[GpuSpec],
    *,
    precision: str,
    optimizer: str,
    microbatch_sizes: Iterable[int],
    tp_degrees: Iterable[int],
    settings: AnalyticSettings,
) -> ModelProfile:
    """An estimated profile of ``spec`` on each GPU, at every (microbatch size, TP degree)."""
    element = ELEMENT_BYTES[precision]
    tps = sorted(set(tp_degrees)) if spec.family == "gpt" else [1]
    layers = {
        tp: (
            _gpt_sizes(spec, tp, element)
            if spec.family == "gpt"
            else _cnn_layers(spec, 1, element)[1]
        )
        for tp in tps
    }
    profiles = {}
    for gpu in gpus:
        estimator = _Estimator(gpu, precision, settings)
        times = {}
        for mbs in sorted(set(microbatch_sizes)):
            for tp in tps:
                passes = (
                    _gpt_layers(spec, mbs, tp, element, settings)
                    if spec.family == "gpt"
                    else _cnn_layers(spec, mbs, element)[0]
                )
                updates = tuple(
                    update_seconds(
                        gpu, p, optimizer=optimizer, precision=precision, settings=settings
                    )
                    for p in layers[tp].params
                )
                times[(mbs, tp)] = TimeTable(
                    forward_s=tuple(estimator.seconds(w, tp, backward=False) for w in passes),
                    backward_s=tuple(estimator.seconds(w, tp, backward=True) for w in passes),
                    update_s=updates,
                )
        origin = f"analytic estimate ({settings.source})"
        profiles[gpu.name] = GpuProfile(gpu.name, "estimated", origin, times)
    tokens = spec.seq_len if spec.family == "gpt" else 0
    tied = spec.tied_parameters() if spec.family == "gpt" else 0
    return ModelProfile(spec.name, precision, optimizer, tokens, layers, profiles, tied)
