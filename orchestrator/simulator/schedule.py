"""The 1F1B schedule as data and as generated straight-line code, cached per shape.

A shape is (stages, microbatches, warm-up per stage). Stage ``s`` runs ``warmup[s]`` forwards, then
alternates one forward and one backward, then the cool-down backwards (PipeDream-flush; the
standard warm-up is ``P - s - 1``). Warm-ups must not increase along the pipeline, which keeps the
schedule free of deadlock: stage ``s`` has run the forward that stage ``s + 1`` needs before it waits
for any gradient from it.

The planner evaluates schedules for every distinct pipeline of every candidate plan. A shape met
often is turned into a Python function of the durations with the operations unrolled into
local-variable arithmetic (``compiled_schedule``, ``compiled_cycles``); compiling costs about as much
as a few dozen runs of ``interpreted_pipeline``, which walks the same operations in a loop, so
shapes met once or twice are interpreted (pipeline.py decides). Tests check both against an
independent event simulation.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

Warmup = tuple[int, ...]


@functools.lru_cache(maxsize=64)
def standard_warmup(stages: int) -> Warmup:
    return tuple(stages - s - 1 for s in range(stages))


def order(s: int, m: int, warmup: Warmup) -> list[tuple[int, int]]:
    """Stage ``s``'s operations: (1 for backward else 0, microbatch)."""
    ahead = min(warmup[s], m)
    ops = [(0, j) for j in range(ahead)]
    for j in range(m - ahead):
        ops += [(0, ahead + j), (1, j)]
    return ops + [(1, j) for j in range(m - ahead, m)]


@functools.lru_cache(maxsize=512)
def topological(stages: int, m: int, warmup: Warmup) -> tuple[tuple[int, int, int], ...]:
    """Operations as (is_backward, stage, microbatch) in an order that respects every dependency:
    start times of a reference run (f=1, b=2, free links). The dependency graph does not depend on
    durations, so one valid order serves all."""
    orders = [order(s, m, warmup) for s in range(stages)]
    f_end, b_end, start = {}, {}, {}
    position, free = [0] * stages, [0.0] * stages
    remaining = sum(len(o) for o in orders)
    while remaining:
        moved = False
        for s in range(stages):
            while position[s] < len(orders[s]):
                kind, j = orders[s][position[s]]
                if kind == 0:
                    ready = 0.0 if s == 0 else f_end.get((s - 1, j))
                else:
                    ready = f_end.get((s, j)) if s == stages - 1 else b_end.get((s + 1, j))
                if ready is None:
                    break
                begin = max(free[s], ready)
                start[(kind, s, j)] = begin
                free[s] = begin + (2.0 if kind else 1.0)
                (b_end if kind else f_end)[(s, j)] = free[s]
                position[s] += 1
                remaining -= 1
                moved = True
        assert moved, f"schedule deadlocks with warm-up {warmup}"
    return tuple(sorted(start, key=lambda op: (start[op], op[1], op[0])))


def _compile(source: list[str], name: str) -> Callable:
    namespace: dict = {}
    exec(compile("\n".join(source), name, "exec"), namespace)  # noqa: S102 - generated, see module doc
    return namespace["run"]


def _schedule_lines(stages: int, m: int, warmup: Warmup) -> list[str]:
    """The body of a function of ``f, b, lat, of, ob``: durations into locals (``f0``, ``b0``,
    ``l0``, ``o0``, ``q0``), then every operation; stage ``s`` ends at ``e{s}``."""
    last = stages - 1
    lines = [
        f"    f{s} = f[{s}]; b{s} = b[{s}]; e{s} = 0.0; cf{s} = 0.0; cb{s} = 0.0"
        for s in range(stages)
    ]
    lines += [f"    l{s} = lat[{s}]; o{s} = of[{s}]; q{s} = ob[{s}]" for s in range(last)]
    for backward, s, j in topological(stages, m, warmup):
        if backward:
            lines.append(f"    e{s} = (g{s}_{j} if g{s}_{j} > e{s} else e{s}) + b{s}")
            if s:
                lines.append(f"    cb{s} = (e{s} if e{s} > cb{s} else cb{s}) + q{s - 1}")
                lines.append(f"    g{s - 1}_{j} = cb{s} + l{s - 1}")
        else:
            ready = "0.0" if s == 0 else f"a{s}_{j}"
            lines.append(f"    e{s} = ({ready} if {ready} > e{s} else e{s}) + f{s}")
            if s < last:
                lines.append(f"    cf{s} = (e{s} if e{s} > cf{s} else cf{s}) + o{s}")
                lines.append(f"    a{s + 1}_{j} = cf{s} + l{s}")
            else:
                lines.append(
                    f"    g{s}_{j} = e{s}"
                )  # the loss: this microbatch's backward may start
    return lines


@functools.lru_cache(maxsize=256)
def compiled_schedule(stages: int, m: int, warmup: Warmup) -> Callable:
    """``run(f, b, lat, of, ob) -> stage end times``: every operation of the schedule, unrolled."""
    lines = ["def run(f, b, lat, of, ob):", *_schedule_lines(stages, m, warmup)]
    lines.append(f"    return ({', '.join(f'e{s}' for s in range(stages))},)")
    return _compile(lines, f"<1F1B schedule {stages}x{m} warm-up {warmup}>")


@functools.lru_cache(maxsize=64)
def cycle_names(stages: int) -> tuple[str, ...]:
    names = []
    for s in range(stages - 1):
        names += [f"link {s}->{s + 1} (forward)", f"link {s + 1}->{s} (backward)"]
    for k in range(stages):
        names += ["stage " + str(k) if k2 == k else f"loop {k}-{k2}" for k2 in range(k, stages)]
    return tuple(names)


@functools.lru_cache(maxsize=256)
def compiled_cycles(stages: int, warmup: Warmup) -> Callable:
    """``run(f, b, lat, of, ob) -> means`` in ``cycle_names`` order: each link channel (one transfer at
    a time), each stage, and each loop from stage k down to k2 and back, which carries
    ``warmup[k] - warmup[k2] + 1`` microbatches."""
    lines = ["def run(f, b, lat, of, ob):", "    means = []"]
    lines += [f"    means += (of[{s}], ob[{s}])" for s in range(stages - 1)]
    for k in range(stages):
        lines += [f"    w = f[{k}] + b[{k}]", "    means.append(w)"]
        for k2 in range(k + 1, stages):
            lines.append(
                f"    w += f[{k2}] + b[{k2}] + 2 * lat[{k2 - 1}] + of[{k2 - 1}] + ob[{k2 - 1}]"
            )
            lines.append(f"    means.append(w / {warmup[k] - warmup[k2] + 1})")
    lines.append("    return means")
    return _compile(lines, f"<1F1B cycles {stages} warm-up {warmup}>")


@functools.lru_cache(maxsize=256)
def compiled_pipeline(stages: int, exact_m: int, warmup: Warmup) -> Callable:
    """``run(f, b, lat, of, ob, m) -> (stage end times, period, index of the critical cycle)``: the
    cycle means of ``compiled_cycles`` (tracking their maximum), the exact schedule of ``exact_m``
    microbatches and its extension by ``m - exact_m`` periods, in one function of local variables:
    the planner's inner loop pays one call per pipeline."""
    source = ["def run(f, b, lat, of, ob, m):", *_schedule_lines(stages, exact_m, warmup)]
    source.append("    best = -1.0; at = 0")
    index = 0
    for s in range(stages - 1):
        for value in (f"o{s}", f"q{s}"):
            source += [f"    v = {value}", f"    if v > best: best = v; at = {index}"]
            index += 1
    for k in range(stages):
        source += [f"    w = f{k} + b{k}", f"    if w > best: best = w; at = {index}"]
        index += 1
        for k2 in range(k + 1, stages):
            source.append(f"    w += f{k2} + b{k2} + 2 * l{k2 - 1} + o{k2 - 1} + q{k2 - 1}")
            source += [
                f"    v = w / {warmup[k] - warmup[k2] + 1}",
                f"    if v > best: best = v; at = {index}",
            ]
            index += 1
    ends = [f"e{s}" for s in range(stages)]
    source += [
        f"    shift = (m - {exact_m}) * best",
        "    if shift:",
        f"        return ({''.join(e + ' + shift, ' for e in ends)}), best, at",
        f"    return ({''.join(e + ', ' for e in ends)}), best, at",
    ]
    assert len(cycle_names(stages)) == index
    return _compile(source, f"<1F1B pipeline {stages}x{exact_m} warm-up {warmup}>")


@functools.lru_cache(maxsize=256)
def interpreted_pipeline(stages: int, exact_m: int, warmup: Warmup) -> Callable:
    """The same function as ``compiled_pipeline``, as a loop over the operations: no compile."""
    ops = topological(stages, exact_m, warmup)
    last = stages - 1

    def run(f, b, lat, of, ob, m):
        best, at, index = -1.0, 0, 0
        for s in range(last):
            for v in (of[s], ob[s]):
                if v > best:
                    best, at = v, index
                index += 1
        for k in range(stages):
            w = f[k] + b[k]
            if w > best:
                best, at = w, index
            index += 1
            for k2 in range(k + 1, stages):
                w += f[k2] + b[k2] + 2 * lat[k2 - 1] + of[k2 - 1] + ob[k2 - 1]
                v = w / (warmup[k] - warmup[k2] + 1)
                if v > best:
                    best, at = v, index
                index += 1
        ends = [0.0] * stages
        send_f, send_b = [0.0] * stages, [0.0] * stages  # when each link channel is next free
        arrive = [[0.0] * exact_m for _ in range(stages)]  # activation j reaches stage s
        grad = [[0.0] * exact_m for _ in range(stages)]  # gradient j reaches stage s
        for backward, s, j in ops:
            end = ends[s]
            if backward:
                ready = grad[s][j]
                end = (ready if ready > end else end) + b[s]
                if s:
                    channel = send_b[s]
                    channel = (end if end > channel else channel) + ob[s - 1]
                    send_b[s] = channel
                    grad[s - 1][j] = channel + lat[s - 1]
            else:
                ready = arrive[s][j]
                end = (ready if ready > end else end) + f[s]
                if s < last:
                    channel = send_f[s]
                    channel = (end if end > channel else channel) + of[s]
                    send_f[s] = channel
                    arrive[s + 1][j] = channel + lat[s]
                else:
                    grad[s][j] = end  # the loss: this microbatch's backward may start
            ends[s] = end
        shift = (m - exact_m) * best
        if shift:
            ends = [e + shift for e in ends]
        return tuple(ends), best, at

    return run
