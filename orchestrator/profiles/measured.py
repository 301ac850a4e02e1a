"""A ``runtime.profiler.ModelMeasurement`` as a model profile (source ``measured``): what
``python -m orchestrator profile`` writes and what a local job with ``profile: auto`` plans with.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from orchestrator.profiles.profile import GpuProfile, LayerTable, ModelProfile, TimeTable
from runtime.models.specs import ModelSpec, model_spec

if TYPE_CHECKING:  # for annotations only: importing runtime.profiler imports torch
    from runtime.profiler import ModelMeasurement


def measured_profile(
    measurement: ModelMeasurement,
    *,
    gpu: str,
    precision: str,
    spec: ModelSpec | None = None,
    split: Sequence[ModelMeasurement] = (),
) -> ModelProfile:
    """A ``runtime.profiler.ModelMeasurement`` as a one-GPU profile with source ``measured``;
    ``split``: measurements of the same model at tensor-parallel degrees above 1 (their times
    and one worker's sizes under the degree's key).

    Sizes are per sample: elements sent on from the largest microbatch (they scale exactly), bytes
    kept for backward as the largest per-sample figure over the sizes measured (fixed costs
    such as position ids weigh most on small microbatches; the larger figure keeps the simulator's
    OOM verdict on the safe side). ``spec``: the model's shape, for a model that is not built in."""
    assert len({m.tp for m in (measurement, *split)}) == 1 + len(split), "one per degree"
    times, sizes = {}, {}
    for m in (measurement, *split):
        sizes[m.tp] = _sizes(m)
        for mbs, layers in sorted(m.layers.items()):
            times[(mbs, m.tp)] = TimeTable(
                forward_s=tuple(t.forward_s for t in layers),
                backward_s=tuple(t.backward_s for t in layers),
                update_s=tuple(t.update_s for t in layers),
            )
    gpu_profile = GpuProfile(gpu, "measured", _origin(measurement, gpu), times)
    spec = spec or model_spec(measurement.model)
    return ModelProfile(
        measurement.model,
        precision,
        measurement.optimizer,
        getattr(spec, "seq_len", 0),  # tokens per sample: none for an image model
        sizes,
        {gpu: gpu_profile},
        spec.tied_parameters() if spec.family != "cnn" else 0,
    )


def _sizes(measurement: ModelMeasurement) -> LayerTable:
    by_size = measurement.layers
    largest = max(by_size)
    kept = tuple(
        max(layers[i].kept_bytes / mbs for mbs, layers in by_size.items())
        for i in range(len(measurement.params))
    )
    return LayerTable(
        params=tuple(measurement.params),
        act_out_elements=tuple(t.out_elements // largest for t in by_size[largest]),
        act_kept_bytes=kept,
    )


def _origin(measurement: ModelMeasurement, gpu: str) -> str:
    where = (
        f"this machine's CPU ({measurement.threads} thread(s)), a local worker's CPU slot standing "
        f"in for {gpu}"
        if measurement.device_name == "cpu"
        else measurement.device_name
    )
    return (
        f"measured by `python -m orchestrator profile` on {where}; torch {measurement.torch_version}, "
        f"mean of {measurement.repeats} runs per figure"
    )


def profile_here(
    recipe,
    spec: ModelSpec,
    *,
    gpu: str = "T4",
    tp_degrees: Sequence[int] = (),
    device: str = "cpu",
) -> ModelProfile:
    """The recipe's model timed layer by layer on this machine (one CPU thread standing in for
    ``gpu``, as a local worker does, or this machine's GPU with ``device="cuda"``): what the
    local cloud plans with under ``profile: auto``; ``tp_degrees``: also split that many ways
    over as many processes, as a tensor-parallel group of local workers trains it. Imports
    torch and the model's code."""
    from runtime.profiler import ProfilerConfig

    config = ProfilerConfig(
        microbatch_sizes=recipe.training.microbatch_sizes,
        optimizer=recipe.training.optimizer.name,
        seed=recipe.training.seed,
        device=device,
        threads=1 if device == "cpu" else None,
    )
    return measure_here(recipe, spec, config, gpu=gpu, tp_degrees=tp_degrees)[0]


def measure_here(
    recipe, spec: ModelSpec, config, *, gpu: str, tp_degrees: Sequence[int] = ()
) -> tuple[ModelProfile, ModelMeasurement]:
    """The recipe's model measured on this machine with ``config`` (a ``ProfilerConfig``),
    whole and split ``tp_degrees`` ways: its profile, and the whole model's measurement."""
    from orchestrator.recipe.models import build_parts, model_label, model_source
    from runtime.profiler import profile_model, profile_tensor_parallel

    label = model_label(recipe.model)
    measurement = profile_model(label, build_parts(recipe.model, seed=config.seed), config)
    split = [
        profile_tensor_parallel(label, model_source(recipe.model), config, degree=degree)
        for degree in sorted(set(tp_degrees) - {1})
    ]
    profile = measured_profile(
        measurement, gpu=gpu, precision=recipe.training.precision, spec=spec, split=split
    )
    return profile, measurement
