"""Layer splits: which layers each pipeline stage runs.

Exact where it can be: when a stage count admits few splits (``C(L-1, P-1)`` up to a limit), all of
them are candidates. Otherwise the balanced split: the one that minimises the slowest stage's compute
time (forward + backward, on that stage's GPU type and TP degree), found by a binary search on that
time with a greedy fill (each stage takes as many layers as fit in the time and in its GPU's memory;
for contiguous splits with monotone costs the greedy fill succeeds whenever any split does), plus its
neighbours with each boundary moved by one layer. Uneven GPUs get uneven splits this way.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterator, Sequence

Split = tuple[int, ...]  # stage boundaries: (0, b1, ..., L)


def count_splits(layers: int, stages: int) -> int:
    return math.comb(layers - 1, stages - 1)


def all_splits(layers: int, stages: int) -> Iterator[Split]:
    for cuts in itertools.combinations(range(1, layers), stages - 1):
        yield (0, *cuts, layers)


def balanced_split(
    time_prefix: Sequence[Sequence[float]],
    memory_prefix: Sequence[Sequence[float]] | None,
    memory_cap: Sequence[float] | None,
    layers: int,
) -> Split | None:
    """The split minimising the slowest stage; ``time_prefix[s]`` is the prefix sum of per-layer
    seconds on stage ``s``'s GPU, ``memory_prefix[s]`` of per-layer bytes with ``memory_cap[s]`` the
    bytes it may hold. None when no split fits in memory."""
    low, high = 0.0, max(prefix[layers] for prefix in time_prefix)
    if _fill(time_prefix, memory_prefix, memory_cap, layers, high) is None:
        return None
    for _ in range(48):  # float bisection to ~1e-14 relative
        middle = (low + high) / 2
        if _fill(time_prefix, memory_prefix, memory_cap, layers, middle) is None:
            low = middle
        else:
            high = middle
    return _fill(time_prefix, memory_prefix, memory_cap, layers, high)


def _fill(time_prefix, memory_prefix, memory_cap, layers: int, limit: float) -> Split | None:
    """Greedy: each stage takes the most layers that fit ``limit`` seconds and its memory, leaving at
    least one layer for each later stage."""
    stages = len(time_prefix)
    bounds = [0]
    start = 0
    for s in range(stages):
        left_for_others = stages - s - 1
        last_allowed = layers - left_for_others
        if s == stages - 1:
            end = layers
            if time_prefix[s][end] - time_prefix[s][start] > limit * (1 + 1e-12):
                return None
        else:
            end = (
                bisect.bisect_right(time_prefix[s], time_prefix[s][start] + limit * (1 + 1e-12)) - 1
            )
            end = min(end, last_allowed)
            if end <= start:
                return None
        if memory_prefix is not None:
            fits = (
                bisect.bisect_right(memory_prefix[s], memory_prefix[s][start] + memory_cap[s]) - 1
            )
            if s == stages - 1 and fits < layers:
                return None
            end = min(end, fits)
            if end <= start:
                return None
        bounds.append(end)
        start = end
    return tuple(bounds) if bounds[-1] == layers else None


def neighbours(split: Split) -> Iterator[Split]:
    """The split with one inner boundary moved by one layer, each way."""
    for i in range(1, len(split) - 1):
        for step in (-1, 1):
            moved = split[i] + step
            if split[i - 1] < moved < split[i + 1]:
                yield split[:i] + (moved,) + split[i + 1 :]
