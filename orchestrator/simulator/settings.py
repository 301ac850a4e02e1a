"""Simulator parameters (configs/simulator.yaml: memory, communication) and GPU memory sizes."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

from orchestrator.catalog import Catalog
from orchestrator.catalog.per_gpu import PerGpu, read_per_gpu
from orchestrator.catalog.records import Entry
from orchestrator.errors import UserError


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
    # a pipeline's sends and receives block the compute of both ends until done (DeepSpeed's
    # pipeline engine); false: they run beside it (our runtime posts them and goes on)
    blocking_p2p: bool
    gpu_memory_bytes: Mapping[str, float]  # capacity by GPU name
    # how a stage's replicas average their gradients: "plan", the plan's ``allreduce`` (our
    # runtime's ring or hierarchy); "butterfly", every member sends each other member its share of
    # the gradient and gets the averaged share back, one stream per pair (Hivemind's all-reduce)
    averaging: str = "plan"
    # the members of a group address each other by public addresses, so the bytes between two of
    # them in one place are egress too, priced by the egress table's same_zone rule (Hivemind's
    # peers; our runtime's traffic inside a place is free)
    public_peers: bool = False

    def overhead_bytes(self, gpu: str, tp: int) -> float:
        return self.framework_overhead_bytes.for_gpu(gpu) + (
            self.tp_overhead_bytes if tp > 1 else 0.0
        )

    def capacity_bytes(self, gpu: str) -> float:
        return self.gpu_memory_bytes[gpu]


def _bytes(entry: Entry, key: str) -> float:
    return entry.number(key, strictly_positive=False)


def _flag(entry: Entry, key: str) -> bool:
    value = entry.raw(key)
    if not isinstance(value, bool):
        entry.fail(
            entry.path + (key,), f"expected true or false, got {value!r}", "write true or false"
        )
    return value


AVERAGING = ("plan", "butterfly")


def _averaging(entry: Entry) -> str:
    value = entry.raw("averaging", required=False)
    if value is None:
        return "plan"
    if value not in AVERAGING:
        entry.fail(
            entry.path + ("averaging",),
            f"unknown averaging {value!r}",
            f"write one of: {', '.join(AVERAGING)}",
        )
    return value


def runtimes(catalog: Catalog) -> tuple[str, ...]:
    """The runtimes besides ours that configs/simulator.yaml describes (``runtimes:``)."""
    raw = catalog.yaml_doc("simulator.yaml").value.get("runtimes") or {}
    return tuple(raw)


def load_settings(catalog: Catalog, runtime: str | None = None) -> SimulatorSettings:
    """The simulator's settings for our runtime, or for ``runtime``, one of ``runtimes()``: ours
    with that runtime's communication overrides."""
    doc = catalog.yaml_doc("simulator.yaml")
    memory = Entry(doc, ("memory",))
    comm = Entry(doc, ("communication",))
    overlap, blocking = (_flag(comm, key) for key in ("overlap_grad_sync", "blocking_p2p"))
    settings = SimulatorSettings(
        framework_overhead_bytes=read_per_gpu(
            memory, "framework_overhead_bytes", catalog.gpus, _bytes
        ),
        tp_overhead_bytes=memory.number("tp_overhead_bytes", strictly_positive=False),
        fragmentation_fraction=memory.number("fragmentation_fraction", strictly_positive=False),
        bucket_bytes=comm.number("bucket_bytes"),
        overlap_grad_sync=overlap,
        blocking_p2p=blocking,
        dp_round_overhead_s=comm.number("dp_round_overhead_s", strictly_positive=False),
        gpu_memory_bytes={spec.name: float(spec.memory_bytes) for spec in catalog.gpus.specs},
    )
    for entry in (memory, comm):
        entry.text("source")
        entry.done()
    if runtime is None:
        return settings
    if runtime not in runtimes(catalog):
        raise UserError(
            f"configs/simulator.yaml describes no runtime '{runtime}'",
            field="runtime",
            fix=f"use one of: {', '.join(runtimes(catalog)) or 'none listed'}",
        )
    other = Entry(doc, ("runtimes", runtime), label=runtime)
    settings = dataclasses.replace(
        settings,
        overlap_grad_sync=_flag(other, "overlap_grad_sync"),
        blocking_p2p=_flag(other, "blocking_p2p"),
        averaging=_averaging(other),
        public_peers=_flag(other, "public_peers") if "public_peers" in other.value else False,
    )
    other.text("source")
    other.done()
    return settings
