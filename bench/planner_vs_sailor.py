"""Our planner's search time beside SAILOR's C++ planner, on the problems of planner_speed.py.

Usage: python bench/planner_vs_sailor.py --sailor DIR [--rounds 3] [--only NAME] [--timeout-s 600]

DIR is a checkout of eth-easl/sailor (commit cf2c8e3) whose planner library was built in place,
outside this repository (BENCHMARKS.md says how; none of SAILOR's code is part of this project).
Each search runs in a fresh process, SAILOR's and ours in turn, round after round, so that both
see the same state of the machine and neither reuses a cache: SAILOR's planner memoizes whole
searches, so only its first call in a process searches. SAILOR's time is that first call, its
table building (the planner's constructor: profiles, network) apart, as SAILOR reports it; ours the
same way: ``search`` apart from ``prepare`` (profile import, search space, network, prices and
settings from the parsed recipe). Ratios are printed for the searches and for search + tables. Both search for
the most throughput; each prints its best plan's throughput in its own simulator.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

ZONES = ["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f", "us-west1-b"]
# name (as planner_speed.py), SAILOR's model folder and training config, its GPUs per zone
SAILOR_PROBLEMS = {
    "opt350m-128xA100-1zone": ("OPT-350", "opt_350", {"A100-40": {ZONES[0]: 128}}),
    "gptneo-32xA100+96xV100": (
        "GPT-Neo-2.7",
        "gpt_neo27",
        {"A100-40": {ZONES[0]: 32}, "V100-16": {ZONES[0]: 96}},
    ),
    "gptneo-80xA100+240xV100": (
        "GPT-Neo-2.7",
        "gpt_neo27",
        {"A100-40": {ZONES[0]: 80}, "V100-16": {ZONES[0]: 240}},
    ),
    "gptneo-128xA100+384xV100": (
        "GPT-Neo-2.7",
        "gpt_neo27",
        {"A100-40": {ZONES[0]: 128}, "V100-16": {ZONES[0]: 384}},
    ),
    "opt350m-5zones-x128xA100": ("OPT-350", "opt_350", {"A100-40": {z: 128 for z in ZONES}}),
    "opt350m-3types-x256": (
        "OPT-350",
        "opt_350",
        {"A100-40": {ZONES[0]: 256}, "V100-16": {ZONES[0]: 256}, "GH-96": {ZONES[0]: 256}},
    ),
}
BATCH = {"opt_350": 1024, "gpt_neo27": 2048}


def _cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def child_sailor(sailor: Path, name: str) -> dict:
    model, config, quotas = SAILOR_PROBLEMS[name]
    sys.path.insert(0, str(sailor / "sailor/Planner/sailor_planner/cpp_src"))
    import libplanner  # SAILOR's, built in the user's checkout

    data = sailor / "sailor"
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(quotas, f)
    start = time.perf_counter()
    planner = libplanner.SailorPlanner(
        f"{data}/Planner/sailor_planner/profiles/{model}/",
        f"{data}/providers/multizone_bandwidths_het.json",
        f"{data}/Planner/simulations/configs/training_config_{config}.json",
        f"{data}/Planner/llm_info.json",
        f"{data}/providers/gcp/communication_cost.json",
        True,  # heterogeneous
        True,  # fp16
        f.name,
        "throughput",
    )
    tables_s = time.perf_counter() - start
    per_zone: dict = {}
    for gpu, zones in quotas.items():
        for zone, count in zones.items():
            per_zone.setdefault(zone, {})[gpu] = count
    start, cpu = time.perf_counter(), _cpu_s()
    configs = planner.get_sorted_plans(per_zone, 0.0, 0.0)
    search_s, cpu_s = time.perf_counter() - start, _cpu_s() - cpu
    best = configs[0] if len(configs) else None
    rate = 1 / best.get_Tpp() * BATCH[config] if best is not None and best.get_Tpp() else 0.0
    shape = (
        f"{len(list(best.get_stages()))} stages x {len(list(best.get_config_per_stage()[0]))}"
        if best is not None
        else "none"
    )
    return {
        "search_s": search_s,
        "cpu_s": cpu_s,
        "tables_s": tables_s,
        "best": rate,
        "shape": shape,
    }


def child_ours(name: str) -> dict:
    from planner_speed import problems

    from orchestrator.catalog import default_catalog
    from orchestrator.planner import SearchOptions, prepare
    from orchestrator.planner.search import search

    catalog = default_catalog()
    with tempfile.TemporaryDirectory() as folder:
        recipe = next(r for n, r, _ in problems(Path(folder)) if n == name)
        # our tables, as SAILOR's constructor builds its own: the profile imported for the
        # market's GPUs, the search space, the network, prices and simulator settings
        start = time.perf_counter()
        context = prepare(recipe, catalog)
        tables_s = time.perf_counter() - start
        start, cpu = time.perf_counter(), _cpu_s()
        result = search(context.evaluator, context.space, SearchOptions(top_k=5))
        search_s, cpu_s = time.perf_counter() - start, _cpu_s() - cpu
    best = result.plans[0]
    shape = f"{best.plan.num_stages} stages x {best.plan.dp_degree}"
    return {
        "search_s": search_s,
        "cpu_s": cpu_s,
        "tables_s": tables_s,
        "best": best.score.samples_per_s,
        "shape": shape,
    }


def _spawn(args: list[str], timeout_s: float) -> dict | None:
    try:
        done = subprocess.run(
            [sys.executable, __file__, *args], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired:
        return None
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        raise SystemExit(f"{' '.join(args)} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sailor", type=Path, help="a SAILOR checkout with its planner built")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", default="")
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per SAILOR search")
    parser.add_argument("--child", nargs=2, metavar=("WHO", "NAME"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        who, name = args.child
        print(json.dumps(child_sailor(args.sailor, name) if who == "sailor" else child_ours(name)))
        return
    if args.sailor is None:
        parser.error("--sailor DIR is needed (BENCHMARKS.md: how to build SAILOR's planner)")
    print(
        "problem                    SAILOR s (cpu) [tables s]     ours s (cpu) [tables s]"
        "     SAILOR/ours: search, search + tables"
    )
    for name in SAILOR_PROBLEMS:
        if args.only not in name:
            continue
        theirs, ours = [], []
        for _ in range(args.rounds):
            sailor = ["--sailor", str(args.sailor), "--child", "sailor", name]
            theirs.append(_spawn(sailor, args.timeout_s))
            ours.append(_spawn(["--child", "ours", name], 3600))
            if theirs[-1] is None:  # past the limit once: the next rounds would be too
                break
        mine = statistics.median(r["search_s"] for r in ours)
        mine_cpu = statistics.median(r["cpu_s"] for r in ours)
        mine_tables = statistics.median(r["tables_s"] for r in ours)
        if any(r is None for r in theirs):
            sailor_text, ratio = (
                f"> {args.timeout_s:.0f} (timed out)",
                f"> {args.timeout_s / mine:.1f}x, > {args.timeout_s / (mine + mine_tables):.1f}x",
            )
        else:
            s = statistics.median(r["search_s"] for r in theirs)
            c = statistics.median(r["cpu_s"] for r in theirs)
            t = statistics.median(r["tables_s"] for r in theirs)
            sailor_text = f"{s:.3f} ({c:.3f}) [{t:.2f}]"
            ratio = f"{s / mine:.2f}x, {(s + t) / (mine + mine_tables):.2f}x"
        ours_text = f"{mine:.3f} ({mine_cpu:.3f}) [{mine_tables:.2f}]"
        print(f"{name:26s} {sailor_text:28s} {ours_text:24s} {ratio}", flush=True)
        best = theirs[0]
        print(
            f"  best: SAILOR {best['best']:.1f} samples/s ({best['shape']}) in its simulator; "
            f"ours {ours[0]['best']:.1f} ({ours[0]['shape']}) in ours"
            if best
            else f"  best: ours {ours[0]['best']:.1f} ({ours[0]['shape']})",
            flush=True,
        )


if __name__ == "__main__":
    main()
