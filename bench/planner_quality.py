"""What the planner's heuristics lose against exhaustive search.

Usage: python bench/planner_quality.py [--markets N] [--stages P] [--seed S]

Past its exact limits the planner uses heuristics (docs/planner.md): the balanced layer split and
its neighbours instead of every split, GPU types in contiguous blocks instead of every assignment,
and a menu of region-pure placements (then region-spilling ones) instead of every placement. This
bench forces every heuristic on (exact limits of 1) on seeded random markets small enough to search
exhaustively, and prints, per objective, how far the planner's best plan falls behind the
exhaustive best: mean and worst loss, and the share of markets within 1%. The same markets with
the default limits (exact at this size) are the control: they must lose nothing.

Markets: up to 16 GPUs of 3 types (T4, L4, V100) in 4 places of 3 regions on 2 continents, random
capacities, prices and preemption rates; gpt-mini (8 layers) with analytic profiles; limits
(budget, floor, deadline) set from the market's fastest plan so that they bind.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.catalog import OFFER_COLUMNS, default_catalog  # noqa: E402
from orchestrator.planner import SearchOptions, prepare  # noqa: E402
from orchestrator.planner.exhaustive import best, binding_objectives, enumerate_all  # noqa: E402
from orchestrator.planner.search import search  # noqa: E402
from orchestrator.recipe import parse_recipe  # noqa: E402

PLACES = [
    ("gcp", "us-central1", "us-central1-a"),
    ("gcp", "us-central1", "us-central1-b"),
    ("gcp", "us-east1", "us-east1-b"),
    ("gcp", "europe-west1", "europe-west1-b"),
]
GPUS = ("T4", "L4", "V100")
HEURISTICS = SearchOptions(
    top_k=1, exact_splits_limit=1, exact_types_limit=1, exact_placements_limit=1
)
EXACT = SearchOptions(top_k=1)


def write_market(rng: random.Random, folder: Path) -> None:
    rows, total = [",".join(OFFER_COLUMNS)], 0
    for cloud, region, zone in PLACES:
        for gpu in GPUS:
            count = rng.choice([0, 0, 0, 1, 2, 4])
            count = count if total + count <= 16 else 0
            total += count
            if count:
                on_demand = round(rng.uniform(0.4, 2.5), 3)
                spot = round(on_demand * rng.uniform(0.2, 0.6), 3)
                rate = round(rng.uniform(0.0, 0.5), 3)
                rows.append(
                    f"{cloud},{region},{zone},vm-{gpu},{gpu},1,8,30,{on_demand},{spot},{count},"
                    f"{rate},bench,2026-01-01"
                )
    if total == 0:
        rows.append("gcp,us-central1,us-central1-a,vm-T4,T4,1,8,30,0.5,0.2,2,0.1,bench,2026-01-01")
    (folder / "market.csv").write_text("\n".join(rows) + "\n")


def recipe(folder: Path, objective: str, stages: int):
    text = (
        "model: {name: gpt-mini}\nprovider: gcp\nmarket: market.csv\n"
        "training: {global_batch_size: 16, microbatch_sizes: [1, 2], steps: 100}\n"
        f"objective: {objective}\n"
        f"parallelism: {{tensor_parallel: [1], max_pipeline_stages: {stages}}}\n"
        "runtime: {allreduce: auto, compression: fp16}\n"
    )
    return parse_recipe(text, file="r.yaml", folder=folder, catalog=default_catalog())


def objectives(fastest) -> dict[str, str]:
    """The objectives, with limits taken from the market's fastest plan so that they bind."""
    return binding_objectives(fastest, steps=100, global_batch_size=16)


def losses(folder: Path, stages: int) -> dict[str, tuple[float, float, float, float]]:
    """objective -> (loss with heuristics, loss exact, seconds with heuristics, seconds exact);
    a loss is the share of the exhaustive best's value the planner's best falls short by."""
    catalog = default_catalog()
    base = prepare(recipe(folder, "{goal: max_throughput}", stages), catalog)
    everything = list(enumerate_all(base.evaluator, base.space))
    fastest = best(everything)
    if fastest is None:
        return {}
    out = {}
    for name, objective in objectives(fastest).items():
        context = prepare(recipe(folder, objective, stages), catalog)
        reference = best([context.evaluator.rescore(e.plan, e.estimate) for e in everything])
        if reference is None:
            continue
        lost, seconds = [], []
        for options in (HEURISTICS, EXACT):
            start = time.perf_counter()
            found = search(context.evaluator, context.space, options).plans
            seconds.append(time.perf_counter() - start)
            value = found[0].score.value if found else float("-inf")
            lost.append(max(0.0, (reference.score.value - value) / abs(reference.score.value)))
        out[name] = (lost[0], lost[1], seconds[0], seconds[1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--markets", type=int, default=30)
    parser.add_argument("--stages", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    table: dict[str, list[tuple[float, float, float, float, int]]] = {}
    for seed in range(args.seed, args.seed + args.markets):
        with tempfile.TemporaryDirectory() as tmp:
            write_market(random.Random(seed), Path(tmp))
            for name, row in losses(Path(tmp), args.stages).items():
                table.setdefault(name, []).append((*row, seed))
    print(
        f"{args.markets} markets, up to {args.stages} stages; loss = how far the planner's best falls "
        "behind the exhaustive best"
    )
    print(
        f"{'objective':28s} {'markets':>7s} {'heuristics: mean':>17s} {'worst':>7s} {'within 1%':>9s}"
        f" {'exact: worst':>12s} {'ms heur/exact':>14s}  worst market"
    )
    for name, rows in table.items():
        heuristic = [r[0] for r in rows]
        exact = [r[1] for r in rows]
        within = sum(x <= 0.01 for x in heuristic) / len(rows)
        ms = (
            1000 * statistics.mean(r[2] for r in rows),
            1000 * statistics.mean(r[3] for r in rows),
        )
        print(
            f"{name:28s} {len(rows):7d} {statistics.mean(heuristic):17.2%} {max(heuristic):7.2%} "
            f"{within:9.0%} {max(exact):12.2%} {ms[0]:6.1f}/{ms[1]:.1f}  "
            f"seed {max(rows)[4]}"
        )


if __name__ == "__main__":
    main()
