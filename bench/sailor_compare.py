"""Our estimates next to SAILOR's modelling, on SAILOR's own profiles.

Usage: python bench/sailor_compare.py

Part 1 re-derives SAILOR's simulator (eth-easl/sailor, Planner/simulations; written here from its
published description, not copied) for a few plans and prints its iteration time and peak memory
beside ours:
- pipeline: (m - 1) * max_s(compute_s + send_s) + sum_s compute_s + sum_s send_s + max update,
  where send_s is bytes / bandwidth with no latency term;
- data-parallel sync: a ring all-reduce of each stage's fp16 weights in 500 MB buckets,
  2(N-1) * bucket / N / bandwidth per bucket, the slowest stage's, added after the pipeline;
- memory: parameters x 12 bytes (fp16 Adam as DeepSpeed keeps it) + activations x (P - s) in fp16
  (half the measured bytes) + 2 GB (3 GB with TP) for the framework.
Part 2 measures what can be measured without a GPU: how far each pipeline formula is from the exact
1F1B schedule (an event simulation of every operation), on pipelines built from SAILOR's profiles
with uneven splits, mixed A100/V100 stages and cross-zone or cross-region links.
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.catalog import default_catalog  # noqa: E402
from orchestrator.plan import Plan, Replica  # noqa: E402
from orchestrator.profiles import sailor_profile  # noqa: E402
from orchestrator.simulator import latency_aware_plan_warmup, simulate, views_for  # noqa: E402
from orchestrator.simulator.pipeline import pipeline_time  # noqa: E402
from orchestrator.simulator.pipeline import simulate as full_schedule

BUCKET_BYTES = 500e6
GIB = 2**30
ZONE = {z: f"gcp/us-central1/us-central1-{z}" for z in "abcf"}
WEST = "gcp/us-west1/us-west1-b"


def sailor_style(profile, plan: Plan, network) -> tuple[float, float]:
    """(iteration seconds, peak bytes on any GPU) as SAILOR's simulator models them."""
    mbs, m = plan.microbatch_size, plan.microbatches()[0]
    worst_pipeline, sync = 0.0, 0.0
    for i in range(plan.dp_degree):
        comp, send, update = [], [], 0.0
        for s, stage in enumerate(plan.stages):
            r = stage.replicas[i]
            f, b, u = profile.stage_times(r.gpu, mbs, r.tp, *stage.layers)
            comp.append(f + b)
            update = max(update, u)
            if s < plan.num_stages - 1:
                nxt = plan.stages[s + 1].replicas[i]
                size = profile.stage_facts(r.tp, *stage.layers)[3] * mbs * 2
                _, bw = network.link(r.infra, nxt.infra, plan.streams)
                send.append(2 * size / bw)  # activation out, gradient back, no latency
            else:
                send.append(0.0)
        pipeline = (
            (m - 1) * max(c + x for c, x in zip(comp, send, strict=True))
            + sum(comp)
            + sum(send)
            + update
        )
        worst_pipeline = max(worst_pipeline, pipeline)
    for stage in plan.stages:
        n = len(stage.replicas)
        if n < 2:
            continue
        weights = profile.stage_gradient_elements(*stage.layers, 1) * 2
        bw = min(
            network.link(a.infra, b.infra, plan.streams)[1]
            for a in stage.replicas
            for b in stage.replicas
        )
        buckets, rest = divmod(weights, BUCKET_BYTES)
        sizes = [BUCKET_BYTES] * int(buckets) + ([rest] if rest else [])
        sync = max(sync, sum(2 * (n - 1) * size / n / bw for size in sizes))
    peak = 0.0
    for s, stage in enumerate(plan.stages):
        for r in stage.replicas:
            params, kept, _, _ = profile.stage_facts(r.tp, *stage.layers)
            memory = (
                params * 12 + kept / 2 * mbs * (plan.num_stages - s) + (2e9 if r.tp == 1 else 3e9)
            )
            peak = max(peak, memory)
    return worst_pipeline + sync, peak


def build(layers, pipelines, batch, mbs, warmup=None):
    return Plan.from_pipelines(
        global_batch_size=batch,
        microbatch_size=mbs,
        layers=layers,
        pipelines=pipelines,
        allreduce="flat",
        pipeline_warmup=warmup,
    )


def part1(profiles, network, prices, settings) -> None:
    a = {z: Replica(gpu="A100", infra=ZONE[z]) for z in ZONE}
    v = {z: Replica(gpu="V100", infra=ZONE[z]) for z in ZONE}
    aw = Replica(gpu="A100", infra=WEST)
    neo_split = [(0, 20), (20, 34)]
    cases = [
        (
            "OPT-350M, 8 x A100 data-parallel, one zone",
            "opt-350m",
            [(0, 26)],
            [(8, [a["a"]])],
            1024,
            4,
        ),
        (
            "OPT-350M, 4 stages x 8, A100 over 4 zones",
            "opt-350m",
            [(0, 7), (7, 13), (13, 20), (20, 26)],
            [(2, [a[z]] * 4) for z in "abcf"],
            1024,
            2,
        ),
        (
            "OPT-350M, 2 stages x 4, us-central1 -> us-west1",
            "opt-350m",
            [(0, 13), (13, 26)],
            [(4, [a["a"], aw])],
            1024,
            2,
        ),
        (
            "GPT-Neo-2.7B, A100 stage + V100 stage, x4",
            "gpt-neo-2.7b",
            neo_split,
            [(4, [a["a"], v["a"]])],
            2048,
            1,
        ),
        (
            "GPT-Neo-2.7B, 2 stages x 8 A100, 2 zones",
            "gpt-neo-2.7b",
            neo_split,
            [(4, [a["a"]] * 2), (4, [a["b"]] * 2)],
            2048,
            1,
        ),
    ]
    print(
        "Part 1: iteration time and peak memory per GPU, SAILOR's modelling vs ours (flat all-reduce)"
    )
    print(
        f"{'plan':50s} {'SAILOR s':>9s} {'ours s':>9s} {'ours/SAILOR':>11s} {'SAILOR GiB':>10s} {'ours GiB':>9s}"
    )
    for name, model, layers, pipelines, batch, mbs in cases:
        profile = profiles[model]
        plan = build(layers, pipelines, batch, mbs)
        ours = simulate(profile, plan, network=network, prices=prices, settings=settings)
        theirs, peak = sailor_style(profile, plan, network)
        print(
            f"{name:50s} {theirs:9.3f} {ours.iteration_time_s:9.3f} {ours.iteration_time_s / theirs:11.3f} "
            f"{peak / GIB:10.1f} {ours.peak_memory_bytes / GIB:9.1f}"
        )
        if plan.num_stages > 1 and "west" in name:
            aware = build(
                layers, pipelines, batch, mbs, latency_aware_plan_warmup(profile, plan, network)
            )
            e = simulate(profile, aware, network=network, prices=prices, settings=settings)
            print(
                f"{'  same, latency-aware warm-up ' + str(aware.warmup):50s} {'':9s} {e.iteration_time_s:9.3f} "
                f"{e.iteration_time_s / theirs:11.3f} {'':10s} {e.peak_memory_bytes / GIB:9.1f}"
            )


def part2(profiles, network) -> None:
    rng = random.Random(0)
    ours_err, sailor_err = [], []
    places = [ZONE["a"], ZONE["b"], WEST, "gcp/europe-west4/europe-west4-a"]
    for _ in range(400):
        model = rng.choice(["opt-350m", "gpt-neo-2.7b"])
        profile, layers = profiles[model], profiles[model].num_layers
        stages = rng.randint(2, 6)
        cuts = sorted(rng.sample(range(1, layers), stages - 1))
        bounds = [0, *cuts, layers]
        mbs, m = rng.choice([1, 2, 4]), rng.choice([8, 16, 32, 64])
        gpus = [rng.choice(["A100", "V100"]) for _ in range(stages)]
        where = [
            rng.choice(places[:2]) if rng.random() < 0.8 else rng.choice(places)
            for _ in range(stages)
        ]
        f, b, lat, occ = [], [], [], []
        for s in range(stages):
            fs, bs, _ = profile.stage_times(gpus[s], mbs, 1, bounds[s], bounds[s + 1])
            f.append(fs)
            b.append(bs)
            if s:
                size = profile.stage_facts(1, bounds[s - 1], bounds[s])[3] * mbs * 2
                latency, bw = network.link(where[s - 1], where[s], 8)
                lat.append(latency)
                occ.append(size / bw)
        exact, _ = full_schedule(f, b, m, lat, occ, occ)
        fast = pipeline_time(f, b, m, lat, occ, occ).makespan_s
        sends = [lat[s] + occ[s] if s < stages - 1 else 0.0 for s in range(stages)]
        steps = [f[s] + b[s] + sends[s] for s in range(stages)]
        straggler = (m - 1) * max(steps) + sum(f) + sum(b) + sum(sends)
        ours_err.append(fast / exact - 1)
        sailor_err.append(straggler / exact - 1)
    print(
        "\nPart 2: pipeline time vs the exact 1F1B schedule, 400 pipelines from SAILOR's profiles "
        "(2-6 stages, A100/V100, 20% with a cross-region or cross-continent link)"
    )
    for name, errors in (
        ("ours (exact prefix + max cycle mean)", ours_err),
        ("SAILOR's straggler formula", sailor_err),
    ):
        absolute = [abs(e) for e in errors]
        print(
            f"  {name:38s} mean |error| {statistics.mean(absolute):6.2%}  median {statistics.median(absolute):6.2%}"
            f"  worst {max(absolute):6.2%}  bias {statistics.mean(errors):+6.2%}"
        )


def main() -> None:
    catalog = default_catalog()

    profiles = {
        name: sailor_profile(name, ["A100", "V100"], catalog)
        for name in ("opt-350m", "gpt-neo-2.7b")
    }
    network, prices, sim_settings = views_for(catalog, catalog.market("gcp"))
    part1(profiles, network, prices, sim_settings)
    part2(profiles, network)


if __name__ == "__main__":
    main()
