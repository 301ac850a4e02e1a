"""Gradient all-reduce across the data-parallel replicas of one stage: time and bytes sent.

``flat``: one ring over all members, ordered by place so that it crosses each boundary as few times
as possible. ``2(n-1)`` steps each move ``M/n`` bytes, so the time is ``2(n-1) * (latency + M/(n b))``
over the group's link, its slowest member pair (lowest bandwidth, highest latency).

``hierarchical``: inside each region, reduce to one leader (reduce-scatter + gather); the region
leaders all-reduce in a ring, optionally compressed; each leader broadcasts the result back to its
region (scatter + all-gather). In-region phases cost ``2(n-1)/n * M/b + n * latency`` each. The zones
of a region share one in-region ring, ordered by zone: inter-zone links are nearly as fast as
intra-zone ones (1.42 vs 1.45 GB/s in the cross-region study), and a separate zone level would move
every byte through a zone leader twice more. With a single region there is nothing to cross, and
the hierarchy is the flat ring. Only the cross-region ring is compressed: fp16 halves fp32
gradients, int8 sends one byte per element plus an fp32 scale per 1024 elements.

``butterfly`` (Hivemind's all-reduce, not our runtime's): each member owns ``1/n`` of the message,
sends every other member its share of theirs and gets its own share back averaged, all pairs at
once on one stream each. Each phase takes the slowest pair's ``latency + M/(n b)``, or the member's
``(n-1) M/n`` through its fastest link (its network card), whichever is longer; two phases.

Each member sends about ``2(n-1)/n * M`` bytes per phase: to its ring neighbour, or ``2M/n`` to each
other member in the butterfly. The bytes that cross a zone, region or cloud boundary are returned
for pricing; with ``same_place``, also those between two members of one place (peers that address
each other by public addresses pay egress there too, at the egress table's same-zone price).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

LinkFn = Callable[[str, str], tuple[float, float]]  # (src, dst) -> (latency s, bandwidth bytes/s)
INT8_SCALE_OVERHEAD = 4 / 1024  # one fp32 scale per 1024 int8 elements


@dataclass(frozen=True)
class SyncCost:
    time_s: float
    crossing: tuple[tuple[str, str, float], ...]  # (src, dst, bytes) sent across places


def _group_link(places: Sequence[str], link: LinkFn) -> tuple[float, float]:
    """Slowest member pair of a group: highest latency, lowest bandwidth."""
    unique = sorted(set(places))
    pairs = [(a, b) for a in unique for b in unique if a != b]
    if len(unique) < len(places):  # two members share a place: the in-place link counts too
        pairs += [(a, a) for a in unique if places.count(a) > 1]
    latency, bandwidth = 0.0, float("inf")
    for a, b in pairs:
        lat, bw = link(a, b)
        latency = lat if lat > latency else latency
        bandwidth = bw if bw < bandwidth else bandwidth
    return latency, bandwidth


def _ring_crossing(
    places: Sequence[str], per_member_bytes: float, same_place: bool = False
) -> list[tuple[str, str, float]]:
    ordered = sorted(places)
    crossing = []
    for i, src in enumerate(ordered):
        dst = ordered[(i + 1) % len(ordered)]
        if src != dst or same_place:
            crossing.append((src, dst, per_member_bytes))
    return crossing


def ring_allreduce(
    places: Sequence[str], message_bytes: float, link: LinkFn, *, same_place: bool = False
) -> SyncCost:
    n = len(places)
    if n < 2 or message_bytes <= 0:
        return SyncCost(0.0, ())
    latency, bandwidth = _group_link(places, link)
    time = 2 * (n - 1) * (latency + message_bytes / n / bandwidth)
    crossing = _ring_crossing(places, 2 * (n - 1) / n * message_bytes, same_place)
    return SyncCost(time, tuple(crossing))


def butterfly_allreduce(
    places: Sequence[str], message_bytes: float, link: LinkFn, *, same_place: bool = False
) -> SyncCost:
    """Every member exchanges ``M/n`` with every other member, twice (module docstring)."""
    n = len(places)
    if n < 2 or message_bytes <= 0:
        return SyncCost(0.0, ())
    share = message_bytes / n
    unique = sorted(set(places))
    counts = {p: places.count(p) for p in unique}
    phase, crossing = 0.0, []
    for src in unique:
        slowest, card = 0.0, 0.0
        for dst in unique:
            if dst == src and counts[src] < 2:
                continue
            latency, bandwidth = link(src, dst)
            slowest = max(slowest, latency + share / bandwidth)
            card = max(card, bandwidth)
            peers = counts[dst] - (dst == src)
            if dst != src or same_place:
                crossing.append((src, dst, 2 * share * peers * counts[src]))
        phase = max(phase, slowest, (n - 1) * share / card)
    return SyncCost(2 * phase, tuple(crossing))


def _tree_phase(
    groups: dict[str, list[str]], message_bytes: float, link: LinkFn, same_place: bool
) -> tuple[float, list]:
    """Reduce (or broadcast) inside each group in parallel: time of the slowest group, bytes sent."""
    time, crossing = 0.0, []
    for members in groups.values():
        n = len(members)
        if n < 2:
            continue
        latency, bandwidth = _group_link(members, link)
        time = max(time, 2 * (n - 1) / n * message_bytes / bandwidth + n * latency)
        crossing += _ring_crossing(members, 2 * (n - 1) / n * message_bytes, same_place)
    return time, crossing


def compressed_bytes(message_bytes: float, grad_element_bytes: int, compression: str) -> float:
    if compression == "fp16":
        return message_bytes * min(2, grad_element_bytes) / grad_element_bytes
    if compression == "int8":
        return message_bytes / grad_element_bytes * (1 + INT8_SCALE_OVERHEAD)
    return message_bytes


def hierarchical_allreduce(
    places: Sequence[str],
    message_bytes: float,
    link: LinkFn,
    *,
    region_of: Callable[[str], str],
    grad_element_bytes: int,
    compression: str,
    same_place: bool = False,
) -> SyncCost:
    if len(places) < 2 or message_bytes <= 0:
        return SyncCost(0.0, ())
    regions: dict[str, list[str]] = {}
    for place in places:
        regions.setdefault(region_of(place), []).append(place)
    if len(regions) == 1:
        return ring_allreduce(places, message_bytes, link, same_place=same_place)
    local_time, local_bytes = _tree_phase(regions, message_bytes, link, same_place)
    leaders = [min(members) for members in regions.values()]
    top = ring_allreduce(
        leaders,
        compressed_bytes(message_bytes, grad_element_bytes, compression),
        link,
        same_place=same_place,
    )
    # reduce to the leaders, then broadcast back: the in-region phase runs twice
    return SyncCost(2 * local_time + top.time_s, tuple(local_bytes) * 2 + top.crossing)
