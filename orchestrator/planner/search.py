"""The planner's search: best-first branch and bound over the plan space.

Three levels, each with a bound that no plan below it can beat:
1. a *config* (microbatch size, GPU type and TP degree per stage): its GPUs must hold the model's
   weights, gradients and optimizer state (the memory bound), and its iteration is no shorter than
   the model's compute with each layer on the fastest of its GPUs, packed into P stages that each
   wait for the stages ahead of them (the bubble) at the largest data-parallel degree allowed;
2. a *shape* (a config with a layer split): its pipeline over the market's best link, plus the
   optimizer step, at that degree;
3. a (shape, data-parallel degree): the same with the all-reduce over the best links there are.
Limits prune too: a $/h budget caps the degree (the GPUs alone cost that much), a throughput floor
or a total budget drops what cannot meet it even at the bound. A priority queue pops the best
bound; when it cannot beat the best plan found (by more than ``optimality_gap``), the first plan is
proven the best of the space. The search goes on, in bound order, only until it has ``top_k``
plans of distinct (config, degree) pairs, the best split and placement of each: the others listed
are good alternatives, not proven second to fifth. Only
(shape, degree) pairs reach the simulator, once per placement, sync algorithm, compression and
pricing; every simulated plan is kept as a point of the cost/throughput frontier.

Exact where it can be (all splits, all type assignments, all placements when they are few); the
heuristics beyond the limits are in splits.py, candidates.py and placement.py, and
bench/planner_quality.py measures what they lose against exhaustive search.
"""

from __future__ import annotations

import heapq
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.planner.bounds import ConfigBounds, held_share, held_work
from orchestrator.planner.candidates import (
    Blocks,
    Evaluated,
    Evaluator,
    Shape,
    block_sizes,
    dp_degrees,
    expand_blocks,
    type_assignments,
    type_blocks,
    type_pairs,
)
from orchestrator.planner.degrees import BetweenDegrees, between
from orchestrator.planner.mixed import grow, seeds
from orchestrator.planner.placement import exact, placements
from orchestrator.planner.space import SearchSpace
from orchestrator.planner.splits import all_splits, balanced_split, count_splits, neighbours
from orchestrator.planner.sync_bounds import SyncBounds


@dataclass(frozen=True)
class SearchOptions:
    top_k: int = 5
    optimality_gap: float = 0.0  # stop when nothing left can beat the best by more than this
    exact_splits_limit: int = 64
    exact_types_limit: int = 64
    exact_placements_limit: int = 2000
    # (shape, D) with D between two divisors simulated in one search (where between_divisors)
    exact_degrees_limit: int = 100
    progress: Callable[[str], None] | None = None
    progress_every_s: float = 1.0
    # grow the best plan with pipelines of other GPU types (mixed.py) where the market has more
    # than one; off, the result is the best of one GPU type per stage, proven where nothing else
    # was cut short
    mixed_stages: bool = True


@dataclass
class SearchResult:
    plans: list[Evaluated]  # feasible, best first
    evaluations: int = 0
    configs: int = 0
    seconds: float = 0.0
    violations: Counter = field(default_factory=Counter)  # limit -> simulated plans that broke it
    closest: Evaluated | None = None  # the best infeasible plan, to explain what binds
    unreachable_floor: float | None = None  # best throughput bound, when below the floor
    no_fit: bool = False  # no config fits memory or the GPUs there are
    skipped: Counter = field(default_factory=Counter)  # why configs were left out: memory, gpus
    # (too few of a type), node (TP wider than any node), budget ($/h)
    cheapest_usd_per_hour: float | None = None  # least $/h of a pipeline the $/h budget left out
    points: list[tuple[float, float, bool]] = field(default_factory=list)  # (samples/s, $/1M
    # samples, feasible) of every simulated plan: the cost/throughput frontier
    # where a limit made the search heuristic: which choices were not all tried ("splits",
    # "placements", "degrees", "type orders", "optimality gap": stopped within SearchOptions'
    # optimality_gap); empty: the best plan is proven the best of the space
    heuristics: tuple[str, ...] = ()
    # the most the bounds allow a plan the heuristics skipped to beat the best by (relative);
    # None when some skipped choice has no bound ("type orders": interleaved GPU types)
    gap: float | None = 0.0

    @property
    def proven(self) -> bool:
        return not self.heuristics


class _Search:
    def __init__(self, evaluator: Evaluator, space: SearchSpace, options: SearchOptions) -> None:
        self.e, self.space, self.options = evaluator, space, options
        self.objective = evaluator.objective
        # a cap on the run's cost (a floor under min cost, a total budget) may need a degree
        # between two divisors
        self._between = BetweenDegrees(self.objective, limit=options.exact_degrees_limit)
        self.best_value = float("-inf")  # the best feasible plan's value so far
        self.kth_value = float("-inf")  # the k-th best (shape, D)'s, once there are k
        self.kept: dict[tuple, Evaluated] = {}  # (config, D) -> its best feasible plan
        self.queue: list[tuple[float, int, str, tuple]] = []
        self.counter = itertools.count()
        self.result = SearchResult(plans=[])
        self.started = self.last_report = time.perf_counter()
        self.best_floor_bound = 0.0
        self.bounds = ConfigBounds(evaluator.profile, evaluator.settings)
        self._dp: dict = {}
        self._price: dict = {}
        self._heuristics: set[str] = set()
        self._loose = float("-inf")  # the best bound over choices a heuristic skipped
        self._bound = float("-inf")  # the bound of the item being expanded
        self._gpus_of = {g: space.capacity(g) for g in space.gpu_types}
        self.sync = SyncBounds(
            evaluator, num_layers=space.num_layers, least_tp=min(space.tp_degrees)
        )

    # ---- bounds -------------------------------------------------------------------------
    def _value(self, dp: int, seconds: float, hourly: float) -> float:
        """The value of a plan with ``dp`` pipelines at ``hourly`` $/h each, if an iteration took
        ``seconds`` (compute only: egress and preemptions only make it worse)."""
        batch = self.space.global_batch_size
        if self.objective.goal == "max_throughput":
            return batch / seconds
        return -(hourly * dp * seconds / 3600 / batch * 1e6)

    def _hourly_per_pipeline(self, gpus, tps) -> float | None:
        """$/h of one pipeline's GPUs at the cheapest allowed prices (one pricing for all)."""
        prices = []
        for spot in self.space.spot_options:
            price = 0.0
            for g, t in zip(gpus, tps, strict=True):
                cheapest = self._price_of(g, t, spot)
                if cheapest is None:
                    price = None
                    break
                price += t * cheapest
            if price is not None:
                prices.append(price)
        return min(prices) if prices else None

    def _cutoff(self) -> float:
        """Bounds at or below this cannot improve the best plan by more than the allowed gap."""
        best = self.best_value
        return best + self.options.optimality_gap * abs(best) if best > float("-inf") else best

    def _push(self, bound: float, kind: str, payload: tuple) -> None:
        if bound > self.kth_value:  # it may still be among the top k listed
            heapq.heappush(self.queue, (-bound, next(self.counter), kind, payload))

    def _done(self, bound: float) -> bool:
        """Nothing left can enter the top k, or the best is proven and there are k plans."""
        if bound <= self.kth_value:
            return True
        return bound <= self._cutoff() and len(self.kept) >= self.options.top_k

    def _within_limits(self, dp: int, seconds: float, hourly: float) -> bool:
        """False when a plan this fast and this cheap at best would still break a limit."""
        o, batch = self.objective, self.space.global_batch_size
        if o.min_samples_per_s and batch / seconds < o.min_samples_per_s:
            return False
        if o.budget_usd is not None and hourly * dp * seconds / 3600 * o.steps > o.budget_usd:
            return False
        return True

    # ---- level 0: families of configs, level 1: configs -----------------------------------
    def configs(self) -> None:
        space = self.space
        choices = len(type_pairs(space))
        for mbs in space.microbatch_sizes:
            for stages in range(1, space.max_stages + 1):
                if choices**stages <= self.options.exact_types_limit:
                    for gpus, tps in type_assignments(space, stages):
                        self._config(mbs, gpus, tps)
                    continue
                # too many assignments: GPU types in contiguous blocks along the pipeline only
                self._heuristics.add("type orders")
                for blocks in type_blocks(space, stages):
                    if len(blocks) == 1:
                        self._config(mbs, *expand_blocks(blocks, (stages,)))
                    else:
                        self._family(mbs, stages, blocks)
        self.result.no_fit = not self.queue

    def _family(self, mbs: int, stages: int, blocks: Blocks) -> None:
        """Bound every split of ``stages`` stages into ``blocks`` at once, degree by degree: each
        block has at least one stage, so at least its GPUs' price; at data-parallel degree D a
        block of GPU type g with TP t has at most ``N_g / (D t)`` stages."""
        prices = [self._pair_hour(g, t) for g, t in blocks]
        if None in prices:
            self.result.skipped["node"] += 1
            return
        hourly = sum(prices) + (stages - len(blocks)) * min(prices)
        ends = self.bounds.forced_blocks(mbs, blocks, stages)
        best, why = float("-inf"), "gpus"
        # degrees that leave each pair as many stages share one bound (the large ones, mostly)
        by_counts: dict[tuple[int, ...], list[int]] = {}
        for dp in self._degrees(mbs, ()):
            counts = tuple(self._gpus_of[g] // (dp * t) for g, t in blocks)
            by_counts.setdefault(counts, []).append(dp)
        for counts, degrees in by_counts.items():
            if min(counts) < 1 or sum(counts) < stages:
                continue
            bound = self.bounds.family_slowest(mbs, stages, dict(zip(blocks, counts, strict=True)))
            if bound is None:
                why = "memory"
                continue
            bound = (bound[0], max(bound[1], ends))
            why = ""
            found = self._best_degree(
                mbs,
                stages,
                degrees,
                hourly,
                *bound,
                pairs=frozenset(blocks),
                first=blocks[0],
                count=False,
            )
            if found is not None:
                best = max(best, found[0])
        if why:
            self.result.skipped[why] += 1
        if best > float("-inf"):
            self._push(best, "family", (mbs, stages, blocks))

    def _expand_family(self, mbs: int, stages: int, blocks: Blocks) -> None:
        for sizes in block_sizes(stages, len(blocks)):
            self._config(mbs, *expand_blocks(blocks, sizes))

    def _pair_hour(self, gpu: str, tp: int) -> float | None:
        """The least $/h of ``tp`` GPUs of ``gpu`` over the allowed pricings."""
        prices = [self._price_of(gpu, tp, spot) for spot in self.space.spot_options]
        known = [tp * p for p in prices if p is not None]
        return min(known) if known else None

    def _price_of(self, gpu: str, tp: int, spot: bool) -> float | None:
        key = (gpu, tp, spot)
        if key not in self._price:
            self._price[key] = self.e.cheapest_gpu_hour(gpu, tp, spot)
        return self._price[key]

    def _best_degree(
        self,
        mbs: int,
        stages: int,
        degrees: list[int],
        hourly: float,
        total: float,
        slowest: float,
        *,
        pairs: frozenset,
        first: tuple[str, int],
        count: bool,
        rhos: tuple[float, ...] | None = None,
    ) -> tuple[float, list[tuple[float, int]]] | None:
        """(the best value over ``degrees``, (value bound, degree) of those that may meet the
        limits) for pipelines of
        ``stages`` stages whose heavy layers take ``total`` seconds at best, whose slowest stage
        takes ``slowest`` at least and whose first stage runs on the (GPU, TP) pair ``first``;
        None if no degree may. ``rhos``: per stage, the least ratio of its pair's times to the
        fastest pair's (a config; a family's stages are not placed yet)."""
        batch = self.space.global_batch_size
        budget = self.objective.budget_usd_per_hour
        if budget is not None and degrees:  # GPUs alone cost hourly * D; egress only adds
            if hourly * min(degrees) > budget:
                self._over_budget(hourly * min(degrees))
            degrees = [d for d in degrees if hourly * d <= budget]
        if not degrees:
            return None

        fleet = self.bounds.fleet_seconds(mbs, pairs, self._gpus_of, batch)
        # the last microbatch's m-th forward on the slowest stage, then its trip down and back
        forward = self.bounds.forward_share(mbs, pairs)

        def seconds(dp: int) -> float:
            # Stage s cannot finish before the work of the stages ahead of it plus m microbatches of
            # its own; the most work P stages can hold under that limit is T * (1 - (1 - 1/m)^P),
            # less where slower stages hold it (``bounds.held_work``).
            # All GPUs there are together can do no more than their speeds allow.
            # All of that ends with the first stage's last backward (every other stage's last
            # backward comes before it); the first stage's all-reduce and step come after.
            m = -(-batch // (mbs * dp))  # the fullest pipeline's microbatches
            held = held_share(m, stages) if rhos is None else held_work(m, rhos)
            pipeline = max(
                total / held,
                m * slowest,
                total + (m - 1) * forward * slowest,
                fleet,
            )
            return max(
                pipeline + self.sync.first_stage_tail(mbs, first, dp, stages),
                self.sync.allreduce(stages, dp, pairs),
            )

        if count:
            self.best_floor_bound = max(
                self.best_floor_bound, max(batch / seconds(d) for d in degrees)
            )
        values = []
        for d in degrees:
            t = seconds(d)
            if self._within_limits(d, t, hourly):
                values.append((self._value(d, t, hourly), d))
        if not values:
            return None
        return max(values)[0], values

    def _over_budget(self, usd_per_hour: float) -> None:
        r = self.result
        r.skipped["budget"] += 1
        if r.cheapest_usd_per_hour is None or usd_per_hour < r.cheapest_usd_per_hour:
            r.cheapest_usd_per_hour = usd_per_hour

    def _config(self, mbs: int, gpus: tuple[str, ...], tps: tuple[int, ...]) -> None:
        need: dict[str, int] = {}
        for g, t in zip(gpus, tps, strict=True):
            need[g] = need.get(g, 0) + t
        hourly = self._hourly_per_pipeline(gpus, tps)
        degrees = self._degrees(mbs, tuple(sorted(need.items())), self._affordable(hourly))
        if hourly is None or not degrees:
            self.result.skipped["node" if hourly is None else "gpus"] += 1
            return
        fewest = self.space.global_batch_size // (mbs * max(degrees))  # microbatches at most D
        bound = self.bounds.slowest_stage(mbs, gpus, tps, fewest)
        if bound is None:
            self.result.skipped["memory"] += 1
            return
        bound = (bound[0], max(bound[1], self.bounds.forced_layers(mbs, gpus, tps)))
        self.result.configs += 1
        pairs = frozenset(zip(gpus, tps, strict=True))
        found = self._best_degree(
            mbs,
            len(gpus),
            degrees,
            hourly,
            *bound,
            pairs=pairs,
            first=(gpus[0], tps[0]),
            count=True,
            rhos=self.bounds.stage_rhos(mbs, gpus, tps),
        )
        if found is not None:
            value, values = found
            self._push(value, "config", (mbs, gpus, tps, hourly, values))

    def _degrees(
        self, mbs: int, need: tuple[tuple[str, int], ...], affordable: int | None = None
    ) -> list[int]:
        """Data-parallel degrees for pipelines needing ``need`` GPUs per type (none: any count),
        at most ``affordable`` of them where given."""
        key = (mbs, need, affordable)
        if key not in self._dp:
            self._dp[key] = dp_degrees(
                self.space,
                mbs,
                dict(need),
                most_affordable=affordable,
                every_least=self._between.tried,
            )
        return self._dp[key]

    def _affordable(self, hourly: float | None) -> int | None:
        """The most pipelines of ``hourly`` $/h (their GPUs alone) a $/h budget pays for, at
        least 1 (``_best_degree`` then says that one is over the budget); None: no budget."""
        budget = self.objective.budget_usd_per_hour
        if budget is None or not hourly:
            return None
        return max(1, math.floor(budget / hourly * (1 + 1e-12)))

    # ---- level 2: shapes (a config with a layer split) ----------------------------------
    def _expand_config(
        self, mbs: int, gpus, tps, hourly: float, values: list[tuple[float, int]]
    ) -> None:
        # only the degrees whose bound can still enter the top k are worth a split
        degrees = [d for v, d in values if v > self.kth_value]
        if self._between.tried and self._between.left <= 0:  # no more of those simulated
            left_out = between(self.space.global_batch_size // mbs, degrees)
            if left_out:
                self._skipped("degrees")
                degrees = [d for d in degrees if d not in left_out]
        stages, layers = len(gpus), self.space.num_layers
        if count_splits(layers, stages) <= self.options.exact_splits_limit:
            splits = all_splits(layers, stages)
        else:
            fewest = self.space.global_batch_size // (mbs * max(degrees))
            balanced = self._balanced(mbs, gpus, tps, fewest)
            splits = [] if balanced is None else [balanced, *neighbours(balanced)]
            self._skipped("splits")  # the config's bound covers the splits not tried
        for split in splits:
            shape = Shape(mbs, gpus, tps, split)
            times = self.e.stage_times(shape)
            if times is None:
                continue
            bounds = [
                (self._value(dp, seconds, hourly), dp)
                for dp, seconds in zip(
                    degrees,
                    self.e.time_lower_bounds(
                        shape,
                        times,
                        degrees,
                        in_flight=self.bounds.most_in_flight(
                            mbs, gpus[0], tps[0], split[0], split[1]
                        ),
                    ),
                    strict=True,
                )
                if self._within_limits(dp, seconds, hourly)
            ]
            if bounds:
                self._push(max(bounds)[0], "shape", (shape, bounds))

    # ---- level 3: (shape, D) ------------------------------------------------------------
    def _expand_shape(self, shape: Shape, bounds: list[tuple[float, int]]) -> None:
        # degrees between two divisors that both fit (degrees.py) are counted apart
        apart = between(self.space.global_batch_size // shape.mbs, (d for _, d in bounds))
        for value, dp in bounds:
            self._push(value, "dp", (shape, dp, dp in apart))

    def _balanced(self, mbs: int, gpus, tps, m: int):
        """The min-max split, with each stage's memory (static bytes and activations in flight)."""
        stages = len(gpus)
        time_prefix, memory_prefix, caps = [], [], []
        for s, (g, t) in enumerate(zip(gpus, tps, strict=True)):
            seconds, held, room = self.bounds.prefixes(mbs, g, t, min(stages - s, m))
            time_prefix.append(seconds)
            memory_prefix.append(held)
            caps.append(room)
        return balanced_split(time_prefix, memory_prefix, caps, self.space.num_layers)

    def _evaluate(self, shape: Shape, dp: int, apart: bool = False) -> None:
        """Simulate every placement, sync algorithm, compression and pricing of (shape, D).
        ``apart``: D lies between two divisors that fit (degrees.py): skipped where a smaller
        degree beats it, and past ``exact_degrees_limit`` of them (the bound covers the rest)."""
        if apart:
            if self._between.dominated(shape, dp, self.space.global_batch_size // shape.mbs):
                self.result.skipped["dominated degree"] += 1
                return
            if not self._between.take():
                self._skipped("degrees")
                return
        feasible = False
        times = self.e.stage_times(shape)
        in_flight = self.bounds.most_in_flight(
            shape.mbs, shape.gpus[0], shape.tps[0], shape.split[0], shape.split[1]
        )
        for spot in self.space.spot_options:
            limit = self.options.exact_placements_limit
            if not exact(self.space, shape.gpus, shape.tps, dp, spot, limit):
                self._skipped("placements")
            for columns in placements(
                self.space, shape.gpus, shape.tps, dp, spot, self.options.exact_placements_limit
            ):
                # hierarchical differs from flat only where a stage's replicas span regions
                spans = self._spans_regions(columns)
                for allreduce in self.space.allreduce:
                    if allreduce == "hierarchical" and not spans and "flat" in self.space.allreduce:
                        continue
                    compressions = (
                        self.space.compression
                        if allreduce == "hierarchical" and spans
                        else ("none",)
                    )
                    for compression in compressions:
                        plan = self.e.build(shape, columns, allreduce, compression, spot)
                        if self._placement_cannot_enter(shape, times, plan, in_flight):
                            self.result.skipped["placement bound"] += 1
                            continue
                        evaluated = self.e.evaluate(plan)
                        self._record((shape.mbs, shape.gpus, shape.tps, dp), evaluated)
                        feasible = feasible or evaluated.score.feasible
        if feasible and self._between.tried:
            self._between.met(shape, dp)
        self._report()

    def _placement_cannot_enter(self, shape: Shape, times, plan, in_flight: float) -> bool:
        """True when this placement's own bound (its links, its all-reduces) cannot beat the
        k-th best plan kept: simulating it could change nothing listed, the best included."""
        if self.kth_value == float("-inf"):
            return False
        seconds = self.e.plan_time_bound(shape, times, plan, in_flight=in_flight)
        throughput = self.objective.goal == "max_throughput"  # its value needs no price
        hourly = 0.0 if throughput else self.e.prices.hourly_usd(plan.stage_kinds)
        return self._value(1, seconds, hourly) <= self.kth_value  # the plan's whole $/h

    def _skipped(self, what: str) -> None:
        """A heuristic left some of the current item's choices untried; its bound covers them."""
        self._heuristics.add(what)
        self._loose = max(self._loose, self._bound)

    def _spans_regions(self, columns) -> bool:
        region_of = self.e.network.region_of
        return any(len({region_of(p) for p in set(column)}) > 1 for column in columns)

    def _record(self, key: tuple, evaluated: Evaluated) -> None:
        s = evaluated.score
        self.result.points.append((s.samples_per_s, s.cost_per_million_samples_usd, s.feasible))
        if not s.feasible:
            self.result.violations[s.violation] += 1
            closest = self.result.closest
            if closest is None or s.value > closest.score.value:
                self.result.closest = evaluated
            return
        self.best_value = max(self.best_value, s.value)
        kept = self.kept.get(key)
        if kept is None or s.value > kept.score.value:
            self.kept[key] = evaluated
            if len(self.kept) >= self.options.top_k:
                values = heapq.nlargest(
                    self.options.top_k, (e.score.value for e in self.kept.values())
                )
                self.kth_value = values[-1]

    def _report(self) -> None:
        now = time.perf_counter()
        if self.options.progress and now - self.last_report >= self.options.progress_every_s:
            self.last_report = now
            best = max(self.kept.values(), key=lambda e: e.score.value).score if self.kept else None
            what = (
                "none feasible yet"
                if best is None
                else f"best {best.samples_per_s:,.1f} samples/s, "
                f"${best.cost_per_million_samples_usd:,.2f}/1M samples"
            )
            self.options.progress(
                f"planning: {now - self.started:.0f} s, {self.e.evaluations:,} plans simulated, "
                f"{len(self.queue):,} candidates queued; {what}"
            )

    def run(self) -> SearchResult:
        self.configs()
        expand = {
            "family": self._expand_family,
            "config": self._expand_config,
            "shape": self._expand_shape,
            "dp": self._evaluate,
        }
        while self.queue:
            negative, _, kind, payload = heapq.heappop(self.queue)
            if self._done(-negative):
                if -negative > self.best_value > float("-inf"):  # stopped within the allowed gap
                    self._bound = -negative
                    self._skipped("optimality gap")
                break
            self._bound = -negative
            expand[kind](*payload)
        self._mixed()
        ranked = sorted(self.kept.values(), key=lambda e: -e.score.value)
        self.result.plans = ranked[: self.options.top_k]
        self.result.evaluations = self.e.evaluations
        self._gap()
        self.result.seconds = time.perf_counter() - self.started
        floor = self.objective.min_samples_per_s
        if floor and self.best_floor_bound < floor:
            self.result.unreachable_floor = self.best_floor_bound
        return self.result

    def _mixed(self) -> None:
        """With more than one GPU type, grow the best plan with pipelines of other types: a
        local search, so the result says those choices were not all tried."""
        if not self.options.mixed_stages or len(self.space.gpu_types) < 2:
            return
        self._heuristics.add("mixed stages")
        if not self.kept:
            return
        # from the best few plans of distinct configs, and the best of each stage count (a
        # shallower pipeline may take another GPU type's replicas where the best cannot)
        ranked = sorted(self.kept.values(), key=lambda e: -e.score.value)
        starts = ranked[: self.options.top_k]
        depths = {e.plan.num_stages for e in starts}
        for e in ranked:
            if e.plan.num_stages not in depths and len(starts) < 2 * self.options.top_k:
                depths.add(e.plan.num_stages)
                starts.append(e)
        if all(e.plan.num_stages > 1 for e in starts):
            starts += seeds(self.e, self.space, starts[0].plan)
        for k, start in enumerate(starts):
            for i, evaluated in enumerate(grow(self.e, self.space, start)):
                self._record(("mixed stages", k, i), evaluated)

    def _gap(self) -> None:
        r, best = self.result, self.best_value
        r.heuristics = tuple(sorted(self._heuristics))
        if self._heuristics & {"type orders", "mixed stages"}:
            r.gap = None  # interleaved GPU types and mixed stages were never bounded
        elif best > float("-inf") and self._loose > best:
            r.gap = (self._loose - best) / abs(best)
        else:
            r.gap = 0.0


def search(
    evaluator: Evaluator, space: SearchSpace, options: SearchOptions | None = None
) -> SearchResult:
    return _Search(evaluator, space, options or SearchOptions()).run()
