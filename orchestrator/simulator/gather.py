"""A pipeline's inputs from a plan, as straight-line code generated once per number of stages.

Pipeline ``i`` of a plan runs replica ``i`` of every stage. The simulator keeps, per stage and kind
of replica, an entry whose first, second and fourth items are the forward seconds, backward seconds
and bytes of the activation sent on (core.py's ``_new_entry``). What pipeline.py needs of pipeline
``i`` is: per stage, forward and backward seconds; per link from stage ``s`` to ``s + 1``, the
one-way latency, the channel occupancy each way (bytes times seconds per byte) and the time to send
one activation (latency + occupancy); and, for egress, the links whose ends are in different
places. The planner asks this for every distinct pipeline of every candidate plan; unrolled, it
costs about a quarter less than the equivalent loop (schedule.py unrolls the schedule itself).
"""

from __future__ import annotations

import functools
from collections.abc import Callable

# gather(compute, kind_of, stages, i, hop, streams) -> (forward, backward, latency, occupancy
# forward, occupancy backward, send, crossing): tuples; ``crossing`` holds, per link between two
# different places, ((src, dst), (dst, src), bytes of one activation)
Gather = Callable[..., tuple]


@functools.lru_cache(maxsize=64)
def gatherer(stages: int) -> Gather:
    """``gather`` for pipelines of ``stages`` stages: ``compute[s][kind_of[s][i]]`` is stage
    ``s``'s entry, ``stages[s].replicas[i].infra`` its place, ``hop(src, dst, streams, src_gpu, dst_gpu)`` a
    link's (latency, seconds per byte forward, seconds per byte back) between nodes of those GPUs."""
    links = range(stages - 1)
    lines = ["def gather(compute, kind_of, stages, i, hop, streams):"]
    lines += [
        f"    c{s} = compute[{s}][kind_of[{s}][i]]; r{s} = stages[{s}].replicas[i]; "
        f"p{s} = r{s}.infra; g{s} = r{s}.gpu"
        for s in range(stages)
    ]
    for s in links:
        lines.append(
            f"    z{s} = c{s}[3]; l{s}, x{s}, y{s} = hop(p{s}, p{s + 1}, streams, g{s}, g{s + 1})"
        )
        lines.append(f"    o{s} = z{s} * x{s}")
    lines.append("    crossing = ()")
    for s in links:
        pair, back = f"(p{s}, p{s + 1})", f"(p{s + 1}, p{s})"
        lines.append(f"    if p{s} != p{s + 1}: crossing += (({pair}, {back}, z{s}),)")
    columns = [
        [f"c{s}[0]" for s in range(stages)],
        [f"c{s}[1]" for s in range(stages)],
        [f"l{s}" for s in links],
        [f"o{s}" for s in links],
        [f"z{s} * y{s}" for s in links],
        [f"l{s} + o{s}" for s in links],
    ]
    tuples = ["(" + "".join(f"{item}, " for item in column) + ")" for column in columns]
    lines.append(f"    return {', '.join(tuples)}, crossing")
    namespace: dict = {}
    source = "\n".join(lines)
    exec(compile(source, f"<pipeline inputs, {stages} stages>", "exec"), namespace)  # noqa: S102
    return namespace["gather"]
