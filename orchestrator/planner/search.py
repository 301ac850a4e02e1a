"""The planner's search: best-first branch and bound over the plan space.

Three levels, each with a bound that no plan below it can beat:
1. a *config* (microbatch size, GPU type and TP degree per stage): the slowest stage is at least the
   model's compute on the fastest allowed GPU of each layer, spread evenly over the stages;
2. a *shape* (a config with a layer split): the pipeline with free links, plus the optimizer step;
3. a (shape, data-parallel degree): the same bound at that degree's microbatch count.
A priority queue pops the best bound; when it cannot beat the k-th best plan found, the search ends:
what remains cannot enter the top k. Only (shape, degree) pairs reach the simulator, once per
placement, sync algorithm, compression and pricing.

Exact where it can be (all splits, all type assignments, all placements when they are few); the
heuristics beyond the limits are in splits.py, candidates.py and placement.py, and
bench/planner_quality.py measures what they lose against exhaustive search.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from orchestrator.errors import UserError
from orchestrator.planner.candidates import (
    Evaluated,
    Evaluator,
    Shape,
    dp_degrees,
    type_assignments,
)
from orchestrator.planner.placement import placements
from orchestrator.planner.space import SearchSpace
from orchestrator.planner.splits import all_splits, balanced_split, count_splits, neighbours
from orchestrator.simulator.memory import OPTIMIZER_STATE_BYTES


@dataclass(frozen=True)
class SearchOptions:
    top_k: int = 5
    exact_splits_limit: int = 64
    exact_types_limit: int = 64
    exact_placements_limit: int = 2000
    progress: Callable[[str], None] | None = None
    progress_every_s: float = 1.0


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


class _Search:
    def __init__(self, evaluator: Evaluator, space: SearchSpace, options: SearchOptions) -> None:
        self.e, self.space, self.options = evaluator, space, options
        self.objective = evaluator.objective
        self.top: list[tuple[float, int, Evaluated]] = []  # min-heap of the k best
        self.queue: list[tuple[float, int, str, tuple]] = []
        self.counter = itertools.count()
        self.result = SearchResult(plans=[])
        self.seen: set = set()
        self.started = self.last_report = time.perf_counter()
        self.best_floor_bound = 0.0
        self._work: dict = {}

    # ---- bounds -------------------------------------------------------------------------
    def _layer_work(self, mbs: int, gpu: str, tp: int) -> list[float] | None:
        key = (mbs, gpu, tp)
        if key not in self._work:
            try:
                table = self.e.profile.time_table(gpu, mbs, tp)
                self._work[key] = [
                    f + b for f, b in zip(table.forward_s, table.backward_s, strict=True)
                ]
            except UserError:  # the profile lacks this TP degree on this GPU: not a candidate
                self._work[key] = None
        return self._work[key]

    def _value_bound(self, mbs: int, dp: int, period: float, fill: float, hourly: float) -> float:
        """Best value a plan can reach if its iteration took ``m * period + fill`` seconds."""
        m = self.space.global_batch_size // (mbs * dp)
        seconds = m * period + fill
        samples = self.space.global_batch_size / seconds
        if self.objective.goal == "max_throughput":
            return samples
        return -(hourly * dp * seconds / 3600 / self.space.global_batch_size * 1e6)

    def _hourly_per_pipeline(self, gpus, tps) -> float | None:
        """$/h of one pipeline's GPUs at the cheapest allowed prices."""
        prices = []
        for spot in self.space.spot_options:
            price = 0.0
            for g, t in zip(gpus, tps, strict=True):
                cheapest = self.e.cheapest_gpu_hour(g, t, spot)
                if cheapest is None:
                    price = None
                    break
                price += t * cheapest
            if price is not None:
                prices.append(price)
        return min(prices) if prices else None

    def _push(self, bound: float, kind: str, payload: tuple) -> None:
        if bound > self._kth():
            heapq.heappush(self.queue, (-bound, next(self.counter), kind, payload))

    def _kth(self) -> float:
        return self.top[0][0] if len(self.top) >= self.options.top_k else float("-inf")

    # ---- levels -------------------------------------------------------------------------
    def configs(self) -> None:
        space = self.space
        choices = len(space.gpu_types) * len(space.tp_degrees)
        for mbs in space.microbatch_sizes:
            for stages in range(1, space.max_stages + 1):
                exact = choices**stages <= self.options.exact_types_limit
                for gpus, tps in type_assignments(space, stages, exact):
                    self._config(mbs, gpus, tps)
        self.result.no_fit = not self.queue

    def _config(self, mbs: int, gpus: tuple[str, ...], tps: tuple[int, ...]) -> None:
        stages = len(gpus)
        works = [self._layer_work(mbs, g, t) for g, t in zip(gpus, tps, strict=True)]
        if any(w is None for w in works):
            return
        degrees = dp_degrees(self.space, Shape(mbs, gpus, tps, (0,) * (stages + 1)))
        hourly = self._hourly_per_pipeline(gpus, tps)
        if not degrees or hourly is None:
            return
        layers = self.space.num_layers
        fastest = sum(min(w[i] for w in works) for i in range(layers))
        period = max(fastest / stages, max(min(w[i] for w in works) for i in range(layers)))
        self.result.configs += 1
        best_dp = max(degrees) if self.objective.goal == "max_throughput" else min(degrees)
        ceiling = self.space.global_batch_size / (
            (self.space.global_batch_size // (mbs * max(degrees))) * period
        )
        self.best_floor_bound = max(self.best_floor_bound, ceiling)
        if self.objective.min_samples_per_s and ceiling < self.objective.min_samples_per_s:
            return
        self._push(
            self._value_bound(mbs, best_dp, period, 0.0, hourly), "config", (mbs, gpus, tps, hourly)
        )

    def _expand_config(self, mbs: int, gpus, tps, hourly: float) -> None:
        stages, layers = len(gpus), self.space.num_layers
        if count_splits(layers, stages) <= self.options.exact_splits_limit:
            splits = all_splits(layers, stages)
        else:
            balanced = self._balanced(mbs, gpus, tps)
            splits = [] if balanced is None else [balanced, *neighbours(balanced)]
        for split in splits:
            shape = Shape(mbs, gpus, tps, split)
            times = self.e.stage_times(shape)
            if times is None:
                continue
            for dp in dp_degrees(self.space, shape):
                m = self.e.microbatches(shape, dp)
                seconds = self.e.time_lower_bound(shape, times, m, dp)
                bound = self._value_bound(mbs, dp, 0.0, seconds, hourly)
                self._push(bound, "dp", (shape, dp))

    def _balanced(self, mbs: int, gpus, tps):
        """The min-max split, with each stage's memory (static bytes and activations in flight)."""
        profile, stages, layers = self.e.profile, len(gpus), self.space.num_layers
        time_prefix, memory_prefix, caps = [], [], []
        element = profile.element_bytes
        static = (
            2 * element
            + OPTIMIZER_STATE_BYTES.get(profile.optimizer, 8)
            + (4 if element == 2 else 0)
        )
        settings = self.e.settings
        for s, (g, t) in enumerate(zip(gpus, tps, strict=True)):
            table = profile.time_table(g, mbs, t)
            sizes = profile.layer_table(t)
            time_prefix.append(
                _prefix([f + b for f, b in zip(table.forward_s, table.backward_s, strict=True)])
            )
            in_flight = stages - s
            memory_prefix.append(
                _prefix(
                    [
                        p * static + k * mbs * in_flight
                        for p, k in zip(sizes.params, sizes.act_kept_bytes, strict=True)
                    ]
                )
            )
            usable = settings.capacity_bytes(g) - settings.overhead_bytes(g, t)
            caps.append(usable / (1 + settings.fragmentation_fraction))
        return balanced_split(time_prefix, memory_prefix, caps, layers)

    def _evaluate(self, shape: Shape, dp: int) -> None:
        for spot in self.space.spot_options:
            for columns in placements(
                self.space, shape.gpus, shape.tps, dp, spot, self.options.exact_placements_limit
            ):
                regions = {self.e.network.region_of(p) for column in columns for p in column}
                for allreduce in self.space.allreduce:
                    if (
                        allreduce == "hierarchical"
                        and len(regions) == 1
                        and "flat" in self.space.allreduce
                    ):
                        continue  # the same as flat inside one region
                    compressions = (
                        self.space.compression
                        if allreduce == "hierarchical" and len(regions) > 1
                        else ("none",)
                    )
                    for compression in compressions:
                        key = (shape, columns, allreduce, compression, spot)
                        if key in self.seen:
                            continue
                        self.seen.add(key)
                        self._record(
                            self.e.evaluate(
                                self.e.build(shape, columns, allreduce, compression, spot)
                            )
                        )
        self._report()

    def _record(self, evaluated: Evaluated) -> None:
        s = evaluated.score
        if not s.feasible:
            self.result.violations[s.violation] += 1
            closest = self.result.closest
            if closest is None or s.value > closest.score.value:
                self.result.closest = evaluated
            return
        entry = (s.value, next(self.counter), evaluated)
        if len(self.top) < self.options.top_k:
            heapq.heappush(self.top, entry)
        elif s.value > self.top[0][0]:
            heapq.heapreplace(self.top, entry)

    def _report(self) -> None:
        now = time.perf_counter()
        if self.options.progress and now - self.last_report >= self.options.progress_every_s:
            self.last_report = now
            best = max(self.top)[2].score if self.top else None
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
        while self.queue:
            negative, _, kind, payload = heapq.heappop(self.queue)
            if -negative <= self._kth():
                break
            if kind == "config":
                self._expand_config(*payload)
            else:
                self._evaluate(*payload)
        self.result.plans = [entry[2] for entry in sorted(self.top, key=lambda e: -e[0])]
        self.result.evaluations = self.e.evaluations
        self.result.seconds = time.perf_counter() - self.started
        floor = self.objective.min_samples_per_s
        if floor and self.best_floor_bound < floor:
            self.result.unreachable_floor = self.best_floor_bound
        return self.result


def _prefix(values: list[float]) -> list[float]:
    total, out = 0.0, [0.0]
    for v in values:
        total += v
        out.append(total)
    return out


def search(
    evaluator: Evaluator, space: SearchSpace, options: SearchOptions | None = None
) -> SearchResult:
    return _Search(evaluator, space, options or SearchOptions()).run()
