"""Lower bounds on one pipeline's 1F1B schedule (simulator/pipeline.py), from per-stage times and
per-link transfer times: what the planner's shape bound (the market's best links) and placement
bound (a placement's own links) share. Every term holds under any warm-up at least 1F1B's standard
one, which is what the simulator and the runtime run.

``times[s]`` is stage ``s``'s (forward, backward, update) seconds per microbatch; ``ahead[s]`` and
``back[s]`` the seconds an activation and a gradient take between stages ``s`` and ``s + 1``
(latency included).
"""

from __future__ import annotations

import math

Times = list[tuple[float, float, float]]


def starts_and_trips(
    times: Times, ahead: list[float], back: list[float]
) -> tuple[list[float], list[float]]:
    """Per stage: when the first microbatch's forward can reach it, and the round trip below it
    (every later stage's forward and backward and both ways of every link below)."""
    stages = len(times)
    start, downstream = [0.0] * stages, [0.0] * stages
    for s in range(1, stages):
        start[s] = start[s - 1] + times[s - 1][0] + ahead[s - 1]
    for s in range(stages - 2, -1, -1):
        f, b, _ = times[s + 1]
        downstream[s] = downstream[s + 1] + f + b + (ahead[s] + back[s])
    return start, downstream


def first_backward_ends(
    times: Times, m: int, start: list[float], back: list[float], forward_hold: list[float]
) -> list[float]:
    """Per stage, the least time its first backward ends: stage ``s`` of ``P`` runs
    ``min(m, P - s)`` forwards before its first backward, and its ``j``-th forward ends no sooner
    than ``j - 1`` of the slowest forward or forward channel above it after its first; the first
    backward then waits for the one below it to come back."""
    stages = len(times)
    pace, ends = 0.0, [0.0] * stages
    paces = []
    for s in range(stages):
        pace = max(pace, times[s][0], forward_hold[s - 1] if s else 0.0)
        paces.append(pace)
    below = 0.0
    for s in range(stages - 1, -1, -1):
        f, b, _ = times[s]
        warm = start[s] + f + (min(m, stages - s) - 1) * paces[s]
        ready = below + back[s] if s < stages - 1 else 0.0
        ends[s] = below = max(warm, ready) + b
    return ends


def stage_ends(
    times: Times,
    m: int,
    start: list[float],
    downstream: list[float],
    back: list[float],
    first_back: list[float],
    occupy: tuple[list[float], list[float]] | None = None,
) -> list[float]:
    """Per stage, the least time its last backward ends: it runs ``m`` forwards and backwards
    from its start; its last backward waits for the last microbatch's trip down and back, comes
    after its first backward's other ``m - 1``, and after the next stage's last backward. With
    ``occupy`` (each link's channel seconds per transfer, each way): a channel carries one
    transfer at a time, so the last activation leaves ``m - 1`` occupancies after the first, and
    the last gradient arrives ``m - 1`` after the first gradient."""
    stages = len(times)
    ends, previous = [0.0] * stages, 0.0
    for s in range(stages - 1, -1, -1):
        f, b, _ = times[s]
        end = max(start[s] + m * (f + b), start[s] + m * f + downstream[s] + b)
        end = max(end, first_back[s] + (m - 1) * b)
        if s < stages - 1:
            end = max(end, previous + back[s] + b)
            if occupy is not None:
                forward_hold, backward_hold = occupy
                end = max(end, start[s] + f + (m - 1) * forward_hold[s] + downstream[s] + b)
                below = times[s + 1]
                first_gradient = start[s + 1] + below[0] + downstream[s + 1] + below[1]
                end = max(end, first_gradient + (m - 1) * backward_hold[s] + back[s] + b)
        ends[s] = previous = end
    return ends


def first_stage_busy(times: Times, m: int, trip: float, in_flight: float) -> float:
    """The least time the first stage's last backward ends from its own work and its fill and
    drain: ``m`` forwards and backwards, and the idle while the first microbatch goes down the
    pipeline and back (``trip``) and while the last does, which only as many forwards (backwards)
    as its warm-up keeps in flight, less one, can fill. ``in_flight``: the most microbatches its
    memory holds (a latency-aware warm-up may keep that many; standard 1F1B as many as stages)."""
    f, b, _ = times[0]
    most = max(len(times), in_flight)
    if m > most:  # the first backward comes before the last forward: the two windows are apart
        early = math.floor(most) - 1
        fill = max(0.0, trip - early * f) + max(0.0, trip - early * b)
    else:  # at most the other m - 1 forwards, or backwards, fill either window
        fill = max(0.0, trip - (m - 1) * f, trip - (m - 1) * b)
    return m * (f + b) + fill


def pipeline_bound(
    times: Times,
    m: int,
    ahead: list[float],
    back: list[float],
    occupy: tuple[list[float], list[float]],
    exposed: list[float],
    tied: float | None,
    in_flight: float,
) -> float:
    """The least iteration of one pipeline of ``m`` microbatches whose links take ``ahead`` and
    ``back`` and hold their channels ``occupy``, each stage then exposing ``exposed`` seconds of
    all-reduce and its step; ``tied``: what the first stage's step waits for after the last
    stage's synchronized gradients (a tied weight), or None."""
    start, downstream = starts_and_trips(times, ahead, back)
    first_back = first_backward_ends(times, m, start, back, occupy[0])
    ends = stage_ends(times, m, start, downstream, back, first_back, occupy)
    worst = 0.0
    for s, end in enumerate(ends):
        worst = max(worst, end + exposed[s] + times[s][2])
    if tied is not None:
        worst = max(worst, ends[-1] + exposed[-1] + tied)
    busy = first_stage_busy(times, m, downstream[0], in_flight)
    return max(worst, busy + exposed[0] + times[0][2])
