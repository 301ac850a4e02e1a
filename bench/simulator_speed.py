"""Simulator speed: estimates per second on a stream of distinct 4-stage, 8-replica plans.

Usage: python bench/simulator_speed.py [--plans N] [--repeat R] [--profile TOP]

Plans of OPT-350M (SAILOR's profiles) on A100 and V100 GPUs in four GCP zones, 4 stages x 8
replicas, two readings for each of two kinds of plan:
(a) one plan estimated again and again, the Plan object rebuilt each time so nothing is cached on
    it: the cost of one estimate of a 4-stage, 8-replica plan (issue 3's target, 20,000/s);
(b) a stream of distinct plans as a planner's search produces them: a random split of the 26
    layers into 4 stages, a random microbatch size (1, 2 or 4 of a global batch of 1024, so 32-128
    microbatches per pipeline); only static tables are reused (profile prefix sums, link and price
    lookups, collective costs per data-parallel group), as in the planner's inner loop, which
    also keeps one Replica object per (GPU, TP, place, spot) (planner/candidates.py), as here.
Kinds of plan: 8 identical pipelines of one GPU type in one zone; or two kinds of pipeline (GPU type
and zone) in a random proportion, in half of the plans alternating two zones from stage to stage so
that activations cross zones.

``--profile TOP``: after the readings (which it does not touch), one more pass over each kind of
plan stream under cProfile, printing the TOP functions by their own time.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.catalog import default_catalog  # noqa: E402
from orchestrator.plan import Plan, Replica, check_plan  # noqa: E402
from orchestrator.profiles import sailor_profile  # noqa: E402
from orchestrator.simulator import simulate, views_for  # noqa: E402

ZONES = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"]
TARGET_PER_S = 20_000


def make_plans(count: int, seed: int, *, mixed: bool = True) -> list[Plan]:
    """Distinct candidate plans, built the way a planner builds them (kinds of pipeline, counted).
    ``mixed``: two kinds of pipeline (GPU type, zone), half of them crossing zones; else eight
    identical pipelines of one GPU type in one zone."""
    rng = random.Random(seed)
    plans = []
    replicas: dict[tuple[str, str], Replica] = {}  # one object per kind, as the planner keeps them
    for _ in range(count):
        cuts = sorted(rng.sample(range(1, 26), 3))
        bounds = [0, *cuts, 26]
        split = rng.randint(1, 7) if mixed else 8
        cross = mixed and rng.random() < 0.5
        pipelines = []
        for count_of_kind in [c for c in (split, 8 - split) if c]:
            gpu, zone = rng.choice(["A100", "V100"]), rng.choice(ZONES)
            row = []
            for s in range(4):
                here = ZONES[(ZONES.index(zone) + 1) % len(ZONES)] if cross and s % 2 else zone
                key = (gpu, here)
                if key not in replicas:
                    replicas[key] = Replica(
                        gpu=gpu, tp=1, infra=f"gcp/us-central1/{here}", spot=True
                    )
                row.append(replicas[key])
            pipelines.append((count_of_kind, row))
        plan = Plan.from_pipelines(
            global_batch_size=1024,
            microbatch_size=rng.choice([1, 2, 4]),
            layers=list(zip(bounds, bounds[1:], strict=False)),
            pipelines=pipelines,
        )
        check_plan(plan)
        plans.append(plan)
    return plans


def rebuild(plan: Plan) -> Plan:
    """A new Plan object equal to ``plan``, built as planners build plans."""
    groups = [
        (count, [stage.replicas[first] for stage in plan.stages])
        for first, count in plan.pipeline_groups
    ]
    return Plan.from_pipelines(
        global_batch_size=plan.global_batch_size,
        microbatch_size=plan.microbatch_size,
        layers=[stage.layers for stage in plan.stages],
        pipelines=groups,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plans", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--profile", type=int, default=0, metavar="TOP", help="then profile each reading"
    )
    args = parser.parse_args()
    catalog = default_catalog()

    profile = sailor_profile("opt-350m", ["A100", "V100"], catalog)
    network, prices, sim_settings = views_for(catalog, catalog.market("gcp"))

    def rate(plans: list[Plan]) -> float:
        start = time.perf_counter()
        for plan in plans:
            simulate(profile, plan, network=network, prices=prices, settings=sim_settings)
        return len(plans) / (time.perf_counter() - start)

    def report(label: str, rates: list[float]) -> None:
        median = statistics.median(rates)
        print(
            f"{label:58s} {median:9,.0f} estimates/s median ({max(rates):,.0f} best) = "
            f"{median / TARGET_PER_S:.2f}x the {TARGET_PER_S:,}/s target"
        )

    # The four readings are taken in turn within each repeat, so that they see the same state of
    # this (noisy, shared) VM; medians over repeats.
    readings: dict[str, list[float]] = {}
    for r in range(args.repeat):
        for mixed in (False, True):
            kind = (
                "two kinds of pipeline, half crossing zones"
                if mixed
                else "one GPU type in one zone"
            )
            # (a) one plan estimated again and again, rebuilt each time the way a planner builds
            # plans (Plan.from_pipelines), so nothing is cached on the plan object
            template = make_plans(1, seed=99, mixed=mixed)[0]
            same = [rebuild(template) for _ in range(args.plans)]
            readings.setdefault(f"same plan, {kind}", []).append(rate(same))
            # (b) a stream of distinct plans, as a planner's search produces them
            distinct = make_plans(args.plans, seed=r, mixed=mixed)
            readings.setdefault(f"distinct plans, {kind}", []).append(rate(distinct))
    for label, rates in readings.items():
        report(label, rates)
    if args.profile:
        profile_readings(args.plans, args.profile, rate)


def profile_readings(count: int, top: int, rate) -> None:
    """One pass of each reading's plans under cProfile; the ``top`` functions by own time."""
    for mixed in (False, True):
        template = make_plans(1, seed=99, mixed=mixed)[0]
        streams = {
            "same plan": [rebuild(template) for _ in range(count)],
            "distinct plans": make_plans(count, seed=1000, mixed=mixed),
        }
        for label, plans in streams.items():
            profiler = cProfile.Profile()
            profiler.runcall(rate, plans)
            kind = "two kinds of pipeline" if mixed else "one GPU type in one zone"
            print(f"\n--- {label}, {kind}: {count} estimates under cProfile")
            pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


if __name__ == "__main__":
    main()
