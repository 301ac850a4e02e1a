"""The best links and capacities of a market, for the planner's bounds (candidates.py): the best
link between any two places, between two places, between two regions, and between two nodes of each
GPU type; how many GPUs each place and region can give; and whether stages' replica groups can each
keep to one place or region (an exact packing), which decides whether some all-reduce must cross."""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass

from orchestrator.planner.space import SearchSpace
from orchestrator.simulator import NetworkView


@dataclass(frozen=True)
class LinkBounds:
    """The best links of a market, for bounds: (one-way latency s, bandwidth bytes/s)."""

    best: tuple[float, float]  # any two places, a place with itself included
    across_places: tuple[float, float]  # two different places
    across_regions: tuple[float, float]  # two different regions
    regions: int
    most_in_one_place: dict[str, int]  # GPU type -> the most GPUs one place can give
    most_in_one_region: dict[str, int]  # GPU type -> the most GPUs one region's places can give
    # GPU type -> the best links between two of its nodes: (any two places, two different places)
    # (a stage's replicas share one GPU type in the searched space, and all-reduce between their
    # nodes: a V100 stage never gets the links of two GH200 nodes)
    by_gpu: dict[str, tuple[tuple[float, float], tuple[float, float]]] = dataclasses.field(
        default_factory=dict
    )
    # GPU type -> the GPUs each place (each region) can give, largest first
    place_capacities: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    region_capacities: dict[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)

    def for_gpus(self, gpus) -> tuple[tuple[float, float], tuple[float, float]]:
        """(best, across places) links between two nodes of one of ``gpus``."""
        found = [self.by_gpu[g] for g in gpus if g in self.by_gpu]
        if not found:
            return self.best, self.across_places
        return top([b for b, _ in found]), top([a for _, a in found])

    @classmethod
    def of(cls, space: SearchSpace, network: NetworkView) -> LinkBounds:
        places = sorted({r.infra for r in space.resources})
        gpus_at: dict[str, set[str]] = {}
        for r in space.resources:
            gpus_at.setdefault(r.infra, set()).add(r.gpu)
        best, places_, regions_ = [], [], []
        same: dict[str, tuple[list, list]] = {}  # GPU type -> its links: any, across places
        for a in places:
            for b in places:
                # between nodes of some pair of the GPU types there (a VM's type caps its network)
                links = {
                    (x, y): network.link(a, b, space.streams, (x, y))
                    for x in sorted(gpus_at[a])
                    for y in sorted(gpus_at[b])
                }
                link = top(list(links.values()))
                best.append(link)
                if a != b:
                    places_.append(link)
                if network.region_of(a) != network.region_of(b):
                    regions_.append(link)
                for gpu in gpus_at[a] & gpus_at[b]:
                    own = same.setdefault(gpu, ([], []))
                    own[0].append(links[gpu, gpu])
                    if a != b:
                        own[1].append(links[gpu, gpu])
        most: dict[str, int] = {}
        by_place: dict[tuple[str, str], int] = {}
        by_region: dict[tuple[str, str], int] = {}
        for r in space.resources:
            most[r.gpu] = max(most.get(r.gpu, 0), r.capacity)
            by_place[(r.gpu, r.infra)] = max(by_place.get((r.gpu, r.infra), 0), r.capacity)
            key = (r.gpu, network.region_of(r.infra))
            by_region[key] = by_region.get(key, 0) + r.capacity
        most_region: dict[str, int] = {}
        for (gpu, _), count in by_region.items():
            most_region[gpu] = max(most_region.get(gpu, 0), count)

        def capacities(counts: dict[tuple[str, str], int]) -> dict[str, tuple[int, ...]]:
            out: dict[str, list[int]] = {}
            for (gpu, _), count in counts.items():
                out.setdefault(gpu, []).append(count)
            return {g: tuple(sorted(c, reverse=True)) for g, c in out.items()}

        return cls(
            best=top(best),
            across_places=top(places_),
            across_regions=top(regions_),
            regions=len({network.region_of(p) for p in places}),
            most_in_one_place=most,
            most_in_one_region=most_region,
            by_gpu={g: (top(any_), top(apart)) for g, (any_, apart) in same.items()},
            place_capacities=capacities(by_place),
            region_capacities=capacities(by_region),
        )


def top(links: list) -> tuple[float, float]:
    """The least latency and the most bandwidth of ``links`` (each may come from another)."""
    if not links:
        return (float("inf"), 1e-9)  # no such pair: nothing can use it
    return (min(lat for lat, _ in links), max(bw for _, bw in links))


PACKING_STEPS = 20_000  # a packing search that takes longer says "may fit" (the weaker bound)


@functools.lru_cache(maxsize=4096)
def groups_fit_apart(sizes: tuple[int, ...], capacities: tuple[int, ...]) -> bool:
    """Whether groups of ``sizes`` GPUs (largest first) can each go whole into one of the bins
    of ``capacities``: when not, some group must span two bins. Exact depth-first search over the
    groups, bins of equal room tried once; past ``PACKING_STEPS`` it answers True, which only
    keeps a bound weaker."""
    if sum(sizes) > sum(capacities):
        return False
    if len(set(sizes)) == 1:  # equal groups: each bin takes as many whole ones as it holds
        return sum(c // sizes[0] for c in capacities) >= len(sizes)
    steps, failed = 0, set()
    rest = [sum(sizes[i:]) for i in range(len(sizes) + 1)]

    def place(i: int, rooms: tuple[int, ...]) -> bool:
        nonlocal steps
        steps += 1
        if i == len(sizes) or steps > PACKING_STEPS:
            return True
        smallest = sizes[-1]  # largest first: the rest are no larger than this one
        if sum(r for r in rooms if r >= smallest) < rest[i] or (i, rooms) in failed:
            return False
        tried = set()
        for k, room in enumerate(rooms):
            if room >= sizes[i] and room not in tried:
                tried.add(room)
                left = rooms[:k] + (room - sizes[i],) + rooms[k + 1 :]
                if place(i + 1, tuple(sorted(left, reverse=True))):
                    return True
        failed.add((i, rooms))
        return False

    return place(0, capacities)


def stage_groups_fit(
    gpus: tuple[str, ...],
    tps: tuple[int, ...],
    dp: int,
    bins: dict[str, tuple[int, ...]],
    without: int = -1,
) -> bool:
    """Whether every stage's ``dp`` replicas (``dp * tp`` GPUs) but stage ``without``'s can keep
    to one bin each (place or region), the stages of each GPU type sharing that type's bins."""
    sizes: dict[str, list[int]] = {}
    for s, (gpu, tp) in enumerate(zip(gpus, tps, strict=True)):
        if s != without:
            sizes.setdefault(gpu, []).append(dp * tp)
    return all(
        groups_fit_apart(tuple(sorted(group, reverse=True)), bins.get(gpu, ()))
        for gpu, group in sizes.items()
    )


def crossing_candidates(
    gpus: tuple[str, ...], tps: tuple[int, ...], dp: int, bins: dict[str, tuple[int, ...]]
) -> tuple[int, ...] | None:
    """None when every stage's group may keep to one bin; else the stages whose group may be the
    only one to span bins (every other one keeping to one). A spanning group can take whatever
    room the others leave, so that holds when the others fit apart."""
    if stage_groups_fit(gpus, tps, dp, bins):
        return None
    return tuple(s for s in range(len(gpus)) if stage_groups_fit(gpus, tps, dp, bins, s))


def across_comm(sent: list[float], comm: list[float], link: tuple[float, float]) -> float | None:
    """The least one hop of a pipeline adds when it goes over ``link`` (the best between two
    places, or two regions) rather than the market's best (``comm``, for activations of ``sent``
    bytes); None: the market has no such link."""
    latency, bandwidth = link
    if bandwidth <= 1e-9:
        return None
    extra = [latency + size / bandwidth - best for size, best in zip(sent, comm, strict=True)]
    return max(0.0, min(extra)) if extra else float("inf")


def hierarchical_lower_bound(links: LinkBounds, dp: int, message: float, least: float) -> float:
    """A hierarchical all-reduce over ``r >= 2`` regions: its largest region group has at least
    ``ceil(dp / r)`` members, reduced and broadcast over at best the best link, and its leaders' ring
    crosses regions with at best the smallest compressed message."""
    best_lat, best_bw = links.best
    top_lat, top_bw = links.across_regions
    fastest = float("inf")
    for r in range(2, min(dp, links.regions) + 1):
        group = -(-dp // r)
        local = 0.0
        if group > 1:
            local = 2 * (2 * (group - 1) / group * message / best_bw + group * best_lat)
        top = 2 * (r - 1) * (top_lat + least / r / top_bw)
        fastest = min(fastest, local + top)
    return fastest
