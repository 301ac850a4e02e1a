"""GPU specifications (configs/gpus.yaml): memory, peak FLOPS, memory bandwidth, interconnect.

Names follow SkyPilot's accelerator names; aliases cover other spellings, among them the names
SAILOR's published profiles use (``A100-40``, ``V100-16``, ``GH-96``). Lookups are case-insensitive.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from pathlib import Path

from orchestrator.catalog.records import Entry, Source, read_sources, read_yaml
from orchestrator.errors import CatalogError
from orchestrator.yamlsrc import YamlDoc

GIB = 1024**3
PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


@dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One GPU type. FLOPS are dense peaks (no sparsity); bandwidths in GB/s (1e9 bytes/s)."""

    name: str
    aliases: tuple[str, ...]
    vendor: str
    architecture: str
    form_factor: str
    memory_gib: float
    memory_bandwidth_gb_per_s: float
    peak_fp16_tflops: float
    peak_bf16_tflops: float | None
    peak_tf32_tflops: float | None
    peak_fp32_tflops: float
    interconnect: str
    interconnect_bidirectional_gb_per_s: float
    tdp_w: float | None
    sources: tuple[Source, ...]

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gib * GIB)

    def peak_tflops(self, precision: str) -> float | None:
        """Dense peak for ``fp32``, ``tf32``, ``fp16`` or ``bf16``; None if unsupported."""
        assert precision in PRECISIONS, precision
        return {
            "fp32": self.peak_fp32_tflops,
            "tf32": self.peak_tf32_tflops,
            "fp16": self.peak_fp16_tflops,
            "bf16": self.peak_bf16_tflops,
        }[precision]

    @property
    def supports_bf16(self) -> bool:
        return self.peak_bf16_tflops is not None


class GpuTable:
    """All GPU types, resolvable by name or alias."""

    def __init__(self, specs: tuple[GpuSpec, ...], file: str) -> None:
        self.specs = specs
        self.file = file
        self._by_key: dict[str, GpuSpec] = {}
        for spec in specs:
            for key in (spec.name, *spec.aliases):
                self._by_key[key.lower()] = spec

    def names(self) -> tuple[str, ...]:
        return tuple(spec.name for spec in self.specs)

    def find(self, name: str) -> GpuSpec | None:
        """The spec for a name or alias (any case), or None."""
        return self._by_key.get(name.strip().lower())

    def get(self, name: str) -> GpuSpec:
        spec = self.find(name)
        if spec is None:
            raise KeyError(name)
        return spec

    def suggest(self, name: str) -> str | None:
        close = difflib.get_close_matches(name.lower(), list(self._by_key), n=1, cutoff=0.5)
        return self._by_key[close[0]].name if close else None

    @classmethod
    def load(cls, path: Path, display: str) -> GpuTable:
        doc = read_yaml(path, display)
        top = Entry(doc, ())
        sources = read_sources(doc, top)
        entries = top.raw("gpus")
        top.done()
        if not isinstance(entries, list) or not entries:
            top.fail(
                ("gpus",),
                "expected a list of GPU entries",
                "write gpus: followed by '- name: ...' items",
            )
        specs = tuple(_read_gpu(Entry(doc, ("gpus", i)), sources) for i in range(len(entries)))
        _check_unique(specs, doc.file, doc)
        return cls(specs, display)


def _read_gpu(entry: Entry, sources: dict[str, Source]) -> GpuSpec:
    name = entry.text("name")
    entry.label = name
    keys = entry.texts("sources") if "sources" in entry.value else (entry.text("source"),)
    entry.used.update({"source", "sources"})
    for key in keys:
        if key not in sources:
            entry.fail(
                entry.path + ("source",),
                f"unknown source '{key}'",
                "add it under sources: or fix the key",
            )
    spec = GpuSpec(
        name=name,
        aliases=entry.texts("aliases"),
        vendor=entry.text("vendor"),
        architecture=entry.text("architecture"),
        form_factor=entry.text("form_factor"),
        memory_gib=entry.number("memory_gib"),
        memory_bandwidth_gb_per_s=entry.number("memory_bandwidth_gb_per_s"),
        peak_fp16_tflops=entry.number("peak_fp16_tflops"),
        peak_bf16_tflops=entry.number("peak_bf16_tflops", nullable=True),
        peak_tf32_tflops=entry.number("peak_tf32_tflops", nullable=True),
        peak_fp32_tflops=entry.number("peak_fp32_tflops"),
        interconnect=entry.text("interconnect"),
        interconnect_bidirectional_gb_per_s=entry.number("interconnect_bidirectional_gb_per_s"),
        tdp_w=entry.number("tdp_w", required=False, nullable=True),
        sources=tuple(sources[k] for k in keys),
    )
    entry.done()
    return spec


def _check_unique(specs: tuple[GpuSpec, ...], file: str, doc: YamlDoc) -> None:
    seen: dict[str, str] = {}
    for index, spec in enumerate(specs):
        for key in (spec.name, *spec.aliases):
            owner = seen.get(key.lower())
            if owner is not None and owner != spec.name:
                raise CatalogError(
                    f"name or alias '{key}' is used by both {owner} and {spec.name}",
                    file=file,
                    line=doc.line(("gpus", index)),
                    field=f"gpus[{index}] ({spec.name})",
                    fix="every name and alias must belong to one GPU",
                )
            seen[key.lower()] = spec.name
