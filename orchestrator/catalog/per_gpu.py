"""A config value that may differ by GPU type: ``key: 0.4`` or ``key: {default: 0.4, A100: 0.46}``.

Keys are catalog GPU names (configs/gpus.yaml); an alias or an unknown name is an error naming the
file and line.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from orchestrator.catalog.gpus import GpuSpec, GpuTable
from orchestrator.catalog.records import Entry


@dataclass(frozen=True)
class PerGpu:
    """A factor with a default and, optionally, its own value on some GPUs (catalog names)."""

    default: float
    by_gpu: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, value: float | Mapping[str, float] | PerGpu) -> PerGpu:
        """From a number (every GPU) or a mapping ``{default: x, <GPU name>: y, ...}``."""
        if isinstance(value, PerGpu):
            return value
        if isinstance(value, Mapping):
            if "default" not in value:
                raise ValueError(f"a per-GPU factor needs a 'default' entry, got {dict(value)!r}")
            others = tuple(sorted((str(k), float(v)) for k, v in value.items() if k != "default"))
            return cls(float(value["default"]), others)
        return cls(float(value))

    def for_gpu(self, gpu: str | GpuSpec) -> float:
        name = gpu.name if isinstance(gpu, GpuSpec) else gpu
        for key, value in self.by_gpu:
            if key == name:
                return value
        return self.default

    def as_plain(self) -> float | dict[str, float]:
        """A number when no GPU has its own value, else ``{default: .., <GPU>: ..}``."""
        if not self.by_gpu:
            return self.default
        return {"default": self.default, **dict(self.by_gpu)}


def fraction(entry: Entry, key: str) -> float:
    value = entry.number(key)
    if value > 1:
        entry.fail(
            entry.path + (key,),
            f"is a fraction of the GPU's peak and must be <= 1, got {value:g}",
            f"correct {key}",
        )
    return value


def read_per_gpu(
    entry: Entry, key: str, gpus: GpuTable, read: Callable[[Entry, str], float] | None = None
) -> PerGpu:
    """``key: 0.4`` or ``key: {default: 0.4, A100: 0.46, ...}`` keyed by catalog GPU names."""
    read = read or fraction
    value = entry.raw(key)
    if not isinstance(value, dict):
        return PerGpu(read(entry, key))
    sub = Entry(entry.doc, entry.path + (key,), entry.label)
    default = read(sub, "default")
    others = []
    for name in value:
        if name == "default":
            continue
        spec = gpus.find(str(name))
        if spec is None:
            close = gpus.suggest(str(name))
            sub.fail(
                sub.path + (name,),
                f"'{name}' is not a GPU in {gpus.file}",
                f"use a GPU name from {gpus.file}"
                + (f" (did you mean '{close}'?)" if close else ""),
            )
        if spec.name != name:
            sub.fail(
                sub.path + (name,),
                f"'{name}' is an alias of {spec.name}; per-GPU values are keyed by catalog names",
                f"rename the key to '{spec.name}'",
            )
        others.append((spec.name, read(sub, name)))
    sub.done()
    return PerGpu(default, tuple(sorted(others)))
