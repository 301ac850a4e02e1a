"""Predict one plan: iteration time with its breakdown, memory per GPU, and dollars.

Per pipeline (replica i of every stage), the 1F1B model of pipeline.py gives when each stage ends its
last backward, with activation and gradient transfers over the links between the stages' places
(latency + bytes / bandwidth, asynchronous). Per stage, the gradient all-reduce across its replicas
(collectives.py) starts when every replica's last backward begins producing gradients: buckets are
reduced while that backward runs, so only the part that outlasts it, or at least the last bucket,
adds time. Then the stage's optimizer step runs. The iteration ends when the last stage's step ends;
samples/s is the global batch over that time.

Dollars: each replica's GPUs at the $/GPU-hour of the cheapest fitting offer in its place, and every
byte sent across a zone, region or cloud boundary at the sender's egress price.

The planner calls this in its inner loop: work is done once per distinct replica of a stage and
once per distinct pipeline (``Plan.stage_kinds``, ``Plan.pipeline_groups``), only floats are
computed, and the breakdown people read is built when first asked for. The loops below keep what
they read in local variables and build no object the result does not need; the order of every
floating-point sum is part of the result (tests/unit/test_simulator_speed_equivalence.py).
"""

from __future__ import annotations

import operator
from collections import defaultdict
from functools import partial

from orchestrator.plan import Plan
from orchestrator.profiles.profile import ModelProfile
from orchestrator.simulator.environment import NetworkView, PriceView
from orchestrator.simulator.estimate import (
    Breakdown,
    EgressLink,
    Estimate,
    MemoryParts,
    ReplicaMemory,
    StageTime,
)
from orchestrator.simulator.gather import gatherer
from orchestrator.simulator.memory import memory_shape, memory_terms, stage_regions
from orchestrator.simulator.pipeline import joint_latency_aware_warmup, runner
from orchestrator.simulator.settings import SimulatorSettings
from orchestrator.simulator.sync import sync_coefficients, sync_common, sync_seconds

SOURCE_RANK = {"measured": 0, "imported": 1, "estimated": 2}


def simulate(
    profile: ModelProfile,
    plan: Plan,
    *,
    network: NetworkView,
    prices: PriceView,
    settings: SimulatorSettings,
) -> Estimate:
    """Predict ``plan`` for the model of ``profile``; raise UserError if the plan cannot run."""
    compute, stages, memory = _stage_entries(profile, plan, network, settings)
    egress: dict[tuple[str, str], float] = defaultdict(float)  # bytes per iteration
    pipelines = _pipelines(profile, plan, compute, network, egress, settings.blocking_p2p)
    rows, terms = _stage_rows(plan, stages, pipelines, egress, settings)
    if profile.tied_elements and len(rows) > 1:
        _tied_exchange(profile, plan, rows, pipelines, egress)
    return _estimate(profile, plan, prices, settings, rows, pipelines, egress, terms, memory)


def _stage_entries(
    profile: ModelProfile, plan: Plan, network: NetworkView, settings: SimulatorSettings
) -> tuple[list[list[tuple]], list[tuple], tuple[float, bool, frozenset]]:
    """Per stage, per kind of replica (``Plan.stage_kinds``): its entry (see ``_new_entry``); per
    stage, its slowest forward, backward and update seconds, its gradient's bytes and the
    coefficients of its all-reduce (``sync.sync_coefficients``; None without one); and the memory peak
    of any GPU, whether any runs out, and the GPUs used."""
    mbs, element = plan.microbatch_size, profile.element_bytes
    synced = plan.dp_degree > 1
    scheme = (plan.allreduce, plan.compression) if synced else None
    by_regions = synced and plan.compression != "none"  # memory depends on the regions
    table = _profile_cache(profile, "entries", settings)  # memory depends on the settings
    # an all-reduce depends on these and on its group's kinds of replica and their counts, keyed
    # by their fields (``Replica._key``: plain tuples, hashed without calling Python code)
    common = sync_common(plan, element, settings)
    sync_cache = network.sync_cache
    most, warmup = max(plan.microbatches()), plan.warmup
    compute, stages, peak, oom, gpus = [], [], 0.0, False, set()
    stage_kinds = plan.stage_kinds
    for s, stage in enumerate(plan.stages):
        kinds = stage_kinds[s]
        start, end = stage.layers
        key = (scheme, stage_regions(stage)) if by_regions else scheme
        # a stage holds its warm-up + 1 microbatches, at most as many as its pipeline runs
        flights = warmup[s] + 1 if warmup[s] + 1 < most else most
        entries, group, forward, backward, update = [], [common], 0.0, 0.0, 0.0
        for replica, count in kinds:
            entry = table.get((replica.gpu, mbs, replica.tp, start, end, key))
            if entry is None:
                entry = _new_entry(table, profile, plan, s, replica, settings, key)
            entries.append(entry)
            group.append(replica._key)
            group.append(count)
            f, b, u, _, _, fixed, per_flight, capacity, gpu, sync_bytes = entry
            forward = f if f > forward else forward
            backward = b if b > backward else backward
            update = u if u > update else update
            held = per_flight * flights
            total = fixed + (held if held > sync_bytes else sync_bytes)
            peak = total if total > peak else peak
            if total > capacity:
                oom = True
            gpus.add(gpu)
        compute.append(entries)
        coefficients = None
        if synced:
            group = tuple(group)
            coefficients = sync_cache.get(group)
            if coefficients is None:
                coefficients = sync_cache[group] = sync_coefficients(
                    plan, s, element, network, settings
                )
        stages.append((forward, backward, update, entries[0][4], coefficients))
    return compute, stages, (peak, oom, frozenset(gpus))


def _stage_rows(
    plan: Plan,
    stages: list[tuple],
    pipelines: list[tuple],
    egress: dict,
    settings: SimulatorSettings,
) -> tuple[list[tuple], tuple[float, float]]:
    """Per stage: forward, backward, update, send, sync, exposed sync, finish, tied-weight wait;
    and Erben et al.'s granularity terms (seconds computing and seconds communicating per iteration
    on the busiest GPU, counted without overlap: its stage's work; its all-reduce and its
    transfers). Adds the all-reduces' bytes crossing places to ``egress``."""
    last = len(stages) - 1
    overlap, bucket = settings.overlap_grad_sync, settings.bucket_bytes
    round_s = settings.dp_round_overhead_s
    most = max(plan.microbatches())
    rows, busy_s, talk_s, received = [], 0.0, 0.0, 0.0
    for s, (forward, backward, update, gradient, coefficients) in enumerate(stages):
        sync = sync_seconds(coefficients, gradient, egress)
        # all-reduce time the last backward does not hide (buckets go while it runs; the last cannot)
        exposed = sync
        if sync > 0 and overlap:
            last_bucket = sync * bucket / gradient if gradient > bucket else sync
            hidden = sync - backward
            exposed = hidden if hidden > last_bucket else last_bucket
        if coefficients is not None and round_s:  # the round's coordination, after the bytes
            sync, exposed = sync + round_s, exposed + round_s
        ready = send = 0.0
        for pipeline in pipelines:
            end = pipeline[0][s]
            ready = end if end > ready else ready
            if s < last and pipeline[4][s] > send:
                send = pipeline[4][s]
        rows.append((forward, backward, update, send, sync, exposed, ready + exposed + update, 0.0))
        work = most * (forward + backward) + update
        busy_s = work if work > busy_s else busy_s
        talk = sync + most * (received + send)
        talk_s, received = (talk if talk > talk_s else talk_s), send
    return rows, (busy_s, talk_s)


def _profile_cache(profile: ModelProfile, name: str, under: object) -> dict:
    """A cache on ``profile`` of results that also depend on ``under`` (settings, a network)."""
    entry = profile._cache.get((name, id(under)))
    if entry is None or entry[0] is not under:  # holding ``under`` keeps its id unique
        entry = profile._cache[(name, id(under))] = (under, {})
    return entry[1]


def _new_entry(
    table: dict,
    profile: ModelProfile,
    plan: Plan,
    s: int,
    replica,
    settings: SimulatorSettings,
    scheme: tuple | None,
) -> tuple[float, ...]:
    """What the planner's inner loop needs of stage ``s`` on one kind of replica, in one lookup
    keyed by (GPU, microbatch size, TP, layers, sync scheme): forward, backward and update seconds
    of one microbatch; bytes of the activation it sends on; bytes of the whole stage's gradient;
    per-GPU memory as ``fixed + max(per_flight * microbatches in flight, sync)`` (memory.py); the
    GPU's memory; its name; the sync term."""
    gpu, tp, mbs = replica.gpu, replica.tp, plan.microbatch_size
    start, end = plan.stages[s].layers
    element = profile.element_bytes
    sent = profile.stage_facts(tp, start, end)[3] * mbs * element
    gradient = profile.stage_gradient_elements(start, end, tp) * element
    fixed, per_flight, sync = memory_shape(profile, plan, s, gpu, tp, settings)
    capacity = settings.gpu_memory_bytes[gpu]
    times = profile.stage_times(gpu, mbs, tp, start, end)
    entry = (*times, sent, gradient, fixed, per_flight, capacity, gpu, sync)
    table[(gpu, mbs, tp, start, end, scheme)] = entry
    return entry


# Distinct pipelines whose timing is kept per profile and network, all forgotten at once when there
# are more: the planner simulates each placement under several sync algorithms, compressions and
# prices, and their pipelines are the same.
PIPELINE_CACHE_SIZE = 32


def _pipelines(
    profile: ModelProfile,
    plan: Plan,
    compute: list[list],
    network: NetworkView,
    egress: dict,
    blocking: bool = False,
) -> list[tuple]:
    """Per distinct pipeline (``Plan.pipeline_groups``), what ``_pipeline`` gives; adds each one's
    transfers (times its count) to ``egress``. A pipeline's timing depends on its microbatches, on
    its stages' layers and replicas, and on the plan's microbatch size, warm-up and streams: keyed
    on exactly these, it is computed once while it stays in the cache."""
    cache = _profile_cache(profile, "pipelines", network)
    micro, stages = plan.microbatches(), plan.stages
    common = (plan.microbatch_size, plan.warmup, plan.streams, blocking)
    records = []
    for i, count in plan.pipeline_groups:
        m = micro[i]
        key = [m, common]
        for stage in stages:
            key.append(stage.layers)
            key.append(stage.replicas[i]._key)
        key = tuple(key)
        record = cache.get(key)
        if record is None:
            if len(cache) >= PIPELINE_CACHE_SIZE:
                cache.clear()
            record = cache[key] = _pipeline(profile, plan, i, m, compute, network, blocking)
        moved = m * count  # microbatches crossing each link, all such pipelines
        for pair, back, size in record[5]:
            crossing = size * moved
            egress[pair] += crossing
            egress[back] += crossing
        records.append(record)
    return records


def _pipeline(
    profile: ModelProfile,
    plan: Plan,
    i: int,
    m: int,
    compute: list[list],
    network: NetworkView,
    blocking: bool = False,
) -> tuple:
    """Pipeline ``i`` of ``m`` microbatches: its stages' end times, period, index of the critical
    cycle, the cycle names, per link the time to send one activation, the links that cross places
    as ((src, dst), (dst, src), bytes of one activation); and what the exchange of a tied weight
    between its ends needs (``_tied_exchange``; None without one)."""
    gather = gatherer(len(compute))
    f, b, latency, fwd, bwd, sends, crossing = gather(
        compute, plan.kind_of, plan.stages, i, network.hop, plan.streams
    )
    if blocking:
        f, b, latency, fwd, bwd, sends = _blocking_transfers(f, b, latency, fwd, bwd)
    run, names = runner(len(f), m, plan.warmup)
    ends, period, at = run(f, b, latency, fwd, bwd, m)
    tied = None
    if profile.tied_elements and len(f) > 1:
        head, tail = plan.stages[0].replicas[i], plan.stages[-1].replicas[i]
        a, z = head.infra, tail.infra
        # the first microbatch of the next iteration reaches the last stage after its forward
        # through every stage before the last and each send on
        fill = sum(map(operator.add, f, sends))
        tied = (a, z, *network.hop(a, z, plan.streams, head.gpu, tail.gpu), fill)
    return ends, period, at, names, sends, crossing, tied


def _blocking_transfers(f, b, latency, fwd, bwd) -> tuple:
    """Stage times of a runtime whose pipeline sends and receives block both ends until the
    transfer is done (DeepSpeed's pipeline engine, which Megatron-DeepSpeed runs: SAILOR's
    measurements): each transfer is added to the operation at both ends (an activation to the
    forwards, a gradient to the backwards), and the links then carry nothing of their own."""
    f, b = list(f), list(b)
    for s in range(len(latency)):
        ahead, back = latency[s] + fwd[s], latency[s] + bwd[s]
        f[s] += ahead
        f[s + 1] += ahead
        b[s] += back
        b[s + 1] += back
    idle = (0.0,) * len(latency)
    return tuple(f), tuple(b), idle, idle, idle, idle


def latency_aware_plan_warmup(
    profile: ModelProfile, plan: Plan, network: NetworkView
) -> tuple[int, ...]:
    """Warm-ups that keep every pipeline of ``plan`` paced by its slowest stage rather than by the
    round trips of its links (one warm-up per stage that hides every pipeline's loops)."""
    mbs, element = plan.microbatch_size, profile.element_bytes
    # per stage, per kind: forward, backward, update seconds, bytes sent on (as ``_new_entry``)
    compute = [
        [
            (
                *profile.stage_times(r.gpu, mbs, r.tp, *stage.layers),
                profile.stage_facts(r.tp, *stage.layers)[3] * mbs * element,
            )
            for r, _ in kinds
        ]
        for stage, kinds in zip(plan.stages, plan.stage_kinds, strict=True)
    ]
    gather = gatherer(len(compute))
    pipelines = [
        gather(compute, plan.kind_of, plan.stages, i, network.hop, plan.streams)[:5]
        for i, _ in plan.pipeline_groups
    ]
    # one warm-up per stage for all pipelines, every pipeline's loops hidden (joint, not the largest
    # of each pipeline's own: that can shrink the difference a loop carries)
    warmup = joint_latency_aware_warmup(pipelines)
    most = max(plan.microbatches())  # no stage can run further ahead than there are microbatches
    return tuple(min(max(w, v), most) for w, v in zip(warmup, plan.warmup, strict=True))


def _tied_exchange(
    profile: ModelProfile,
    plan: Plan,
    rows: list[tuple],
    pipelines: list[tuple],
    egress: dict,
) -> None:
    """A tied embedding as the runtime keeps it (runtime/stage.py): once the last stage's gradients
    are synchronized it sends its share of the tied gradient to the first stage, which adds it before
    its optimizer step and sends the sum back; the last stage applies it at the start of the next
    iteration, before the pipeline fill reaches it. So the first stage waits for the last stage's
    share (rarely: the last stage finishes its backward first), and the iteration is at least the
    sum's return trip minus that fill."""
    size = profile.tied_elements * profile.element_bytes
    first, last = rows[0], rows[-1]
    first_ready, last_ready = first[6] - first[2], last[6] - last[2]  # before the optimizer step
    first_done, back = first_ready, 0.0
    for (_, count), pipeline in zip(plan.pipeline_groups, pipelines, strict=True):
        a, z, latency, to_last, to_first, fill = pipeline[6]
        done = last_ready + latency + size * to_first
        done = done if done > first_ready else first_ready
        first_done = done if done > first_done else first_done
        arrival = done + latency + size * to_last - fill
        back = arrival if arrival > back else back
        if a != z:
            egress[(z, a)] += size * count
            egress[(a, z)] += size * count
    rows[0] = (*first[:6], first_done + first[2], first_done - first_ready)
    # the last stage's update of its copy: the first stage's step scaled to the tied weight's size
    # (the whole stage's parameters: at TP 1, or one GPU's share times the degree where a profile
    # has no TP-1 sizes)
    tp = 1 if 1 in profile.layers else plan.stages[0].replicas[0].tp
    params = profile.stage_facts(tp, *plan.stages[0].layers)[0] * tp
    late = back + (first[2] * profile.tied_elements / params if params else 0.0)
    if late > last[6]:
        rows[-1] = (*last[:6], late, late - last[6])


def _estimate(
    profile: ModelProfile,
    plan: Plan,
    prices: PriceView,
    settings: SimulatorSettings,
    rows: list[tuple],
    pipelines: list[tuple],
    egress: dict,
    granularity_terms: tuple[float, float],
    memory: tuple[float, bool, frozenset],
) -> Estimate:
    micro = plan.microbatches()
    peak, oom, gpus = memory
    iteration = rows[0][6]  # when the last optimizer step ends
    for row in rows:
        iteration = row[6] if row[6] > iteration else iteration
    slowest = pipelines[0]  # the first of the longest
    for pipeline in pipelines:
        if pipeline[0][0] > slowest[0][0]:
            slowest = pipeline
    makespan, period, at, names = slowest[0][0], slowest[1], slowest[2], slowest[3]
    bubble = makespan - max(micro) * period
    per_hour = prices.hourly_usd(plan.stage_kinds)
    price = prices.egress_usd_per_byte
    egress_usd = sum([size * price(src, dst) for (src, dst), size in egress.items()])
    compute_s, comm_s = granularity_terms
    granularity = compute_s / comm_s if comm_s > 0 else float("inf")
    used, weakest, by_gpu = _sources_used(profile, gpus)
    samples_per_s = plan.global_batch_size / iteration

    return Estimate.of(
        {
            "iteration_time_s": iteration,
            "samples_per_s": samples_per_s,
            "tokens_per_s": samples_per_s * profile.tokens_per_sample
            if profile.tokens_per_sample
            else None,
            "microbatches": micro,
            "pipeline_s": makespan,
            "period_s": period,
            "bottleneck": names[at],
            "bubble_s": bubble if bubble > 0.0 else 0.0,
            "oom": oom,
            "peak_memory_bytes": peak,
            "cost_per_hour_usd": per_hour,
            "compute_usd_per_iteration": per_hour * iteration / 3600,
            "egress_usd_per_iteration": egress_usd,
            "granularity": granularity,
            "speedup_if_doubled": (granularity + 1) / (granularity / 2 + 1) if comm_s > 0 else 2.0,
            "global_batch_size": plan.global_batch_size,
            "profile_source": weakest,
            "profile_sources": by_gpu,
            "breakdown_fn": partial(
                _breakdown, profile, plan, prices, settings, rows, egress, used
            ),
        }
    )


def _sources_used(
    profile: ModelProfile, gpus: frozenset
) -> tuple[list[str], str, tuple[tuple[str, str], ...]]:
    """The plan's GPUs, the weakest profile source among them, and each one's source (cached per
    set of GPUs: the planner asks for the same few sets again and again)."""
    key = ("sources", gpus)
    cached = profile._cache.get(key)
    if cached is None:
        sources = profile.sources()
        used = sorted(gpus)
        weakest = max((sources[g] for g in used), key=SOURCE_RANK.__getitem__)
        cached = profile._cache[key] = (used, weakest, tuple((g, sources[g]) for g in used))
    return cached


def _breakdown(
    profile: ModelProfile,
    plan: Plan,
    prices: PriceView,
    settings: SimulatorSettings,
    rows: list[tuple],
    egress: dict,
    used: list[str],
) -> Breakdown:
    micro = plan.microbatches()
    stages = tuple(
        StageTime(
            stage=s,
            layers=stage.layers,
            forward_s=row[0],
            backward_s=row[1],
            update_s=row[2],
            send_s=row[3],
            dp_sync_s=row[4],
            dp_sync_exposed_s=row[5],
            finish_s=row[6],
            tied_wait_s=row[7],
        )
        for s, (stage, row) in enumerate(zip(plan.stages, rows, strict=True))
    )
    replicas = tuple(
        ReplicaMemory(
            stage=s,
            replica=i,
            gpu=r.gpu,
            infra=r.infra,
            tp=r.tp,
            parts=MemoryParts(*memory_terms(profile, plan, s, r.gpu, r.tp, micro[i], settings)),
            capacity_bytes=settings.capacity_bytes(r.gpu),
        )
        for s, stage in enumerate(plan.stages)
        for i, r in enumerate(stage.replicas)
    )
    links = tuple(
        EgressLink(src, dst, size, size * prices.egress_usd_per_byte(src, dst))
        for (src, dst), size in sorted(egress.items())
    )
    return Breakdown(stages, replicas, links, _notes(profile, plan, used))


def describe_bottleneck(plan: Plan, critical: str) -> str:
    """``stage 2`` -> which layers on which GPUs where; loops and links as they are."""
    if critical.startswith("stage "):
        s = int(critical.split()[1])
        stage = plan.stages[s]
        kinds = sorted({f"{r.gpu} in {r.infra}" for r in stage.replicas})
        return f"stage {s} (layers {stage.layers[0]}-{stage.layers[1] - 1}; {', '.join(kinds)})"
    if critical.startswith("loop "):
        return f"round trip of {critical} (latency limits the microbatches in flight)"
    return critical


def _notes(profile: ModelProfile, plan: Plan, used: list[str]) -> tuple[str, ...]:
    notes = []
    mbs = plan.microbatch_size
    for gpu, tp in sorted({(r.gpu, r.tp) for kinds in plan.stage_kinds for r, _ in kinds}):
        table = profile.time_table(gpu, mbs, tp)
        if table.scaled_from_mbs is not None:
            notes.append(
                f"{gpu} times at microbatch {mbs} scaled from the profiled microbatch {table.scaled_from_mbs}"
            )
    if any(profile.gpus[g].source == "estimated" for g in used):
        notes.append(
            "estimated profiles: times from FLOPs, bytes and peak figures (configs/simulator.yaml)"
        )
    return tuple(notes)
