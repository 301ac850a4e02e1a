"""Plan → Layout: the one place where the orchestrator's plan becomes the runtime's topology."""

from __future__ import annotations

from collections.abc import Mapping

from orchestrator.errors import UserError
from orchestrator.plan import Plan
from runtime.layout import Layout, Link, WorkerSpec


def layout_from_plan(
    plan: Plan, *, model: str, devices: Mapping[str, str] | None = None, network=None
) -> Layout:
    """The runtime's view of ``plan``: one worker per replica of each stage, stage-major ranks.
    ``devices``: "cuda" or "cpu" per place (runtime.group.place_devices; missing: "cpu").
    With ``network`` (the simulator's NetworkView), traffic between distinct places is emulated
    with the latency and bandwidth the simulator assumes for them (at the plan's stream count)."""
    devices = devices or {}
    wide = sorted({r.tp for stage in plan.stages for r in stage.replicas if r.tp > 1})
    if wide:
        raise UserError(
            f"the runtime does not run tensor parallelism yet (tp={wide[0]} in the plan)",
            field="tp",
            fix="plan with tp: 1 (the planner's constraints: tp_degrees: [1])",
        )
    micro = plan.microbatches()
    workers = tuple(
        WorkerSpec(
            stage=s,
            replica=i,
            place=replica.infra,
            device=devices.get(replica.infra, "cpu"),
            microbatches=micro[i],
        )
        for s, stage in enumerate(plan.stages)
        for i, replica in enumerate(stage.replicas)
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
