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
computed, and the breakdown people read is built when first asked for.
"""

from __future__ import annotations

from collections import defaultdict

from orchestrator.plan import Plan
from orchestrator.profiles.profile import ModelProfile
from orchestrator.simulator.collectives import hierarchical_allreduce, ring_allreduce
from orchestrator.simulator.environment import NetworkView, PriceView
from orchestrator.simulator.estimate import (
    Breakdown,
    EgressLink,
    Estimate,
    MemoryParts,
    ReplicaMemory,
    StageTime,
)
from orchestrator.simulator.memory import memory_shape, memory_terms, stage_regions
from orchestrator.simulator.pipeline import PipelineTime, latency_aware_warmup, pipeline_time
from orchestrator.simulator.settings import SimulatorSettings

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
    mbs, element = plan.microbatch_size, profile.element_bytes
    scheme = (plan.allreduce, plan.compression) if plan.dp_degree > 1 else None
    table = _entry_table(profile, settings)
    # per stage, per kind of replica: one entry (see ``_new_entry``)
    if scheme is not None and plan.compression != "none":  # memory depends on the regions
        keys = [(scheme, stage_regions(stage)) for stage in plan.stages]
    else:
        keys = [scheme] * plan.num_stages
    compute = [
        [
            table.get((r.gpu, mbs, r.tp, start, end, key))
            or _new_entry(table, profile, plan, s, r, settings, key)
            for r, _ in kinds
        ]
        for s, ((start, end), kinds, key) in enumerate(
            zip([stage.layers for stage in plan.stages], plan.stage_kinds, keys, strict=True)
        )
    ]
    egress: dict[tuple[str, str], float] = defaultdict(float)  # bytes per iteration
    pipelines = [
        _pipeline(profile, plan, i, compute, network, egress, count)
        for i, count in plan.pipeline_groups
    ]
    # per stage: forward, backward, update, send, sync, exposed sync, finish, tied-weight wait
    rows: list[tuple] = []
    last = plan.num_stages - 1
    overlap, bucket = settings.overlap_grad_sync, settings.bucket_bytes
    micro = plan.microbatches()
    # Erben et al.'s granularity terms: seconds computing and seconds communicating per iteration on
    # the busiest GPU, counted without overlap (its stage's work; its all-reduce and its transfers)
    most, busy_s, talk_s, received = max(micro), 0.0, 0.0, 0.0
    warmup, peak, oom, gpus = plan.warmup, 0.0, False, set()
    for s, entries in enumerate(compute):
        gradient = entries[0][4]
        sync = _sync(plan, s, gradient, element, network, egress)
        forward = backward = update = 0.0
        # a stage holds its warm-up + 1 microbatches, at most as many as its pipeline runs
        flights = warmup[s] + 1 if warmup[s] + 1 < most else most
        for t in entries:
            forward = t[0] if t[0] > forward else forward
            backward = t[1] if t[1] > backward else backward
            update = t[2] if t[2] > update else update
            held = t[6] * flights
            total = t[5] + (held if held > t[9] else t[9])
            peak = total if total > peak else peak
            if total > t[7]:
                oom = True
            gpus.add(t[8])
        # all-reduce time the last backward does not hide (buckets go while it runs; the last cannot)
        exposed = sync
        if sync > 0 and overlap:
            last_bucket = sync * bucket / gradient if gradient > bucket else sync
            exposed = max(last_bucket, sync - backward)
        ready = send = 0.0
        for timing, sends in pipelines:
            end = timing.stage_end_s[s]
            ready = end if end > ready else ready
            if s < last and sends[s] > send:
                send = sends[s]
        rows.append((forward, backward, update, send, sync, exposed, ready + exposed + update, 0.0))
        work = most * (forward + backward) + update
        busy_s = work if work > busy_s else busy_s
        talk = sync + most * (received + send)
        talk_s, received = (talk if talk > talk_s else talk_s), send
    if profile.tied_elements and last > 0:
        _tied_exchange(profile, plan, rows, compute, pipelines, network, egress)
    iteration = max(row[6] for row in rows)
    slowest = max((p for p, _ in pipelines), key=lambda p: p.makespan_s)
    return _estimate(
        profile,
        plan,
        prices,
        settings,
        rows,
        slowest,
        iteration,
        egress,
        granularity_terms=(busy_s, talk_s),
        memory=(peak, oom, frozenset(gpus)),
    )


def _entry_table(profile: ModelProfile, settings: SimulatorSettings) -> dict:
    """The profile's stage entries under ``settings`` (memory depends on them)."""
    entry = profile._cache.get(("entries", id(settings)))
    if entry is None or entry[0] is not settings:  # holding ``settings`` keeps its id unique
        entry = profile._cache[("entries", id(settings))] = (settings, {})
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


def _pipeline(
    profile: ModelProfile,
    plan: Plan,
    i: int,
    compute: list[list],
    network: NetworkView,
    egress: dict,
    count: int,
) -> tuple[PipelineTime, list[float]]:
    """Timing of pipeline ``i`` and, per link, the time to send one activation; adds its transfers
    (times ``count`` identical pipelines) to ``egress``."""
    f, b, latency, fwd, bwd = _pipeline_inputs(profile, plan, i, compute, network, egress, count)
    sends = [lat + occupy for lat, occupy in zip(latency, fwd, strict=True)]
    return pipeline_time(f, b, plan.microbatches()[i], latency, fwd, bwd, plan.warmup), sends


def _pipeline_inputs(
    profile: ModelProfile,
    plan: Plan,
    i: int,
    compute: list[list],
    network: NetworkView,
    egress: dict | None = None,
    count: int = 1,
) -> tuple[list, list, list, list, list]:
    """Per stage forward and backward seconds; per link latency and channel occupancy each way."""
    stages, kind_of = plan.stages, plan.kind_of
    f, b, latency, fwd, bwd = [], [], [], [], []
    moved = plan.microbatches()[i] * count  # microbatches crossing each link, all such pipelines
    streams, hop = plan.streams, network.hop
    previous = size = None
    for s, stage in enumerate(stages):
        replica = stage.replicas[i]
        times = compute[s][kind_of[s][i]]
        f.append(times[0])
        b.append(times[1])
        if previous is not None:
            src, dst = previous.infra, replica.infra
            lat, per_byte_f, per_byte_b = hop(src, dst, streams)
            latency.append(lat)
            fwd.append(size * per_byte_f)
            bwd.append(size * per_byte_b)
            if src != dst and egress is not None:
                egress[(src, dst)] += size * moved
                egress[(dst, src)] += size * moved
        previous, size = replica, times[3]
    return f, b, latency, fwd, bwd


def latency_aware_plan_warmup(
    profile: ModelProfile, plan: Plan, network: NetworkView
) -> tuple[int, ...]:
    """Warm-ups that keep every pipeline of ``plan`` paced by its slowest stage rather than by the
    round trips of its links (the largest any pipeline needs, stage by stage)."""
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
    warmup = list(plan.warmup)
    for i, _ in plan.pipeline_groups:
        f, b, latency, fwd, bwd = _pipeline_inputs(profile, plan, i, compute, network)
        for s, w in enumerate(latency_aware_warmup(f, b, latency, fwd, bwd)):
            warmup[s] = max(warmup[s], w)
    most = max(plan.microbatches())  # no stage can run further ahead than there are microbatches
    return tuple(min(w, most) for w in warmup)


def _sync(
    plan: Plan, s: int, message: float, element: int, network: NetworkView, egress: dict
) -> float:
    """Seconds of the stage's all-reduce. For a fixed group, time is ``a + c * bytes`` and the bytes
    crossing each boundary are proportional to the message: the coefficients are cached per group."""
    key = (plan.stage_kinds[s], plan.allreduce, plan.compression, element, plan.streams)
    coefficients = network.sync_cache.get(key)
    if coefficients is None:
        coefficients = network.sync_cache[key] = _sync_coefficients(plan, s, element, network)
    fixed, slope, per_byte = coefficients
    if message <= 0 or plan.dp_degree < 2:
        return 0.0
    for pair, share in per_byte:
        egress[pair] += share * message
    return fixed + slope * message


def _sync_coefficients(plan: Plan, s: int, element: int, network: NetworkView) -> tuple:
    places = tuple(r.infra for r in plan.stages[s].replicas)

    def link(src: str, dst: str) -> tuple[float, float]:
        return network.link(src, dst, plan.streams)

    def cost(size: float):
        if plan.allreduce == "flat":
            return ring_allreduce(places, size, link)
        return hierarchical_allreduce(
            places,
            size,
            link,
            region_of=network.region_of,
            grad_element_bytes=element,
            compression=plan.compression,
        )

    unit, double = cost(1e9), cost(2e9)
    slope = (double.time_s - unit.time_s) / 1e9
    return (
        unit.time_s - slope * 1e9,
        slope,
        tuple(((a, b), size / 1e9) for a, b, size in unit.crossing),
    )


def _tied_exchange(
    profile: ModelProfile,
    plan: Plan,
    rows: list[tuple],
    compute: list[list],
    pipelines: list,
    network: NetworkView,
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
    kind_of, stages, hop = plan.kind_of, plan.stages, network.hop
    first_done, back = first_ready, 0.0
    for (i, count), (_, sends) in zip(plan.pipeline_groups, pipelines, strict=True):
        a, z = stages[0].replicas[i].infra, stages[-1].replicas[i].infra
        latency, to_last, to_first = hop(a, z, plan.streams)
        done = max(first_ready, last_ready + latency + size * to_first)
        first_done = done if done > first_done else first_done
        # when the first microbatch of the next iteration reaches the last stage
        fill = sum(compute[s][kind_of[s][i]][0] + sends[s] for s in range(len(stages) - 1))
        arrival = done + latency + size * to_last - fill
        back = arrival if arrival > back else back
        if a != z:
            egress[(z, a)] += size * count
            egress[(a, z)] += size * count
    rows[0] = (*first[:6], first_done + first[2], first_done - first_ready)
    # the last stage's update of its copy: the first stage's step scaled to the tied weight's size
    params = profile.stage_facts(1, *stages[0].layers)[0]
    late = back + (first[2] * profile.tied_elements / params if params else 0.0)
    if late > last[6]:
        rows[-1] = (*last[:6], late, late - last[6])


def _estimate(
    profile: ModelProfile,
    plan: Plan,
    prices: PriceView,
    settings: SimulatorSettings,
    rows: list[tuple],
    slowest: PipelineTime,
    iteration: float,
    egress: dict,
    *,
    granularity_terms: tuple[float, float],
    memory: tuple[float, bool, frozenset],
) -> Estimate:
    micro = plan.microbatches()
    peak, oom, gpus = memory
    per_hour = prices.hourly_usd(plan.stage_kinds)
    price = prices.egress_usd_per_byte
    egress_usd = sum(size * price(src, dst) for (src, dst), size in egress.items())
    compute_s, comm_s = granularity_terms
    granularity = compute_s / comm_s if comm_s > 0 else float("inf")
    used, weakest, by_gpu = _sources_used(profile, gpus)
    samples_per_s = plan.global_batch_size / iteration

    def breakdown() -> Breakdown:
        return _breakdown(profile, plan, prices, settings, rows, egress, used)

    return Estimate(
        iteration_time_s=iteration,
        samples_per_s=samples_per_s,
        tokens_per_s=samples_per_s * profile.tokens_per_sample
        if profile.tokens_per_sample
        else None,
        microbatches=micro,
        pipeline_s=slowest.makespan_s,
        period_s=slowest.period_s,
        bottleneck=slowest.critical,
        bubble_s=max(0.0, slowest.makespan_s - max(micro) * slowest.period_s),
        oom=oom,
        peak_memory_bytes=peak,
        cost_per_hour_usd=per_hour,
        compute_usd_per_iteration=per_hour * iteration / 3600,
        egress_usd_per_iteration=egress_usd,
        granularity=granularity,
        speedup_if_doubled=(granularity + 1) / (granularity / 2 + 1) if comm_s > 0 else 2.0,
        global_batch_size=plan.global_batch_size,
        profile_source=weakest,
        profile_sources=by_gpu,
        breakdown_fn=breakdown,
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
