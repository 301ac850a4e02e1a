"""Where the replicas of each stage run, and how they chain into pipelines.

A placement gives, for each stage, how many of its D replicas each place hosts. Replicas are then
chained into pipelines in a fixed place order (pipeline i takes the i-th replica of every stage), so
pipelines stay inside one place wherever the counts allow. Places share capacity across stages of
the same GPU type.

Exact where it can be: when the placements number at most ``exact_limit``, all of them are
candidates. Otherwise a menu (a documented heuristic in SAILOR's spirit, measured against exhaustive
search by bench/planner_quality.py): first the placements that keep every stage's replicas inside
one region, all stages in one region or the stages before a cut in one and the rest in another (the
pipeline crosses a region boundary once, data-parallel all-reduces never do); only when none of
those fits, each stage fills places region by region in an order, spilling into the next region,
with the same two patterns of orders. Within a region, places are filled twice: largest capacity
first (fewest zones), and cheapest first (zones of a region may differ in price). A recipe's
``constraints.min_locations`` keeps only placements over at least that many places (the menu,
built to keep traffic local, may then offer none: exact enumeration covers small markets).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence

from orchestrator.planner.space import Resource, SearchSpace

Columns = tuple[tuple[str, ...], ...]  # per stage, the place of each replica, in place order


def placements(
    space: SearchSpace,
    gpus: Sequence[str],
    tps: Sequence[int],
    dp: int,
    spot: bool,
    exact_limit: int,
) -> Iterator[Columns]:
    options = [space.places(g, t, spot) for g, t in zip(gpus, tps, strict=True)]
    if any(not o for o in options):
        return
    capacity = {(r.infra, r.gpu): r.capacity for o in options for r in o}
    spread = space.min_locations
    if _count(options, dp, exact_limit) <= exact_limit:
        found = _exact(options, gpus, tps, dp, capacity, space.max_gpus)
    else:
        found = _menu(options, gpus, tps, dp, capacity, space.max_gpus, spot)
    seen = set()
    for columns in found:
        # the recipe's spread (constraints.min_locations): replicas in at least that many places
        if columns not in seen and len({p for column in columns for p in column}) >= spread:
            seen.add(columns)
            yield columns


def exact(space: SearchSpace, gpus, tps, dp: int, spot: bool, exact_limit: int) -> bool:
    """Whether ``placements`` lists every placement (rather than a menu of likely ones)."""
    options = [space.places(g, t, spot) for g, t in zip(gpus, tps, strict=True)]
    return _count(options, dp, exact_limit) <= exact_limit


def _count(options, dp: int, limit: int) -> int:
    total = 1
    for places in options:
        total *= _compositions(dp, len(places))
        if total > limit:
            return total
    return total


def _compositions(total: int, parts: int) -> int:
    from math import comb

    return comb(total + parts - 1, parts - 1)


def _split_counts(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    if parts == 1:
        yield (total,)
        return
    for first in range(total + 1):
        for rest in _split_counts(total - first, parts - 1):
            yield (first, *rest)


def _exact(options, gpus, tps, dp, capacity, max_gpus) -> Iterator[Columns]:
    used: dict[tuple[str, str], int] = {}

    def walk(s: int, chosen: list[tuple[str, ...]], gpus_used: int) -> Iterator[Columns]:
        if s == len(options):
            yield tuple(chosen)
            return
        places = options[s]
        for counts in _split_counts(dp, len(places)):
            extra = 0
            ok = True
            for r, n in zip(places, counts, strict=True):
                need = n * tps[s]
                if used.get((r.infra, gpus[s]), 0) + need > capacity[(r.infra, gpus[s])]:
                    ok = False
                    break
                extra += need
            if not ok or (max_gpus is not None and gpus_used + extra > max_gpus):
                continue
            for r, n in zip(places, counts, strict=True):
                used[(r.infra, gpus[s])] = used.get((r.infra, gpus[s]), 0) + n * tps[s]
            column = tuple(
                sorted(
                    itertools.chain.from_iterable(
                        [r.infra] * n for r, n in zip(places, counts, strict=True)
                    )
                )
            )
            yield from walk(s + 1, [*chosen, column], gpus_used + extra)
            for r, n in zip(places, counts, strict=True):
                used[(r.infra, gpus[s])] -= n * tps[s]

    yield from walk(0, [], 0)


def _orders(options) -> list[tuple[str, ...]]:
    """Region orders to try: each region first, the rest by capacity."""
    by_region: dict[str, int] = {}
    for places in options:
        for r in places:
            by_region[r.region] = by_region.get(r.region, 0) + r.capacity
    ranked = sorted(by_region, key=lambda region: (-by_region[region], region))
    return [(first, *[r for r in ranked if r != first]) for first in ranked]


def _menu(options, gpus, tps, dp, capacity, max_gpus, spot: bool) -> Iterator[Columns]:
    orders = _orders(options)
    regions = [order[0] for order in orders]
    stages = len(options)

    # inside a region, the places that can give the most first (fewer zones to span), then the
    # cheapest first (for cost objectives, and where prices differ between zones)
    def by_size(r: Resource) -> tuple:
        return (-r.capacity, r.usd_per_gpu_hour(spot), r.infra)

    def by_price(r: Resource) -> tuple:
        return (r.usd_per_gpu_hour(spot), -r.capacity, r.infra)

    found = False
    for key in (by_size, by_price):
        for per_stage in _patterns([(region,) for region in regions], stages):
            columns = _fill(options, gpus, tps, dp, capacity, max_gpus, per_stage, key, spill=False)
            if columns is not None:
                found = True
                yield columns
    if found:
        return
    for key in (by_size, by_price):
        for per_stage in _patterns(orders, stages):
            columns = _fill(options, gpus, tps, dp, capacity, max_gpus, per_stage, key, spill=True)
            if columns is not None:
                yield columns


def _patterns(orders: list[tuple[str, ...]], stages: int) -> Iterator[list[tuple[str, ...]]]:
    """One order for every stage, or one before a cut and another after it."""
    for order in orders:
        yield [order] * stages
    for cut in range(1, stages):
        for before, after in itertools.permutations(orders, 2):
            yield [before] * cut + [after] * (stages - cut)


def _fill(
    options, gpus, tps, dp, capacity, max_gpus, per_stage, key, *, spill: bool
) -> Columns | None:
    """Each stage takes replicas from its regions in order (and, if ``spill``, from any other place
    after them), places of a region in ``key`` order; None if the replicas do not fit."""
    left = dict(capacity)
    total = 0
    columns = []
    for s, places in enumerate(options):
        rank = {region: i for i, region in enumerate(per_stage[s])}
        ordered: list[Resource] = sorted(
            (r for r in places if spill or r.region in rank),
            key=lambda r: (rank.get(r.region, len(rank)), key(r)),
        )
        need, column = dp, []
        for r in ordered:
            fit = min(need, left[(r.infra, gpus[s])] // tps[s])
            if fit > 0:
                column += [r.infra] * fit
                left[(r.infra, gpus[s])] -= fit * tps[s]
                need -= fit
            if need == 0:
                break
        if need:
            return None
        total += dp * tps[s]
        columns.append(tuple(sorted(column)))
    if max_gpus is not None and total > max_gpus:
        return None
    return tuple(columns)
