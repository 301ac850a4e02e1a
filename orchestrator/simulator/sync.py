"""A stage's gradient all-reduce as the simulator prices it: a group's cost is ``a + c * bytes``
(collectives.py for the algorithms), computed once per group of replica kinds and kept in the
network view's ``sync_cache``; the bytes that cross places go to the egress tally. The simulator
(core.py) uses it per stage; the planner bounds a placement with ``stage_sync_s`` before simulating
it."""

from __future__ import annotations

from orchestrator.plan import Plan
from orchestrator.profiles.profile import ModelProfile
from orchestrator.simulator.collectives import (
    butterfly_allreduce,
    compressed_bytes,
    hierarchical_allreduce,
    ring_allreduce,
)
from orchestrator.simulator.environment import NetworkView
from orchestrator.simulator.settings import SimulatorSettings


def sync_common(plan: Plan, element: int, settings: SimulatorSettings) -> tuple:
    """What an all-reduce's cost depends on besides its group (the key of ``sync_cache``)."""
    return (
        plan.allreduce,
        plan.compression,
        element,
        plan.streams,
        settings.averaging,
        settings.public_peers,
    )


def stage_sync_s(
    profile: ModelProfile,
    plan: Plan,
    s: int,
    *,
    network: NetworkView,
    settings: SimulatorSettings,
) -> float:
    """Seconds of stage ``s``'s gradient all-reduce, as ``simulate`` computes it (0 without
    replicas; before its round's fixed cost and before overlap): the planner bounds a placement
    with it before simulating the placement."""
    if plan.dp_degree < 2:
        return 0.0
    element = profile.element_bytes
    group = [sync_common(plan, element, settings)]
    for replica, count in plan.stage_kinds[s]:
        group.append(replica._key)
        group.append(count)
    group = tuple(group)
    coefficients = network.sync_cache.get(group)
    if coefficients is None:
        coefficients = network.sync_cache[group] = sync_coefficients(
            plan, s, element, network, settings
        )
    start, end = plan.stages[s].layers
    tp = plan.stages[s].replicas[0].tp
    gradient = profile.stage_gradient_elements(start, end, tp) * element
    fixed, slope, _ = coefficients
    return fixed + slope * gradient if gradient > 0 else 0.0


def sync_seconds(coefficients: tuple | None, message: float, egress: dict) -> float:
    """Seconds of a stage's all-reduce of ``message`` bytes; adds the bytes it sends across places
    to ``egress``. For a fixed group, time is ``a + c * bytes`` and the bytes crossing each boundary
    are proportional to the message: ``coefficients`` (a, c, per pair of places its share)."""
    if coefficients is None or message <= 0:
        return 0.0
    fixed, slope, per_byte = coefficients
    for pair, share in per_byte:
        egress[pair] += share * message
    return fixed + slope * message


def sync_coefficients(
    plan: Plan, s: int, element: int, network: NetworkView, settings: SimulatorSettings
) -> tuple:
    places = tuple(r.infra for r in plan.stages[s].replicas)
    gpus_at: dict[str, set[str]] = {}
    for r in plan.stages[s].replicas:
        gpus_at.setdefault(r.infra, set()).add(r.gpu)
    butterfly = settings.averaging == "butterfly"
    streams = 1 if butterfly else plan.streams  # the butterfly: one stream per pair of members
    same_place = settings.public_peers

    def link(src: str, dst: str) -> tuple[float, float]:
        # between two places, the slowest pair of the nodes the group has there
        links = [
            network.link(src, dst, streams, (a, b))
            for a in sorted(gpus_at[src])
            for b in sorted(gpus_at[dst])
        ]
        return max(lat for lat, _ in links), min(bw for _, bw in links)

    def cost(size: float):
        if butterfly:  # Hivemind compresses every exchange (its grad_compression)
            size = compressed_bytes(size, element, plan.compression)
            return butterfly_allreduce(places, size, link, same_place=same_place)
        if plan.allreduce == "flat":
            return ring_allreduce(places, size, link, same_place=same_place)
        return hierarchical_allreduce(
            places,
            size,
            link,
            region_of=network.region_of,
            grad_element_bytes=element,
            compression=plan.compression,
            same_place=same_place,
        )

    unit, double = cost(1e9), cost(2e9)
    slope = (double.time_s - unit.time_s) / 1e9
    return (
        unit.time_s - slope * 1e9,
        slope,
        tuple(((a, b), size / 1e9) for a, b, size in unit.crossing),
    )
