"""Simulator parameters (configs/simulator.yaml: memory, communication) and GPU memory sizes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.catalog import Catalog
from orchestrator.catalog.per_gpu import PerGpu, read_per_gpu
from orchestrator.catalog.records import Entry


@dataclass(frozen=True, kw_only=True)
class SimulatorSettings:
    framework_overhead_bytes: PerGpu  # per GPU, beyond tensors, by GPU type
    tp_overhead_bytes: float  # extra per GPU when TP > 1
    fragmentation_fraction: float
    bucket_bytes: float
    overlap_grad_sync: bool
    # a data-parallel averaging round's fixed cost beyond moving its bytes (the framework's
    # coordination: Hivemind's matchmaking and its Python all-reduce); never hidden by overlap
    dp_round_overhead_s: float
    gpu_memory_bytes: Mapping[str, float]  # capacity by GPU name

    def overhead_bytes(self, gpu: str, tp: int) -> float:
        return self.framework_overhead_bytes.for_gpu(gpu) + (
            self.tp_overhead_bytes if tp > 1 else 0.0
        )

    def capacity_bytes(self, gpu: str) -> float:
        return self.gpu_memory_bytes[gpu]


def _bytes(entry: Entry, key: str) -> float:
    return entry.number(key, strictly_positive=False)


def load_settings(catalog: Catalog) -> SimulatorSettings:
    doc = catalog.yaml_doc("simulator.yaml")
    memory = Entry(doc, ("memory",))
    comm = Entry(doc, ("communication",))
    overlap = comm.raw("overlap_grad_sync")
    if not isinstance(overlap, bool):
        comm.fail(
            comm.path + ("overlap_grad_sync",),
            f"expected true or false, got {overlap!r}",
            "write true or false",
        )
    settings = SimulatorSettings(
        framework_overhead_bytes=read_per_gpu(
            memory, "framework_overhead_bytes", catalog.gpus, _bytes
        ),
        tp_overhead_bytes=memory.number("tp_overhead_bytes", strictly_positive=False),
        fragmentation_fraction=memory.number("fragmentation_fraction", strictly_positive=False),
        bucket_bytes=comm.number("bucket_bytes"),
        overlap_grad_sync=overlap,
        dp_round_overhead_s=comm.number("dp_round_overhead_s", strictly_positive=False),
        gpu_memory_bytes={spec.name: float(spec.memory_bytes) for spec in catalog.gpus.specs},
    )
    for entry in (memory, comm):
        entry.text("source")
        entry.done()
    return settings
