"""Our simulator against SAILOR's measured runs: iteration time and peak memory per GPU.

Usage: python bench/sailor_validation.py [--runtime ours] [--runs clariden|mit] [--profile analytic]

SAILOR's authors trained OPT-350M with Megatron-DeepSpeed (fp16) on two clusters and published each
run's plan with its measured iteration time and peak GPU memory (bench/data/sailor_validation.json,
typed from eth-easl/sailor cf2c8e3, MIT): 15 runs on GH200 nodes of 4 GPUs (TP 4, 1-4 stages,
DP 1-32, microbatches of 1-8) and 9 on nodes of RTX-3090, RTX-2080 and Titan-RTX GPUs (TP 2 or 8,
GPU types mixed along a pipeline and across the replicas of a stage). Each plan is simulated with
SAILOR's published profiles of those GPUs (configs/profiles/sailor, the same figures SAILOR's own
simulator reads), the catalog's network (SAILOR's node-pair measurements where it has them) and
the settings of the runtime that ran them, ``megatron-deepspeed`` in configs/simulator.yaml: its
pipeline sends block both ends and it reduces gradients after the last backward. ``--runtime ours``
simulates them as if our runtime had run them instead, for comparison. ``--profile analytic``
takes the analytic estimate (configs/simulator.yaml ``analytic:``) instead of SAILOR's profiles:
how far the estimate alone lands from these measurements.

Nothing here is fitted to these runs: the profiles, the network table and the memory settings are
the ones every other plan is simulated with. One of them was adopted after seeing these runs:
GH200's framework memory, SAILOR's own figure for its GH200 platform (BENCHMARKS.md says so).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.catalog import OFFER_COLUMNS, default_catalog  # noqa: E402
from orchestrator.plan import Plan, Replica, Stage  # noqa: E402
from orchestrator.profiles import analytic_settings, sailor_profile  # noqa: E402
from orchestrator.profiles.analytic import analytic_profile  # noqa: E402
from orchestrator.simulator import simulate, views_for  # noqa: E402
from runtime.models.specs import model_spec  # noqa: E402

DATA = Path(__file__).resolve().parent / "data" / "sailor_validation.json"
ZONE = "gcp/us-central1/us-central1-a"  # where SAILOR's plan files put every node
GIB = 2**30
# What the issue measured of SAILOR's own simulator on these runs (mean / max absolute error)
SAILOR_ERRORS = {"clariden": "time 8.9% / 16.1%, memory 5.9% / 8.8%", "mit": "not stated"}


def market(catalog, gpus: set[str], folder: Path):
    """A market with one illustrative offer per GPU type in the runs' zone: the simulator prices
    every plan, and these runs' clusters are not in any price list (prices do not enter times)."""
    rows = [",".join(OFFER_COLUMNS)]
    for gpu in sorted(gpus):
        rows.append(
            f"gcp,us-central1,us-central1-a,bench-{gpu.lower()}-8,{gpu},8,64,512,8.00,2.00,64,,"
            f"bench market (illustrative),2026-12-07"
        )
    path = folder / "market.csv"
    path.write_text("\n".join(rows) + "\n")
    return catalog.load_market(path)


def build(run: dict, catalog) -> tuple[Plan, set[str]]:
    stages, gpus = [], set()
    for stage in run["stages"]:
        replicas = []
        for name, tp, _per_node, count in stage["replicas"]:
            gpu = catalog.gpus.find(name).name
            gpus.add(gpu)
            replicas += [Replica(gpu=gpu, tp=tp, infra=ZONE)] * count
        stages.append(Stage(layers=tuple(stage["layers"]), replicas=tuple(replicas)))
    plan = Plan(
        global_batch_size=run["global_batch_size"],
        microbatch_size=run["microbatch_size"],
        stages=tuple(stages),
        allreduce="flat",
    )
    return plan, gpus


def _estimate(catalog, gpus: set[str], built):
    """The analytic estimate of OPT-350M on ``gpus`` at the runs' microbatch sizes and degrees."""
    plans = [plan for _, plan, _ in built]
    return analytic_profile(
        model_spec("opt-350m"),
        [catalog.gpus.find(g) for g in sorted(gpus)],
        precision="fp16-mixed",
        optimizer="adam",
        microbatch_sizes={p.microbatch_size for p in plans},
        tp_degrees={r.tp for p in plans for s in p.stages for r in s.replicas},
        settings=analytic_settings(catalog),
    )


def shape(plan: Plan) -> str:
    tps = sorted({r.tp for s in plan.stages for r in s.replicas})
    return f"S{plan.num_stages} D{plan.dp_degree} TP{','.join(map(str, tps))} mbs{plan.microbatch_size}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runtime", default="megatron-deepspeed", help="'ours' or a runtime name")
    parser.add_argument("--runs", choices=["clariden", "mit"], help="one cluster's runs only")
    parser.add_argument("--profile", choices=["sailor", "analytic"], default="sailor")
    args = parser.parse_args()
    catalog = default_catalog()
    runs = json.loads(DATA.read_text())["runs"]
    if args.runs:
        runs = [r for r in runs if r["name"].startswith(args.runs)]
    built = [(run, *build(run, catalog)) for run in runs]
    gpus = set().union(*(g for _, _, g in built))
    runtime = None if args.runtime == "ours" else args.runtime
    with tempfile.TemporaryDirectory() as folder:
        network, prices, settings = views_for(
            catalog, market(catalog, gpus, Path(folder)), runtime=runtime
        )
        profile = (
            sailor_profile("opt-350m", sorted(gpus), catalog)
            if args.profile == "sailor"
            else _estimate(catalog, gpus, built)
        )
        print(
            f"runtime: {args.runtime}; profile: {args.profile}; {len(runs)} runs of OPT-350M "
            f"({DATA.name})"
        )
        print(
            f"{'run':22s} {'plan':22s} {'measured s':>10s} {'ours s':>8s} {'error':>7s}"
            f" {'meas. GiB':>9s} {'ours GiB':>8s} {'error':>7s}"
        )
        errors: dict[str, list[tuple[float, float]]] = {}
        for run, plan, _ in built:
            estimate = simulate(profile, plan, network=network, prices=prices, settings=settings)
            time_error = estimate.iteration_time_s / run["iteration_s"] - 1
            memory_error = estimate.peak_memory_bytes / run["peak_bytes"] - 1
            errors.setdefault(run["name"].split()[0], []).append((time_error, memory_error))
            print(
                f"{run['name']:22s} {shape(plan):22s} {run['iteration_s']:10.3f}"
                f" {estimate.iteration_time_s:8.3f} {time_error:+7.1%}"
                f" {run['peak_bytes'] / GIB:9.2f} {estimate.peak_memory_bytes / GIB:8.2f}"
                f" {memory_error:+7.1%}"
            )
    print("\nmean / max absolute error")
    for cluster, pairs in errors.items():
        times = [abs(t) for t, _ in pairs]
        memory = [abs(m) for _, m in pairs]
        print(
            f"  {cluster:9s} ({len(pairs)} runs): time {statistics.mean(times):.1%} / {max(times):.1%}, "
            f"memory {statistics.mean(memory):.1%} / {max(memory):.1%}"
            f"   (SAILOR's simulator: {SAILOR_ERRORS[cluster]})"
        )


if __name__ == "__main__":
    main()
