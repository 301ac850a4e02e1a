"""Model profiles: per-layer times on each GPU type, and per-layer sizes of the model.

A profile answers, for a range of layers on one GPU at a microbatch size and TP degree: forward,
backward and optimizer-update seconds, parameters per GPU, elements sent to the next stage, and
bytes kept for backward per sample. Range queries are O(1) from prefix sums, because the simulator
asks them in the planner's inner loop.

Sources: ``measured`` (our profiler), ``imported`` (SAILOR's published profiles) and ``estimated``
(analytic, from FLOPs and GPU specs). The JSON format is in docs/profile.md.
"""

from __future__ import annotations

import functools
import itertools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.yamlsrc import MIB, read_user_text

FORMAT = "geo-orchestrator/profile-v1"
MAX_PROFILE_BYTES = 64 * MIB  # SAILOR's largest published profile is 0.06 MiB
SOURCES = ("measured", "imported", "estimated")
ELEMENT_BYTES = {"fp32": 4, "fp16-mixed": 2, "bf16-mixed": 2}


def _prefix(values: Sequence[float]) -> tuple[float, ...]:
    return (0.0, *itertools.accumulate(values))


@dataclass(frozen=True)
class LayerTable:
    """Model-level sizes per layer at one TP degree (per GPU)."""

    params: tuple[int, ...]
    act_out_elements: tuple[int, ...]  # per sample: what the layer's output sends to the next stage
    act_kept_bytes: tuple[float, ...]  # per sample: what the layer keeps for its backward pass
    _params_sum: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _kept_sum: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        assert len(self.params) == len(self.act_out_elements) == len(self.act_kept_bytes)
        object.__setattr__(self, "_params_sum", _prefix(self.params))
        object.__setattr__(self, "_kept_sum", _prefix(self.act_kept_bytes))

    def params_in(self, start: int, end: int) -> float:
        return self._params_sum[end] - self._params_sum[start]

    def kept_bytes_in(self, start: int, end: int) -> float:
        return self._kept_sum[end] - self._kept_sum[start]


@dataclass(frozen=True)
class TimeTable:
    """Per-layer seconds for one microbatch at one (microbatch size, TP degree) on one GPU."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    update_s: tuple[float, ...]
    scaled_from_mbs: int | None = None  # set when derived from another microbatch size
    _f: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _b: tuple[float, ...] = field(init=False, repr=False, compare=False)
    _u: tuple[float, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        assert len(self.forward_s) == len(self.backward_s) == len(self.update_s)
        object.__setattr__(self, "_f", _prefix(self.forward_s))
        object.__setattr__(self, "_b", _prefix(self.backward_s))
        object.__setattr__(self, "_u", _prefix(self.update_s))

    def stage(self, start: int, end: int) -> tuple[float, float, float]:
        """(forward, backward, update) seconds of layers [start, end)."""
        return (
            self._f[end] - self._f[start],
            self._b[end] - self._b[start],
            self._u[end] - self._u[start],
        )

    def scaled(self, factor: float, from_mbs: int) -> TimeTable:
        return TimeTable(
            tuple(t * factor for t in self.forward_s),
            tuple(t * factor for t in self.backward_s),
            self.update_s,
            scaled_from_mbs=from_mbs,
        )


@dataclass(frozen=True)
class GpuProfile:
    """Times of the model on one GPU type."""

    gpu: str
    source: str  # measured | imported | estimated
    origin: str  # where the figures come from, for people
    times: Mapping[tuple[int, int], TimeTable]  # (microbatch size, tp) -> times

    def tp_degrees(self) -> tuple[int, ...]:
        return tuple(sorted({tp for _, tp in self.times}))

    def microbatch_sizes(self, tp: int) -> tuple[int, ...]:
        return tuple(sorted(m for m, t in self.times if t == tp))


@dataclass(frozen=True)
class ModelProfile:
    """A model's layer sizes (per TP degree) and its times on one or more GPU types."""

    model: str
    precision: str
    optimizer: str
    tokens_per_sample: int  # 0 for models that do not read tokens
    layers: Mapping[int, LayerTable]  # tp -> sizes
    gpus: Mapping[str, GpuProfile]
    # elements of a weight the first and last layer share (tied embeddings, counted with the first
    # layer): a pipeline keeps a copy on each end and exchanges its gradient every iteration
    tied_elements: int = 0
    _cache: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @property
    def num_layers(self) -> int:
        return len(next(iter(self.layers.values())).params)

    @functools.cached_property
    def element_bytes(self) -> int:
        return ELEMENT_BYTES[self.precision]

    def gpu(self, name: str) -> GpuProfile:
        try:
            return self.gpus[name]
        except KeyError:
            raise UserError(
                f"the profile of {self.model} has no times for GPU {name}",
                fix=f"profiled GPUs: {', '.join(sorted(self.gpus))}; use profile: analytic to estimate others",
            ) from None

    def layer_table(self, tp: int) -> LayerTable:
        table = self.layers.get(tp)
        if table is None:
            raise UserError(
                f"the profile of {self.model} has no layer sizes at TP={tp}",
                fix=f"use a TP degree of: {', '.join(map(str, sorted(self.layers)))}",
            )
        return table

    def stage_facts(self, tp: int, start: int, end: int) -> tuple[float, float, int, int]:
        """Layers [start, end) at TP degree ``tp``: (parameters per GPU, bytes kept per sample,
        elements received per sample, elements sent per sample)."""
        key = ("facts", tp, start, end)
        facts = self._cache.get(key)
        if facts is None:
            table = self.layer_table(tp)
            received = table.act_out_elements[start - 1] if start > 0 else 0
            sent = table.act_out_elements[end - 1] if end < self.num_layers else 0
            facts = self._cache[key] = (
                table.params_in(start, end),
                table.kept_bytes_in(start, end),
                received,
                sent,
            )
        return facts

    def stage_gradient_elements(self, start: int, end: int, tp: int) -> float:
        """Gradient elements of the whole stage (all TP shards)."""
        full = self.layers.get(1)
        if full is not None:
            return full._params_sum[end] - full._params_sum[start]
        return self.layer_table(tp).params_in(start, end) * tp

    def stage_times(
        self, gpu: str, mbs: int, tp: int, start: int, end: int
    ) -> tuple[float, float, float]:
        """(forward, backward, update) seconds of layers [start, end) for one microbatch."""
        key = (gpu, mbs, tp, start, end)
        times = self._cache.get(key)
        if times is None:
            times = self._cache[key] = self.time_table(gpu, mbs, tp).stage(start, end)
        return times

    def time_table(self, gpu: str, mbs: int, tp: int) -> TimeTable:
        """Times at (mbs, tp); scaled linearly from the nearest profiled microbatch size if absent."""
        key = (gpu, mbs, tp)
        table = self._cache.get(key)
        if table is None:
            table = self._cache[key] = self._time_table(gpu, mbs, tp)
        return table

    def _time_table(self, gpu: str, mbs: int, tp: int) -> TimeTable:
        profile = self.gpu(gpu)
        exact = profile.times.get((mbs, tp))
        if exact is not None:
            return exact
        sizes = profile.microbatch_sizes(tp)
        if not sizes:
            raise UserError(
                f"the profile of {self.model} on {gpu} has no times at TP={tp}",
                fix=f"use a TP degree of: {', '.join(map(str, profile.tp_degrees()))}",
            )
        # Compute time grows about linearly with the microbatch once kernels are busy; scale from the
        # nearest size below (else the smallest above).
        below = [m for m in sizes if m < mbs]
        nearest = below[-1] if below else sizes[0]
        return profile.times[(nearest, tp)].scaled(mbs / nearest, nearest)

    def sources(self) -> dict[str, str]:
        sources = self._cache.get("sources")
        if sources is None:
            sources = self._cache["sources"] = {name: gpu.source for name, gpu in self.gpus.items()}
        return sources

    def merged(self, other: ModelProfile) -> ModelProfile:
        """This profile with the GPUs of ``other`` added (layer sizes of this one are kept)."""
        if other.model != self.model or other.num_layers != self.num_layers:
            raise UserError(
                f"cannot merge profiles of {self.model} ({self.num_layers} layers) and "
                f"{other.model} ({other.num_layers} layers)",
                fix="profile the same model",
            )
        return ModelProfile(
            self.model,
            self.precision,
            self.optimizer,
            self.tokens_per_sample,
            self.layers,
            {**other.gpus, **self.gpus},
            self.tied_elements,
        )


def overlaid(base: ModelProfile, measured: ModelProfile) -> ModelProfile:
    """``base`` (an estimate) with the figures ``measured`` holds put over it: its GPUs' times
    and its layer sizes at the TP degrees it measured. A (microbatch, TP) of a measured GPU
    that was not measured keeps the estimate calibrated, layer by layer, by what measuring
    found at TP 1 (measured / estimated at the nearest measured microbatch): estimates run fast
    (BENCHMARKS.md), and one left as it is would win against the measured figures beside it."""
    if measured.model != base.model or measured.num_layers != base.num_layers:
        raise UserError(
            f"cannot lay a profile of {measured.model} ({measured.num_layers} layers) over one "
            f"of {base.model} ({base.num_layers} layers)",
            fix="profile the same model",
        )
    gpus = dict(base.gpus)
    for name, gpu in measured.gpus.items():
        under = base.gpus.get(name)
        times = dict(gpu.times)
        for key, estimate in (under.times if under else {}).items():
            if key not in times:
                times[key] = _calibrated(estimate, key[0], under, gpu)
        gpus[name] = GpuProfile(name, gpu.source, gpu.origin, times)
    return ModelProfile(
        base.model,
        base.precision,
        base.optimizer,
        base.tokens_per_sample,
        {**base.layers, **measured.layers},
        gpus,
        base.tied_elements,
    )


def _calibrated(estimate: TimeTable, mbs: int, base: GpuProfile, measured: GpuProfile):
    """``estimate`` times the measured / estimated ratio of each layer at TP 1 (the measured
    microbatch size nearest ``mbs`` that both hold; the estimate as it is when none)."""
    shared = [m for m in measured.microbatch_sizes(1) if (m, 1) in base.times]
    if not shared:
        return estimate
    nearest = min(shared, key=lambda m: (abs(m - mbs), m))
    truth, guess = measured.times[(nearest, 1)], base.times[(nearest, 1)]

    def scale(values, measured_values, guessed):
        return tuple(
            v * (m / g if g > 0 else 1.0)
            for v, m, g in zip(values, measured_values, guessed, strict=True)
        )

    return TimeTable(
        forward_s=scale(estimate.forward_s, truth.forward_s, guess.forward_s),
        backward_s=scale(estimate.backward_s, truth.backward_s, guess.backward_s),
        update_s=scale(estimate.update_s, truth.update_s, guess.update_s),
        scaled_from_mbs=estimate.scaled_from_mbs,
    )


def profile_to_json(profile: ModelProfile, gpu: str) -> dict:
    """The JSON document of one GPU's profile (docs/profile.md)."""
    gpu_profile = profile.gpu(gpu)
    times: dict[str, dict[str, dict]] = {}
    for (mbs, tp), table in sorted(gpu_profile.times.items()):
        times.setdefault(str(mbs), {})[str(tp)] = {
            "forward_s": list(table.forward_s),
            "backward_s": list(table.backward_s),
            "update_s": list(table.update_s),
        }
    return {
        "format": FORMAT,
        "model": profile.model,
        "gpu": gpu,
        "source": gpu_profile.source,
        "origin": gpu_profile.origin,
        "precision": profile.precision,
        "optimizer": profile.optimizer,
        "tokens_per_sample": profile.tokens_per_sample,
        "num_layers": profile.num_layers,
        "tied_elements": profile.tied_elements,
        "layers": {
            str(tp): {
                "params": list(t.params),
                "act_out_elements": list(t.act_out_elements),
                "act_kept_bytes": list(t.act_kept_bytes),
            }
            for tp, t in sorted(profile.layers.items())
        },
        "times": times,
    }


def load_profile_json(path: Path) -> ModelProfile:
    """Read a profile .json (docs/profile.md), checking its shape; raise UserError naming what is wrong."""
    text = read_user_text(
        path, max_bytes=MAX_PROFILE_BYTES, fix="check the path of the profile .json"
    )
    try:
        document = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise UserError(
            f"not a JSON profile: {exc}",
            file=str(path),
            fix="write it with `python -m orchestrator profile`",
        ) from None
    return profile_from_json(document, file=str(path))


def profile_from_json(document: dict, *, file: str) -> ModelProfile:
    def fail(field_name: str, message: str) -> None:
        raise UserError(
            message, file=file, field=field_name, fix="see docs/profile.md for the format"
        )

    if not isinstance(document, dict) or document.get("format") != FORMAT:
        fail("format", f"expected format '{FORMAT}'")
    for key in ("model", "gpu", "source", "precision", "optimizer", "layers", "times"):
        if key not in document:
            fail(key, f"missing '{key}'")
    if document["source"] not in SOURCES:
        fail("source", f"source must be one of {', '.join(SOURCES)}")
    if document["precision"] not in ELEMENT_BYTES:
        fail("precision", f"precision must be one of {', '.join(ELEMENT_BYTES)}")
    try:
        layers = {
            int(tp): LayerTable(
                tuple(int(v) for v in t["params"]),
                tuple(int(v) for v in t["act_out_elements"]),
                tuple(float(v) for v in t["act_kept_bytes"]),
            )
            for tp, t in document["layers"].items()
        }
        times = {
            (int(mbs), int(tp)): TimeTable(
                tuple(map(float, t["forward_s"])),
                tuple(map(float, t["backward_s"])),
                tuple(map(float, t["update_s"])),
            )
            for mbs, by_tp in document["times"].items()
            for tp, t in by_tp.items()
        }
    except (KeyError, TypeError, ValueError, AssertionError) as exc:
        fail("layers/times", f"malformed layer or time table ({exc.__class__.__name__}: {exc})")
    counts = {len(t.params) for t in layers.values()} | {len(t.forward_s) for t in times.values()}
    if len(counts) != 1:
        fail("layers/times", f"tables disagree on the number of layers: {sorted(counts)}")
    gpu = GpuProfile(document["gpu"], document["source"], document.get("origin", file), times)
    return ModelProfile(
        document["model"],
        document["precision"],
        document["optimizer"],
        int(document.get("tokens_per_sample", 0)),
        layers,
        {gpu.gpu: gpu},
        _tied_elements(document, fail),
    )


def _tied_elements(document: dict, fail) -> int:
    value = document.get("tied_elements", 0)  # absent in profiles written before it existed
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        fail("tied_elements", "tied_elements must be a whole number >= 0")
    return value
