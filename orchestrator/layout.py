"""Plan → Layout: the one place where the orchestrator's plan becomes the runtime's topology."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.errors import UserError
from orchestrator.plan import Plan
from runtime.layout import Layout, Link, WorkerSpec


def layout_from_plan(
    plan: Plan, *, model: str, devices: Mapping[str, str] | None = None, network=None
) -> Layout:
    """The runtime's view of ``plan``: one worker per GPU of each replica of each stage (``tp``
    workers in a row for a tensor-parallel replica), stage-major ranks.
    ``devices``: "cuda" or "cpu" per place (runtime.group.place_devices; missing: "cpu").
    With ``network`` (the simulator's NetworkView), traffic between distinct places is emulated
    with the latency and bandwidth the simulator assumes for them (at the plan's stream count)."""
    devices = devices or {}
    for s, stage in enumerate(plan.stages):
        degrees = sorted({r.tp for r in stage.replicas})
        if len(degrees) > 1:
            raise UserError(
                f"stage {s} has replicas of tensor-parallel degrees {degrees}: the runtime sums a "
                "stage's gradients shard by shard, so its replicas must share one degree",
                field=f"stages[{s}].replicas.tp",
                fix="give every replica of a stage the same tp (stages may differ)",
            )
    micro = plan.microbatches()
    workers = tuple(
        WorkerSpec(
            stage=s,
            replica=i,
            place=replica.infra,
            device=devices.get(replica.infra, "cpu"),
            microbatches=micro[i],
            tp=replica.tp,
            tp_rank=t,
        )
        for s, stage in enumerate(plan.stages)
        for i, replica in enumerate(stage.replicas)
        for t in range(replica.tp)
    )
    return Layout(
        model=model,
        layers=tuple(tuple(stage.layers) for stage in plan.stages),
        workers=workers,
        microbatch_size=plan.microbatch_size,
        warmup=plan.warmup,
        allreduce=plan.allreduce,
        compression=plan.compression,
        links=_links(plan, network) if network is not None else (),
    )


def _links(plan: Plan, network) -> tuple[Link, ...]:
    places = sorted({r.infra for stage in plan.stages for r in stage.replicas})
    links = []
    for src in places:
        for dst in places:
            if src != dst:
                latency_s, bandwidth = network.link(src, dst, plan.streams)
                links.append(
                    Link(src=src, dst=dst, latency_s=latency_s, bandwidth_bytes_per_s=bandwidth)
                )
    return tuple(links)
