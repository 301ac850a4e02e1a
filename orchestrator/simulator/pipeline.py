"""Time of one pipeline under 1F1B with heterogeneous stages and links.

Stage ``s`` takes ``f[s]`` forward and ``b[s]`` backward seconds per microbatch. Between stages ``s``
and ``s+1`` a link carries activations forward and gradients back: a transfer occupies its channel
for ``bytes / bandwidth`` (``occupy_fwd[s]``, ``occupy_bwd[s]``) and arrives ``latency[s]`` after it
leaves. Transfers are asynchronous: they overlap compute, and the two directions do not block each
other. The schedule is PipeDream-flush 1F1B with a warm-up per stage (schedule.py).

``pipeline_time`` runs the exact schedule for the first ``min(m, warmup[0] + 3)`` microbatches and
extends it by the steady-state period for the rest. The period is the schedule's maximum cycle mean:
a stage's ``f + b``, a link channel's occupancy, or a loop from stage ``k`` down to ``k'`` and back,
which carries ``warmup[k] - warmup[k'] + 1`` microbatches. Under the standard warm-up that is
``k' - k + 1``: with long links, the round trip rather than the slowest stage can set the pace.
Tests compare this with a full event simulation (on realistic random pipelines, some with extra
warm-up: mean error below 0.2%, worst below 5%; tests/unit/test_pipeline.py).

``latency_aware_warmup`` gives stages in front of slow links more warm-up, so that no loop is slower
than the slowest stage: more microbatches in flight (more activation memory) hide the round trip.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

from orchestrator.simulator.schedule import (
    Warmup,
    compiled_cycles,
    compiled_pipeline,
    compiled_schedule,
    cycle_names,
    interpreted_pipeline,
    standard_warmup,
)

EXACT_EXTRA_MICROBATCHES = 2  # the exact part covers warm-up + 1 + this many microbatches


class PipelineTime(NamedTuple):
    makespan_s: float  # first forward start to last backward end
    stage_end_s: tuple[float, ...]  # when each stage finishes its last backward
    period_s: float  # steady-state time per microbatch
    critical: str  # what sets the period: "stage 2", "link 1->2 (forward)", "loop 0-3"


def _links(stages: int, latency, occupy_fwd, occupy_bwd):
    if stages > 1 and not (latency and occupy_fwd and occupy_bwd):
        zeros = (0.0,) * (stages - 1)
        return latency or zeros, occupy_fwd or zeros, occupy_bwd or zeros
    return latency, occupy_fwd, occupy_bwd


def simulate(
    f: Sequence[float],
    b: Sequence[float],
    m: int,
    latency: Sequence[float] = (),
    occupy_fwd: Sequence[float] = (),
    occupy_bwd: Sequence[float] = (),
    warmup: Warmup | None = None,
) -> tuple[float, list[float]]:
    """Run every operation; return the makespan and each stage's last-backward end time."""
    warmup = warmup or standard_warmup(len(f))
    latency, occupy_fwd, occupy_bwd = _links(len(f), latency, occupy_fwd, occupy_bwd)
    ends = compiled_schedule(len(f), m, warmup)(f, b, latency, occupy_fwd, occupy_bwd)
    return ends[0], list(ends)


def period(
    f: Sequence[float],
    b: Sequence[float],
    latency: Sequence[float] = (),
    occupy_fwd: Sequence[float] = (),
    occupy_bwd: Sequence[float] = (),
    warmup: Warmup | None = None,
) -> tuple[float, str]:
    """The steady-state time per microbatch (maximum cycle mean) and the cycle that sets it."""
    warmup = warmup or standard_warmup(len(f))
    latency, occupy_fwd, occupy_bwd = _links(len(f), latency, occupy_fwd, occupy_bwd)
    means = compiled_cycles(len(f), warmup)(f, b, latency, occupy_fwd, occupy_bwd)
    best = max(means)
    return best, cycle_names(len(f))[means.index(best)]


def pipeline_time(
    f: Sequence[float],
    b: Sequence[float],
    m: int,
    latency: Sequence[float] = (),
    occupy_fwd: Sequence[float] = (),
    occupy_bwd: Sequence[float] = (),
    warmup: Warmup | None = None,
) -> PipelineTime:
    """Makespan and stage end times of ``m`` microbatches (see the module docstring)."""
    stages = len(f)
    if warmup is None:
        warmup = standard_warmup(stages)
    if stages > 1 and not (latency and occupy_fwd and occupy_bwd):
        latency, occupy_fwd, occupy_bwd = _links(stages, latency, occupy_fwd, occupy_bwd)
    run, names = runner(stages, m, warmup)
    ends, per, at = run(f, b, latency, occupy_fwd, occupy_bwd, m)
    return PipelineTime(ends[0], ends, per, names[at])


def runner(stages: int, m: int, warmup: Warmup) -> tuple[Callable, tuple[str, ...]]:
    """The function ``run(f, b, latency, occupy_fwd, occupy_bwd, m) -> (stage end times, period,
    index of the critical cycle)`` of ``pipeline_time`` for ``stages`` stages, ``m`` microbatches
    and ``warmup``, and the cycle names that index points into: for callers that keep their own
    per-pipeline results (the simulator's inner loop)."""
    exact_m = warmup[0] + 1 + EXACT_EXTRA_MICROBATCHES
    if m < exact_m:
        exact_m = m
    key = (stages, exact_m, warmup)
    shape = _SHAPES.get(key)
    if shape is None:
        shape = _SHAPES[key] = [
            interpreted_pipeline(stages, exact_m, warmup),
            cycle_names(stages),
            0,
        ]
    elif shape[2] < COMPILE_AFTER_USES:
        shape[2] += 1
        if shape[2] == COMPILE_AFTER_USES:
            shape[0] = compiled_pipeline(stages, exact_m, warmup)
    return shape[0], shape[1]


# A shape is interpreted until it has been used this often, then compiled. Compiling costs what
# 230 (2 stages) to 700 (32 stages) runs lose by being interpreted rather than compiled (2-3x
# slower); switching near the break-even point keeps any mix of shapes within about twice the
# cost of knowing in advance which ones recur.
COMPILE_AFTER_USES = 256

# (stages, exact microbatches, warm-up) -> [function, cycle names, uses]: a cache of pure results of
# schedule.py's generators (bounded LRU caches themselves) and a use count that only decides when to
# swap the interpreted function for the compiled one, kept in one dict so that the planner's inner
# loop pays one lookup per pipeline.
_SHAPES: dict[tuple, list] = {}


def latency_aware_warmup(
    f: Sequence[float],
    b: Sequence[float],
    latency: Sequence[float] = (),
    occupy_fwd: Sequence[float] = (),
    occupy_bwd: Sequence[float] = (),
) -> Warmup:
    """The smallest warm-ups, non-increasing along the pipeline and at least the standard ones, such
    that every loop carries enough microbatches to keep pace with the slowest stage or link."""
    return joint_latency_aware_warmup([(f, b, latency, occupy_fwd, occupy_bwd)])


def joint_latency_aware_warmup(pipelines: Sequence[tuple]) -> Warmup:
    """``latency_aware_warmup`` for several pipelines of one plan that share one warm-up per stage
    (``(f, b, latency, occupy_fwd, occupy_bwd)`` each, as many stages each): every loop of every
    pipeline keeps pace with that pipeline's slowest stage or link. Taking each pipeline's own
    warm-ups and the largest per stage would not: a loop carries the difference of two stages'
    warm-ups, and the largest per stage can shrink it."""
    stages = len(pipelines[0][0])
    loops = []
    for f, b, latency, occupy_fwd, occupy_bwd in pipelines:
        latency, occupy_fwd, occupy_bwd = _links(stages, latency, occupy_fwd, occupy_bwd)
        pace = max([f[s] + b[s] for s in range(stages)] + list(occupy_fwd) + list(occupy_bwd))
        loops.append((f, b, latency, occupy_fwd, occupy_bwd, pace))
    warmup = [0] * stages
    for k in range(stages - 2, -1, -1):
        need = warmup[k + 1] + 1
        for f, b, latency, occupy_fwd, occupy_bwd, pace in loops:
            weight = f[k] + b[k]
            for k2 in range(k + 1, stages):
                weight += (
                    f[k2] + b[k2] + 2 * latency[k2 - 1] + occupy_fwd[k2 - 1] + occupy_bwd[k2 - 1]
                )
                # the loop k..k2 carries warmup[k] - warmup[k2] + 1 microbatches; it must not be
                # slower than the pipeline's pace
                need = max(need, warmup[k2] + math.ceil(weight / pace - 1e-9) - 1)
        warmup[k] = need
    return tuple(warmup)
