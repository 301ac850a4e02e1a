"""Candidate plans: their shapes, cheap bounds, and exact evaluation by the simulator.

A *shape* fixes the microbatch size, each stage's GPU type and TP degree, and the layer split. With
a data-parallel degree and a placement (placement.py) it becomes a plan. Before any placement is
tried, a shape gets two bounds from its compute alone: the iteration can be no shorter than its
pipeline with free links plus the optimizer step, so throughput is at most ``global batch / that``;
and it can cost no less than its GPUs at the cheapest allowed price for that long. The search
(search.py) visits shapes best bound first and skips those that cannot beat what it has.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

from orchestrator.errors import UserError
from orchestrator.plan import Plan, Replica
from orchestrator.planner.links import (
    LinkBounds,
    across_comm,
    crossing_candidates,
    hierarchical_lower_bound,
)
from orchestrator.planner.objective import Objective, RiskModel, Score, score
from orchestrator.planner.pipeline_bounds import (
    first_backward_ends,
    first_stage_busy,
    pipeline_bound,
    stage_ends,
    starts_and_trips,
)
from orchestrator.planner.placement import Columns
from orchestrator.planner.space import SearchSpace
from orchestrator.planner.splits import Split
from orchestrator.profiles.profile import ModelProfile
from orchestrator.simulator import Estimate, NetworkView, PriceView, SimulatorSettings, simulate
from orchestrator.simulator.collectives import compressed_bytes
from orchestrator.simulator.core import latency_aware_plan_warmup
from orchestrator.simulator.sync import stage_sync_s


@dataclass(frozen=True)
class Shape:
    mbs: int
    gpus: tuple[str, ...]  # per stage
    tps: tuple[int, ...]  # per stage
    split: Split

    @property
    def stages(self) -> int:
        return len(self.gpus)

    def gpus_per_pipeline(self) -> dict[str, int]:
        need: dict[str, int] = {}
        for gpu, tp in zip(self.gpus, self.tps, strict=True):
            need[gpu] = need.get(gpu, 0) + tp
        return need


@dataclass
class Evaluated:
    plan: Plan
    estimate: Estimate
    score: Score


class Evaluator:
    """Everything the search needs to turn (shape, D, placement) into a scored estimate."""

    def __init__(
        self,
        space: SearchSpace,
        profile: ModelProfile,
        objective: Objective,
        *,
        network: NetworkView,
        prices: PriceView,
        settings: SimulatorSettings,
        risk: RiskModel | None,
        checkpoint_every_steps: int,
    ) -> None:
        self.space, self.profile, self.objective = space, profile, objective
        self.network, self.prices, self.settings, self.risk = network, prices, settings, risk
        self.checkpoint_every_steps = checkpoint_every_steps
        self.evaluations = 0
        self._rates = {r.infra: (r.cloud, r.preemption_rate_per_hour) for r in space.resources}
        self._replicas: dict[tuple, Replica] = {}
        self._syncs: dict[tuple, float] = {}  # (message, dp, gpu, tp) -> least all-reduce seconds
        self._crossings: dict[tuple, tuple[int, ...] | None] = {}
        self._bytes_of: tuple | None = None
        self._links: LinkBounds | None = None

    def microbatches(self, shape: Shape, dp: int) -> int:
        """The most microbatches one of ``dp`` pipelines runs: the batch's microbatches shared
        out as evenly as they go (``shares``), so the slowest pipeline's count."""
        return -(-(self.space.global_batch_size // shape.mbs) // dp)

    def stage_times(self, shape: Shape) -> list[tuple[float, float, float]] | None:
        try:
            return [
                self.profile.stage_times(g, shape.mbs, t, shape.split[s], shape.split[s + 1])
                for s, (g, t) in enumerate(zip(shape.gpus, shape.tps, strict=True))
            ]
        except UserError:  # the profile has no times at this TP degree on this GPU
            return None

    def time_lower_bounds(
        self,
        shape: Shape,
        times: list[tuple[float, float, float]],
        degrees: list[int],
        *,
        in_flight: float = float("inf"),
    ) -> list[float]:
        """Iteration time at each of ``degrees`` if every link were the market's best: a lower
        bound for any placement, warm-up and sync algorithm. Stage ``s`` cannot start before the
        first microbatch's forwards and transfers reach it; it must run ``m`` forwards and
        backwards; its last backward waits for the next stage's, and for the last microbatch to go
        from its ``m``-th forward down the pipeline and back. Then comes the all-reduce no overlap
        hides, and the step.

        ``in_flight``: the most microbatches the first stage's memory holds at once. Its warm-up
        keeps at most that many (standard 1F1B: as many as there are stages) in flight, so while
        the first microbatch goes down the pipeline and back it can run only that many forwards
        less one, and while the last does, that many backwards less one: the pipeline's fill
        and drain, which a first stage that could keep every microbatch in flight would hide."""
        latency, bandwidth = self.links().best
        stages = shape.stages
        sent, messages = self._stage_bytes(shape)
        hold = [size / bandwidth for size in sent]  # a channel's occupancy per transfer
        comm = [latency + t for t in hold]
        # start: when the first forward reaches a stage; downstream: the round trip below it
        start, downstream = starts_and_trips(times, comm, comm)
        # When the D pipelines cannot all fit in one place (one region), some pipeline crosses
        # places (regions) or some stage's replicas do: were every pipeline and every stage's
        # replicas in one place, all would be in the same place. The least a crossing hop adds to
        # the first stage's round trip, and each stage's all-reduce over a link between places
        # (regions), bound those two cases; the tighter of the two levels holds.
        need = shape.gpus_per_pipeline()
        links = self.links()
        levels = [
            (most, link, across_comm(sent, comm, link), bins)
            for most, link, bins in (
                (links.most_in_one_place, links.across_places, links.place_capacities),
                (links.most_in_one_region, links.across_regions, links.region_capacities),
            )
        ]
        tied = self._tied_bound(shape, times, latency, bandwidth)
        # with at least as many microbatches as stages (the usual case) the first backwards do
        # not depend on how many
        many = first_backward_ends(times, stages, start, comm, hold)
        out = []
        for dp in degrees:
            m = self.microbatches(shape, dp)
            # where the stages' groups cannot each keep to one place (region), some group spans
            # two whatever the pipelines do: its all-reduce crossing binds alone
            crossing = [
                (link, extra, self._crossing_candidates(shape, dp, bins, level))
                for level, (most, link, extra, bins) in enumerate(levels)
                if extra is not None and any(dp * n > most.get(g, 0) for g, n in need.items())
            ]
            worst = 0.0
            crossing_sync = [[] for _ in crossing]  # case (b): per stage, were it to cross
            first_back = many if m >= stages else first_backward_ends(times, m, start, comm, hold)
            ends = stage_ends(times, m, start, downstream, comm, first_back)
            for s in range(stages - 1, -1, -1):
                end, (_, b, update) = ends[s], times[s]
                exposed = self.exposed_sync(messages[s], dp, shape.gpus[s], shape.tps[s], b)
                worst = max(worst, end + exposed + update)
                if tied is not None and s == stages - 1:
                    # the first stage's step waits for the last stage's share of the tied gradient
                    worst = max(worst, end + exposed + tied)
                if dp > 1:  # one pipeline has no all-reduce to cross with
                    for k, (link, _, _) in enumerate(crossing):
                        cross = self._exposed_across(messages[s], dp, b, link)
                        crossing_sync[k].append(end + max(exposed, cross) + update)
            f, b, update = times[0]
            exposed = self.exposed_sync(messages[0], dp, shape.gpus[0], shape.tps[0], b)
            busy = first_stage_busy(times, m, downstream[0], in_flight)
            worst = max(worst, busy + exposed + update)
            for k, (_, extra, alone) in enumerate(crossing):
                round_trip = m * f + downstream[0] + 2 * extra + b + exposed + update
                syncs = crossing_sync[k][::-1]  # stage order
                if not syncs:
                    worst = max(worst, round_trip)
                elif alone is None:  # every stage's group may keep to one bin
                    worst = max(worst, min(round_trip, min(syncs)))
                else:
                    # some group spans two bins: one of those that may alone (the others then
                    # fitting apart), or two or more, the slower of which takes at least the
                    # second least
                    two = sorted(syncs)[1] if len(syncs) > 1 else float("inf")
                    worst = max(worst, min([two] + [syncs[s] for s in alone]))
            out.append(worst)
        return out

    def plan_time_bound(
        self,
        shape: Shape,
        times: list[tuple[float, float, float]],
        plan: Plan,
        *,
        in_flight: float = float("inf"),
    ) -> float:
        """A lower bound on the iteration time of ``plan`` (a placement of ``shape``) under any
        warm-up: ``time_lower_bounds``' terms with this placement's own links (each pipeline's
        hops, the pipeline ends' link for a tied weight) and each stage's own all-reduce, as the
        simulator computes them. Cheap beside a simulation, and within a few percent of it where
        the pipelines are paced by their slowest stage: the search simulates a placement only
        when this bound can still enter the best plans."""
        profile, network, settings = self.profile, self.network, self.settings
        stages = shape.stages
        sent, messages = self._stage_bytes(shape)
        exposed = []
        for s in range(stages):
            sync = stage_sync_s(profile, plan, s, network=network, settings=settings)
            exposed.append(self._exposed(sync, messages[s], times[s][1]) if sync > 0 else 0.0)
        tied_bytes = profile.tied_elements * profile.element_bytes if stages > 1 else 0.0
        micro = plan.microbatches()
        worst = 0.0
        for i, _ in plan.pipeline_groups:
            row = [stage.replicas[i] for stage in plan.stages]
            hops = [
                network.hop(a.infra, b.infra, plan.streams, a.gpu, b.gpu)
                for a, b in zip(row, row[1:], strict=False)
            ]
            hold = (
                [size * x for (_, x, _), size in zip(hops, sent, strict=True)],
                [size * y for (_, _, y), size in zip(hops, sent, strict=True)],
            )
            ahead = [hop[0] + t for hop, t in zip(hops, hold[0], strict=True)]
            back = [hop[0] + t for hop, t in zip(hops, hold[1], strict=True)]
            tied = None
            if tied_bytes:
                head, tail = row[0], row[-1]
                lat, _, to_first = network.hop(
                    head.infra, tail.infra, plan.streams, head.gpu, tail.gpu
                )
                tied = lat + tied_bytes * to_first + times[0][2]
            bound = pipeline_bound(times, micro[i], ahead, back, hold, exposed, tied, in_flight)
            worst = max(worst, bound)
        return worst

    def _stage_bytes(self, shape: Shape) -> tuple[list[float], list[float]]:
        """Bytes of one activation from each stage to the next, and of each stage's gradient
        (a shape's placements are bounded one after the other: kept for the last shape)."""
        if self._bytes_of is None or self._bytes_of[0] != shape:
            profile, split, tps = self.profile, shape.split, shape.tps
            element = profile.element_bytes
            sent = [
                profile.stage_facts(tps[s], split[s], split[s + 1])[3] * shape.mbs * element
                for s in range(shape.stages - 1)
            ]
            messages = [
                profile.stage_gradient_elements(split[s], split[s + 1], tps[s]) * element
                for s in range(shape.stages)
            ]
            self._bytes_of = (shape, sent, messages)
        return self._bytes_of[1], self._bytes_of[2]

    def _crossing_candidates(
        self, shape: Shape, dp: int, bins: dict[str, tuple[int, ...]], level: int
    ) -> tuple[int, ...] | None:
        """``links.crossing_candidates``, cached: splits and shapes of one config ask it again."""
        key = (shape.gpus, shape.tps, dp, level)
        found = self._crossings.get(key, False)
        if found is False:
            found = self._crossings[key] = crossing_candidates(shape.gpus, shape.tps, dp, bins)
        return found

    def _tied_bound(self, shape: Shape, times, latency: float, bandwidth: float):
        """For a tied weight split over the first and last stages (simulator's
        ``_tied_exchange``): from the last stage's synchronized gradients, the least until the
        first stage's step ends (its share over the best link, then the first stage's step);
        None without a tied weight between two stages. (The sum's return trip is not bounded:
        it overlaps the next fill, which slower links lengthen too.)"""
        profile = self.profile
        if not profile.tied_elements or shape.stages < 2:
            return None
        return latency + profile.tied_elements * profile.element_bytes / bandwidth + times[0][2]

    def _exposed_across(
        self, message: float, dp: int, backward_s: float, link: tuple[float, float]
    ) -> float:
        """The least all-reduce time left after a stage's last backward when its ``dp`` replicas
        span places (regions), ``link`` the best between two: a flat ring has such a link among
        its links; a hierarchical one's leaders cross at least once with the smallest compressed
        message (both at least 2 latencies and the message once over the link)."""
        key = ("across", message, dp, link)
        sync = self._syncs.get(key)
        if sync is None:
            latency, bandwidth = link
            options = []
            if "flat" in self.space.allreduce:
                options.append(2 * (dp - 1) * (latency + message / dp / bandwidth))
            if "hierarchical" in self.space.allreduce:
                element = self.profile.element_bytes
                least = min(compressed_bytes(message, element, c) for c in self.space.compression)
                links = self.links()
                if link == links.across_regions and links.regions > 1:
                    # across regions: also its in-region phases, over the largest region's part
                    options.append(hierarchical_lower_bound(links, dp, message, least))
                else:
                    options.append(2 * latency + least / bandwidth)
            sync = self._syncs[key] = min(options) if options else 0.0
        return self._exposed(sync, message, backward_s)

    def exposed_sync(self, message: float, dp: int, gpu: str, tp: int, backward_s: float) -> float:
        """The least all-reduce time left after the stage's last backward."""
        if dp < 2:
            return 0.0
        key = (message, dp, gpu, tp)  # stages recur across splits and shapes
        sync = self._syncs.get(key)
        if sync is None:
            sync = self._syncs[key] = self.allreduce_lower_bound(message, dp, [(gpu, tp)])
        return self._exposed(sync, message, backward_s)

    def _exposed(self, sync: float, message: float, backward_s: float) -> float:
        """What an all-reduce of ``sync`` seconds leaves after the last backward: with overlap,
        at least its last bucket, and at least what the backward could not hide; then the
        round's fixed cost, which nothing hides (the simulator's ``_stage_rows``)."""
        round_s = self.settings.dp_round_overhead_s
        if not self.settings.overlap_grad_sync:
            return sync + round_s
        bucket = self.settings.bucket_bytes
        last_bucket = sync * bucket / message if message > bucket else sync
        return max(last_bucket, sync - backward_s) + round_s

    def allreduce_lower_bound(self, message: float, dp: int, pairs) -> float:
        """The least time of an all-reduce of ``message`` bytes over ``dp`` replicas of one of
        ``pairs`` (GPU type, TP degree), for any placement."""
        if dp < 2:
            return 0.0
        links = self.links()
        # a flat ring (or a hierarchy inside one region) over dp replicas; when they do not fit in
        # one place the ring crosses places, and its slowest link is at best the best such link
        # between two nodes of the stage's GPU type
        fits = any(dp * t <= links.most_in_one_place.get(g, 0) for g, t in pairs)
        best, across = links.for_gpus({g for g, _ in pairs})
        latency, bandwidth = best if fits else across
        sync = 2 * (dp - 1) * (latency + message / dp / bandwidth)
        if "hierarchical" in self.space.allreduce and links.regions > 1:
            element = self.profile.element_bytes
            least = min(compressed_bytes(message, element, c) for c in self.space.compression)
            sync = min(sync, hierarchical_lower_bound(links, dp, message, least))
        return sync

    def links(self) -> LinkBounds:
        if self._links is None:
            self._links = LinkBounds.of(self.space, self.network)
        return self._links

    def cheapest_gpu_hour(self, gpu: str, tp: int, spot: bool) -> float | None:
        prices = []
        for resource in self.space.places(gpu, tp, spot):
            try:
                prices.append(self.prices.gpu_hour_usd(gpu, resource.infra, spot=spot, tp=tp))
            except UserError:
                continue
        return min(prices) if prices else None

    def replica(self, gpu: str, tp: int, infra: str, spot: bool) -> Replica:
        key = (gpu, tp, infra, spot)
        replica = self._replicas.get(key)
        if replica is None:
            replica = self._replicas[key] = Replica(gpu=gpu, tp=tp, infra=infra, spot=spot)
        return replica

    def build(
        self, shape: Shape, columns: Columns, allreduce: str, compression: str, spot: bool
    ) -> Plan:
        # pipeline i takes the i-th replica of every stage: count the distinct rows of places
        rows = Counter(zip(*columns, strict=True))
        stages = range(shape.stages)
        pipelines = [
            (count, [self.replica(shape.gpus[s], shape.tps[s], row[s], spot) for s in stages])
            for row, count in rows.items()
        ]
        dp = sum(count for count, _ in pipelines)
        return Plan.from_pipelines(
            global_batch_size=self.space.global_batch_size,
            microbatch_size=shape.mbs,
            layers=list(zip(shape.split, shape.split[1:], strict=False)),
            pipelines=pipelines,
            allreduce=allreduce,
            compression=compression,
            streams=self.space.streams,
            pipeline_microbatches=shares(self.space.global_batch_size // shape.mbs, dp),
        )

    def evaluate(self, plan: Plan) -> Evaluated:
        """Simulate with the latency-aware warm-up when it fits in memory, else standard 1F1B."""
        self.evaluations += 1
        estimate = simulate(
            self.profile, plan, network=self.network, prices=self.prices, settings=self.settings
        )
        if plan.num_stages > 1:
            warmup = latency_aware_plan_warmup(self.profile, plan, self.network)
            if warmup != plan.warmup:
                aware_plan = plan.with_warmup(warmup)
                aware = simulate(
                    self.profile,
                    aware_plan,
                    network=self.network,
                    prices=self.prices,
                    settings=self.settings,
                )
                if not aware.oom and aware.iteration_time_s < estimate.iteration_time_s:
                    plan, estimate = aware_plan, aware
        return self.rescore(plan, estimate)

    def rescore(self, plan: Plan, estimate: Estimate) -> Evaluated:
        """Score an estimate under this evaluator's objective (estimates do not depend on it)."""
        live = 1.0
        if self.objective.risk_aware and self.risk is not None:
            live = self.risk.live_fraction(plan, estimate, self._rates, self.checkpoint_every_steps)
        return Evaluated(plan, estimate, score(estimate, self.objective, live))


def type_assignments(
    space: SearchSpace, stages: int
) -> Iterator[tuple[tuple[str, ...], tuple[int, ...]]]:
    """Every per-stage (GPU types, TP degrees) of ``stages`` stages."""
    for combo in itertools.product(type_pairs(space), repeat=stages):
        yield tuple(c[0] for c in combo), tuple(c[1] for c in combo)


Blocks = tuple[tuple[str, int], ...]  # (GPU type, TP degree) of each block of stages, in order


def type_blocks(space: SearchSpace, stages: int) -> Iterator[Blocks]:
    """The heuristic beyond the exact limit: stages come in contiguous blocks of one GPU type each,
    types in any order, one TP degree per type (``block_sizes`` gives the stage counts)."""
    pairs = type_pairs(space)
    types = tuple(dict.fromkeys(g for g, _ in pairs))
    degrees = {g: [t for h, t in pairs if h == g] for g in types}
    for count in range(1, min(len(types), stages) + 1):
        for order in itertools.permutations(types, count):
            for tps in itertools.product(*(degrees[g] for g in order)):
                yield tuple(zip(order, tps, strict=True))


def type_pairs(space: SearchSpace) -> tuple[tuple[str, int], ...]:
    """The (GPU type, TP degree) pairs a stage may take: those some place has nodes for, under
    some allowed pricing. When none has, every pair (so that the search can say why none fits)."""
    every = tuple((g, t) for g in space.gpu_types for t in space.tp_degrees)
    hosted = tuple(
        (g, t) for g, t in every if any(space.places(g, t, spot) for spot in space.spot_options)
    )
    return hosted or every


def block_sizes(stages: int, blocks: int) -> Iterator[tuple[int, ...]]:
    """Stage counts of ``blocks`` non-empty blocks adding up to ``stages``."""
    for cuts in itertools.combinations(range(1, stages), blocks - 1):
        bounds = (0, *cuts, stages)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(blocks))


def expand_blocks(
    blocks: Blocks, sizes: tuple[int, ...]
) -> tuple[tuple[str, ...], tuple[int, ...]]:
    gpus = tuple(g for (g, _), n in zip(blocks, sizes, strict=True) for _ in range(n))
    tps = tuple(t for (_, t), n in zip(blocks, sizes, strict=True) for _ in range(n))
    return gpus, tps


def dp_degrees(
    space: SearchSpace,
    mbs: int,
    need: Mapping[str, int] | None = None,
    *,
    most_affordable: int | None = None,
    every_least: bool = False,
) -> list[int]:
    """Data-parallel degrees that fit the GPUs there are, for pipelines that each need
    ``need[gpu]`` GPUs of each type (None: one GPU of any type), and at most
    ``most_affordable`` pipelines where given (a $/h budget over one pipeline's GPUs: more
    cannot be paid for, so the degrees above the largest divisor are counted from there).
    ``every_least``: every least degree that fits, between divisors too (``between_divisors``:
    the cheapest plan over a floor may need 3 pipelines where 2 are too slow and 4 cost more).

    Every divisor of the batch's M microbatches, and above the largest divisor that fits, the
    degrees that do not divide M up to the most that fit: their pipelines run unequal shares
    (``shares``), as SAILOR's plans do where the GPUs are not a divisor's worth (20 pipelines for
    256 microbatches where 32 do not fit). Of those only the least degree for each fullest share
    is kept, ``ceil(M / m)`` pipelines for m microbatches at most: a degree that adds pipelines
    without lowering the fullest one's count is no faster (the iteration waits for that pipeline,
    and any placement of its pipelines holds the fewer ones), syncs over more replicas and costs
    more. Degrees between two divisors that both fit only with ``every_least`` (docs/planner.md)."""
    per = space.global_batch_size // mbs
    if need:
        most = min(space.capacity(g) // n for g, n in need.items())
        if space.max_gpus:
            most = min(most, space.max_gpus // sum(need.values()))
    else:
        most = sum(space.capacity(g) for g in space.gpu_types)
        if space.max_gpus:
            most = min(most, space.max_gpus)
    if most_affordable is not None:
        most = min(most, most_affordable)
    fitting = [d for d in divisors(per) if d <= most]
    above = fitting[-1] if fitting else 0
    between = [d for d in least_degrees(per) if d <= most and d not in fitting]
    fitting = (
        sorted(fitting + between)
        if every_least
        else fitting + [d for d in between if d > above][-1:]
    )
    allowed = set(space.data_parallel) if space.data_parallel else None
    return [d for d in fitting if allowed is None or d in allowed]


def between_divisors(objective) -> bool:
    """Whether a data-parallel degree between two divisors that both fit can be the best plan:
    where the run's cost is capped or minimised under a floor. Such a degree's pipelines run
    unequal shares, so it costs more per sample than the divisor below it and runs slower than
    the one above; it wins only when the divisor below misses a throughput floor (or deadline)
    that it meets for less than the one above costs, or when the one above busts a total budget
    it stays under. Elsewhere the divisor above (max throughput) or the one below (min cost) is
    at least as good, and the degrees are left out (``dp_degrees``)."""
    if objective.goal == "min_cost":
        return objective.min_samples_per_s is not None
    return objective.budget_usd is not None


@functools.lru_cache(maxsize=256)
def least_degrees(microbatches: int) -> tuple[int, ...]:
    """``ceil(M / m)`` for every m from 1 to M, in order: the least pipelines that run M
    microbatches with at most m each (O(sqrt M) distinct values, found in O(sqrt M) steps)."""
    n, root = microbatches, math.isqrt(microbatches) + 1
    large = {-(-n // m) for m in range(1, root + 1)}  # from few microbatches each
    # a small degree d is one of them when the fullest share at d needs all d pipelines
    small = {d for d in range(1, min(root, n) + 1) if -(-n // -(-n // d)) == d}
    return tuple(sorted(large | small))


def shares(microbatches: int, dp: int) -> tuple[int, ...] | None:
    """Microbatches per pipeline when ``dp`` does not divide ``microbatches``: as even as they
    go, the first pipelines one more (None when it divides: equal shares)."""
    if microbatches % dp == 0:
        return None
    low, extra = divmod(microbatches, dp)
    return (low + 1,) * extra + (low,) * (dp - extra)


@functools.lru_cache(maxsize=256)
def divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n`` in order, found in sqrt(n) steps: the degrees that split a batch of
    ``n`` microbatches evenly (a loop to ``n`` would take as long as the batch is large)."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return tuple(low + [n // d for d in reversed(low) if d * d != n])
