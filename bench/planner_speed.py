"""Planner speed on SAILOR's published problem sizes, with SAILOR's profiles.

Usage: python bench/planner_speed.py [--repeat R] [--only NAME] [--min-cost-floor]

Problems (SAILOR's evaluation, whose planner times on its own hardware are in brackets):
1. OPT-350M on 128 A100 in one zone;
2. GPT-Neo-2.7B on A100 + V100 in us-central1-a at 32+96, 80+240 and 128+384 GPUs [1.6 / 7.7 / 17.4 s];
3. OPT-350M on 5 GCP zones (us-central1-a, -b, -c, -f, us-west1-b) x 128 A100;
4. OPT-350M on three GPU types x 256 GPUs each (A100, V100, GH200 in one zone) [4,900 s].
Targets on this 2-core machine, one process: < 0.1 s, < 1 / < 2 / < 3 s, < 1 s, < 30 s, judged on
the median of --repeat searches in one process (a driver re-plans in a long-lived process; the first
run, which also fills the profile and schedule caches, is printed beside it).
Markets are written from the price snapshot (A100 a2-highgpu-8g, V100 n1 with 8 V100); GH200 has no
offer in the snapshot and gets an illustrative price. Objective: maximum throughput; with
--min-cost-floor, the cheapest plan over a floor of half the best rate that maximum throughput
finds (searched first, untimed), where the planner also tries degrees between two divisors.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.catalog import OFFER_COLUMNS, default_catalog  # noqa: E402
from orchestrator.planner import SearchOptions, plan_recipe  # noqa: E402
from orchestrator.recipe import parse_recipe  # noqa: E402

A100 = "a2-highgpu-8g,A100,8,96,680,29.39,8.80"
V100 = "n1-standard-64-8xV100,V100,8,64,240,22.84,7.00"
GH200 = "gh200-illustrative,GH200,1,72,480,5.00,2.00"


def market_row(zone: str, offer: str, gpus: int) -> str:
    region = zone.rsplit("-", 1)[0]
    instance, gpu, per_node, vcpus, memory, on_demand, spot = offer.split(",")
    nodes = gpus // int(per_node)
    return (
        f"gcp,{region},{zone},{instance},{gpu},{per_node},{vcpus},{memory},{on_demand},{spot},{nodes},,"
        f"bench market (prices from configs/prices/offers.csv; GH200 illustrative),2026-11-22"
    )


def problem_recipe(
    folder: Path, name: str, model: str, rows: list[str], batch: int, microbatches: str
) -> tuple:
    slug = name.replace("+", "-")  # a job name (orchestrator/names.py) and a file name
    (folder / f"{slug}.csv").write_text(",".join(OFFER_COLUMNS) + "\n" + "\n".join(rows) + "\n")
    text = (
        f"name: {slug}\nprovider: gcp\nmarket: {slug}.csv\nmodel: {{name: {model}, profile: sailor}}\n"
        f"training: {{global_batch_size: {batch}, microbatch_sizes: {microbatches}, steps: 100, precision: fp16-mixed,"
        f" optimizer: {{name: adam}}}}\nobjective: {{goal: max_throughput}}\n"
        f"parallelism: {{tensor_parallel: [1, 2, 4]}}\n"
    )
    return name, parse_recipe(text, file=f"{slug}.yaml", folder=folder, catalog=default_catalog())


def problems(folder: Path) -> list[tuple[str, object, float]]:
    zones = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-b"]
    cases = [
        (
            *problem_recipe(
                folder,
                "opt350m-128xA100-1zone",
                "opt-350m",
                [market_row(zones[0], A100, 128)],
                1024,
                "[1, 2, 4, 8]",
            ),
            0.1,
        ),
    ]
    for a100, v100, target in ((32, 96, 1.0), (80, 240, 2.0), (128, 384, 3.0)):
        cases.append(
            (
                *problem_recipe(
                    folder,
                    f"gptneo-{a100}xA100+{v100}xV100",
                    "gpt-neo-2.7b",
                    [market_row(zones[0], A100, a100), market_row(zones[0], V100, v100)],
                    2048,
                    "[1, 2, 4]",
                ),
                target,
            )
        )
    cases.append(
        (
            *problem_recipe(
                folder,
                "opt350m-5zones-x128xA100",
                "opt-350m",
                [market_row(z, A100, 128) for z in zones],
                1024,
                "[1, 2, 4, 8]",
            ),
            1.0,
        )
    )
    cases.append(
        (
            *problem_recipe(
                folder,
                "opt350m-3types-x256",
                "opt-350m",
                [
                    market_row(zones[0], A100, 256),
                    market_row(zones[0], V100, 256),
                    market_row(zones[0], GH200, 256),
                ],
                1024,
                "[1, 2, 4, 8]",
            ),
            30.0,
        )
    )
    return cases


def describe(plan) -> str:
    gpus = sorted({f"{r.gpu}x{r.tp}" for s in plan.stages for r in s.replicas})
    return (
        f"{plan.num_stages} stages x {plan.dp_degree} replicas ({plan.total_gpus} GPUs: {', '.join(gpus)}), "
        f"microbatch {plan.microbatch_size}, layers {[s.layers[1] - s.layers[0] for s in plan.stages]}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--only", default="", help="run the problems whose name contains this")
    parser.add_argument(
        "--min-cost-floor",
        action="store_true",
        help="the cheapest plan over half the best rate, not the fastest plan",
    )
    args = parser.parse_args()
    catalog = default_catalog()
    with tempfile.TemporaryDirectory() as tmp:
        for name, recipe, target in problems(Path(tmp)):
            if args.only not in name:
                continue
            if args.min_cost_floor:
                recipe = _cheapest_over_half(recipe, catalog)
            seconds, result = [], None
            for _ in range(args.repeat):
                start = time.perf_counter()
                result = plan_recipe(recipe, catalog, options=SearchOptions(top_k=5))
                seconds.append(time.perf_counter() - start)
            median = statistics.median(seconds)
            best = result.plans[0]
            verdict = "meets" if median < target else "MISSES"
            price = f", ${best.score.cost_per_million_samples_usd:,.2f}/1M samples"
            print(
                f"{name:28s} {median:7.3f} s (first run {seconds[0]:.3f} s; target < {target:g} s, "
                f"{verdict}); {result.evaluations:,} plans simulated; best "
                f"{best.score.samples_per_s:,.1f} samples/s"
                f"{price if args.min_cost_floor else ''}: {describe(best.plan)}",
                flush=True,
            )


def _cheapest_over_half(recipe, catalog):
    """The recipe asking for the cheapest plan over half the rate of its fastest plan."""
    fastest = plan_recipe(recipe, catalog, options=SearchOptions(top_k=1)).plans[0]
    objective = dataclasses.replace(
        recipe.objective,
        goal="min_cost",
        min_throughput_samples_per_s=0.5 * fastest.score.samples_per_s,
    )
    return dataclasses.replace(recipe, objective=objective)


if __name__ == "__main__":
    main()
