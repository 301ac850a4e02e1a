"""Import SAILOR's published profiles (configs/profiles/sailor, from eth-easl/sailor, MIT).

SAILOR measured per-layer forward/backward/update seconds with Megatron-DeepSpeed in fp16 for
OPT-350M, GPT-Neo-2.7B, LLaMA-3-8B and OPT-30B on A100, V100, GH200 and RTX GPUs
(``profiles/<model>/<gpu>/profile.json``: ``{mbs: {tp: {layer: [f, b, u]}}}``) and per-layer sizes
(``llm_info.json``: parameters per GPU, activation elements sent on, activation bytes kept).

Three readings differ from SAILOR's own simulator, on purpose:
- ``act_mem_bytes`` is what SAILOR measured (allocated bytes); we keep it as bytes. SAILOR's
  simulator multiplies its float count by 2 under fp16, which halves the measured figure.
- ``u`` is the same value on every layer: the optimizer step of the model SAILOR's profiler ran,
  which has the embedding, two transformer blocks and the head (its runs use ``--num-layers 2``; read
  in a public copy of SAILOR's repository). We turn it into seconds per parameter of that model and
  charge each layer for its parameters, so a stage's update grows with its share of the model (the
  step is memory-bound). Where SAILOR recorded 0, the update is estimated from memory bandwidth.
- A layer's forward or backward at a microbatch size is never taken as longer than at the next
  larger size of the same TP degree (``monotone_in_microbatch``): a GPU does more work on a larger
  batch, so a smaller one measured slower is noise of that measurement. Across every published
  file this lowers one series (OPT-350M on GH-96 at TP 4, microbatch 1: the decoder blocks'
  forward 2.38 ms against 1.51 ms at microbatch 2; GPT-Neo-2.7B's GH-96 file is a copy of it),
  and the origin says so.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.errors import UserError
from orchestrator.profiles.profile import GpuProfile, LayerTable, ModelProfile, TimeTable
from runtime.models.specs import GptSpec, ModelSpec

ORIGIN = "SAILOR (eth-easl/sailor cf2c8e3) profiles/{model}/{gpu}/profile.json"
UpdateEstimate = Callable[[str, float], float]  # (gpu, parameters) -> seconds


def sailor_dir(catalog: Catalog) -> Path:
    return catalog.configs_dir / "profiles" / "sailor"


def sailor_gpus(spec: ModelSpec, catalog: Catalog) -> dict[str, str]:
    """Catalog GPU name -> SAILOR's folder name, for the GPUs SAILOR profiled this model on (none
    for models SAILOR did not profile, CNNs among them)."""
    name = getattr(spec, "sailor_name", None)
    folder = sailor_dir(catalog) / (name or "")
    if not name or not folder.is_dir():
        return {}
    found = {}
    for child in sorted(folder.iterdir()):
        gpu = catalog.gpus.find(child.name)
        if gpu is not None and (child / "profile.json").is_file():
            found[gpu.name] = child.name
    return found


def import_sailor(
    spec: GptSpec, gpus: Iterable[str], catalog: Catalog, update_estimate: UpdateEstimate
) -> ModelProfile:
    """SAILOR's profile of ``spec`` on each of ``gpus`` (catalog names); UserError if one is missing."""
    available = sailor_gpus(spec, catalog)
    if not available:
        raise UserError(
            f"SAILOR published no profile of {spec.name}",
            field="model.profile",
            fix="use profile: analytic",
        )
    layers = _layer_tables(spec, catalog)
    num_layers = len(next(iter(layers.values())).params)
    profiles = {}
    for gpu in gpus:
        if gpu not in available:
            raise UserError(
                f"SAILOR did not profile {spec.name} on {gpu}",
                field="model.profile",
                fix=f"SAILOR profiled it on {', '.join(available)}; use profile: auto or analytic "
                "to estimate the other GPUs",
            )
        profiles[gpu] = _gpu_profile(
            spec, gpu, available[gpu], layers, num_layers, catalog, update_estimate
        )
    return ModelProfile(
        spec.name, "fp16-mixed", "adam", spec.seq_len, layers, profiles, spec.tied_parameters()
    )


def _layer_tables(spec: GptSpec, catalog: Catalog) -> dict[int, LayerTable]:
    info = json.loads((sailor_dir(catalog) / "llm_info.json").read_text(encoding="utf-8"))[
        spec.sailor_name
    ]
    tables = {}
    for tp, by_layer in info.items():
        order = sorted(by_layer, key=int)
        tables[int(tp)] = LayerTable(
            params=tuple(int(by_layer[i]["params_floats"]) for i in order),
            act_out_elements=tuple(int(by_layer[i]["act_output_floats"]) for i in order),
            act_kept_bytes=tuple(float(by_layer[i]["act_mem_bytes"]) for i in order),
        )
    return tables


def _gpu_profile(
    spec: GptSpec,
    gpu: str,
    folder: str,
    layers: dict[int, LayerTable],
    num_layers: int,
    catalog: Catalog,
    update_estimate: UpdateEstimate,
) -> GpuProfile:
    path = sailor_dir(catalog) / spec.sailor_name / folder / "profile.json"
    raw = json.loads(path.read_text(encoding="utf-8"))
    origin = ORIGIN.format(model=spec.sailor_name, gpu=folder)
    times = {}
    for mbs, by_tp in raw.items():
        for tp, by_layer in by_tp.items():
            if len(by_layer) != num_layers:
                raise UserError(
                    f"SAILOR's profile of {spec.sailor_name} on {folder} has {len(by_layer)} layers where its "
                    f"llm_info.json has {num_layers}; the published file is inconsistent",
                    file=str(path),
                    fix=f"use profile: analytic for {gpu}",
                )
            if int(tp) not in layers:
                continue  # no layer sizes at this TP degree: unusable
            rows = [by_layer[str(i)] for i in range(num_layers)]
            times[(int(mbs), int(tp))] = TimeTable(
                forward_s=tuple(float(r[0]) for r in rows),
                backward_s=tuple(float(r[1]) for r in rows),
                update_s=_spread_update(float(rows[0][2]), layers[int(tp)], gpu, update_estimate),
            )
    times, lowered = monotone_in_microbatch(times)
    if lowered:
        origin += "; lowered to the next larger microbatch's time (smaller measured slower): " + (
            ", ".join(f"mbs {m} TP {tp} ({n} figures)" for (m, tp), n in sorted(lowered.items()))
        )
    return GpuProfile(gpu, "imported", origin, times)


def monotone_in_microbatch(
    times: dict[tuple[int, int], TimeTable],
) -> tuple[dict[tuple[int, int], TimeTable], dict[tuple[int, int], int]]:
    """``times`` with every layer's forward and backward at a microbatch size capped at its time
    at the next larger size of the same TP degree (taken from the largest down, so the cap
    carries); and how many figures each (microbatch size, TP) lost."""
    fixed, lowered = dict(times), {}
    for tp in sorted({t for _, t in times}):
        sizes = sorted((m for m, t in times if t == tp), reverse=True)
        for larger, smaller in zip(sizes, sizes[1:], strict=False):
            cap, table = fixed[(larger, tp)], fixed[(smaller, tp)]
            forward = tuple(min(a, b) for a, b in zip(table.forward_s, cap.forward_s, strict=True))
            backward = tuple(
                min(a, b) for a, b in zip(table.backward_s, cap.backward_s, strict=True)
            )
            changed = sum(
                a != b
                for a, b in zip(forward + backward, table.forward_s + table.backward_s, strict=True)
            )
            if changed:
                fixed[(smaller, tp)] = TimeTable(
                    forward_s=forward,
                    backward_s=backward,
                    update_s=table.update_s,
                    scaled_from_mbs=table.scaled_from_mbs,
                )
                lowered[(smaller, tp)] = changed
    return fixed, lowered


PROFILED_BLOCKS = 2  # SAILOR profiles a model of embedding + 2 blocks + head


def _spread_update(
    profiled_update_s: float, table: LayerTable, gpu: str, update_estimate: UpdateEstimate
) -> tuple[float, ...]:
    if profiled_update_s <= 0:  # not recorded: estimate the memory-bound step per layer
        return tuple(update_estimate(gpu, p) for p in table.params)
    params = table.params
    profiled = params[0] + params[-1] + sum(params[1 : 1 + PROFILED_BLOCKS])
    return tuple(profiled_update_s * p / profiled for p in params)
