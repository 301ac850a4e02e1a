"""Candidate plans: their shapes, cheap bounds, and exact evaluation by the simulator.

A *shape* fixes the microbatch size, each stage's GPU type and TP degree, and the layer split. With
a data-parallel degree and a placement (placement.py) it becomes a plan. Before any placement is
tried, a shape gets two bounds from its compute alone: the iteration can be no shorter than its
pipeline with free links plus the optimizer step, so throughput is at most ``global batch / that``;
and it can cost no less than its GPUs at the cheapest allowed price for that long. The search
(search.py) visits shapes best bound first and skips those that cannot beat what it has.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass

from orchestrator.errors import UserError
from orchestrator.plan import Plan, Replica
from orchestrator.planner.objective import Objective, RiskModel, Score, score
from orchestrator.planner.placement import Columns
from orchestrator.planner.space import SearchSpace
from orchestrator.planner.splits import Split
from orchestrator.profiles.profile import ModelProfile
from orchestrator.simulator import Estimate, NetworkView, PriceView, SimulatorSettings, simulate
from orchestrator.simulator.core import latency_aware_plan_warmup
from orchestrator.simulator.pipeline import pipeline_time


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
        self._best_link: tuple[float, float] | None = None

    def microbatches(self, shape: Shape, dp: int) -> int | None:
        gb = self.space.global_batch_size
        per = shape.mbs * dp
        return gb // per if gb % per == 0 else None

    def stage_times(self, shape: Shape) -> list[tuple[float, float, float]] | None:
        try:
            return [
                self.profile.stage_times(g, shape.mbs, t, shape.split[s], shape.split[s + 1])
                for s, (g, t) in enumerate(zip(shape.gpus, shape.tps, strict=True))
            ]
        except UserError:  # the profile has no times at this TP degree on this GPU
            return None

    def best_link(self) -> tuple[float, float]:
        """(lowest latency, highest bandwidth) over every pair of places, a place with itself included:
        no placement gets a better link anywhere."""
        if self._best_link is None:
            places = sorted({r.infra for r in self.space.resources})
            links = [self.network.link(a, b, self.space.streams) for a in places for b in places]
            self._best_link = (min(lat for lat, _ in links), max(bw for _, bw in links))
        return self._best_link

    def time_lower_bound(
        self, shape: Shape, times: list[tuple[float, float, float]], m: int, dp: int
    ) -> float:
        """Iteration time if every link were the market's best: a lower bound for any placement and
        sync algorithm (one ring over the best link is the fastest all-reduce there can be)."""
        latency, bandwidth = self.best_link()
        stages = shape.stages
        scale = shape.mbs * self.profile.element_bytes
        sizes = [
            self.profile.stage_facts(shape.tps[s], shape.split[s], shape.split[s + 1])[3] * scale
            for s in range(stages - 1)
        ]
        f = [t[0] for t in times]
        b = [t[1] for t in times]
        occupy = [size / bandwidth for size in sizes]
        ends = pipeline_time(f, b, m, [latency] * (stages - 1), occupy, occupy).stage_end_s
        worst = 0.0
        for s, (end, t) in enumerate(zip(ends, times, strict=True)):
            exposed = 0.0
            if dp > 1:
                message = (
                    self.profile.stage_gradient_elements(
                        shape.split[s], shape.split[s + 1], shape.tps[s]
                    )
                    * self.profile.element_bytes
                )
                sync = 2 * (dp - 1) * (latency + message / dp / bandwidth)
                exposed = sync
                if self.settings.overlap_grad_sync:
                    bucket = self.settings.bucket_bytes
                    exposed = max(
                        sync * bucket / message if message > bucket else sync, sync - t[1]
                    )
            worst = max(worst, end + exposed + t[2])
        return worst

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
        dp = len(columns[0])
        rows: dict[tuple, int] = {}
        for i in range(dp):
            key = tuple(
                self.replica(g, t, columns[s][i], spot)
                for s, (g, t) in enumerate(zip(shape.gpus, shape.tps, strict=True))
            )
            rows[key] = rows.get(key, 0) + 1
        return Plan.from_pipelines(
            global_batch_size=self.space.global_batch_size,
            microbatch_size=shape.mbs,
            layers=list(zip(shape.split, shape.split[1:], strict=False)),
            pipelines=[(count, list(row)) for row, count in rows.items()],
            allreduce=allreduce,
            compression=compression,
            streams=self.space.streams,
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
                aware_plan = dataclasses.replace(plan, pipeline_warmup=warmup)
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
    space: SearchSpace, stages: int, exact: bool
) -> Iterator[tuple[tuple[str, ...], tuple[int, ...]]]:
    """Per-stage (GPU types, TP degrees). Exact: every combination. Otherwise (documented heuristic):
    GPU types in contiguous blocks in any order, one TP degree per type."""
    types = space.gpu_types
    if exact:
        choices = [(g, t) for g in types for t in space.tp_degrees]
        for combo in itertools.product(choices, repeat=stages):
            yield tuple(c[0] for c in combo), tuple(c[1] for c in combo)
        return
    seen = set()
    for count in range(1, min(len(types), stages) + 1):
        for order in itertools.permutations(types, count):
            for sizes in _compositions(stages, count):
                gpus = tuple(g for g, n in zip(order, sizes, strict=True) for _ in range(n))
                for tps in itertools.product(space.tp_degrees, repeat=count):
                    per_type = dict(zip(order, tps, strict=True))
                    key = (gpus, tuple(per_type[g] for g in gpus))
                    if key not in seen:
                        seen.add(key)
                        yield key


def _compositions(total: int, parts: int) -> Iterator[tuple[int, ...]]:
    for cuts in itertools.combinations(range(1, total), parts - 1):
        bounds = (0, *cuts, total)
        yield tuple(bounds[i + 1] - bounds[i] for i in range(parts))


def dp_degrees(space: SearchSpace, shape: Shape) -> list[int]:
    """Data-parallel degrees that split the batch evenly and fit the GPUs there are."""
    need = shape.gpus_per_pipeline()
    most = min(space.capacity(g) // n for g, n in need.items())
    if space.max_gpus:
        most = min(most, space.max_gpus // sum(need.values()))
    per = space.global_batch_size // shape.mbs
    allowed = set(space.data_parallel) if space.data_parallel else None
    return [d for d in range(1, most + 1) if per % d == 0 and (allowed is None or d in allowed)]
