"""The runtime on a real GPU: does it train right on CUDA, and does the simulator predict it?

Usage: python bench/gpu_check.py [--out DIR] [--model opt-350m] [--steps 6] [--quick]

Needs a machine with one CUDA GPU (or more) and Ray; writes ``gpu_check.json`` to ``--out``.

1. Correctness (Ray workers asking for GPUs, as the driver starts them): a small GPT trained
   for a few steps by
   - one CUDA worker;
   - 2 stages x 2 replicas of CUDA workers, each in its own place (zones of two regions): the
     pipeline's tensors and the hierarchical all-reduce go from GPU through host memory over gloo
     (``Layout.on_nccl`` is false across places); four workers share the one GPU;
   - a CUDA first stage feeding a CPU last stage (gloo between a GPU and a CPU worker);
   each against the single-process run on the CPU (runtime/reference.py), step by step.
   NCCL needs one GPU per rank of a group (it refuses two ranks on one device), so on a one-GPU
   machine no layout here takes the NCCL path; with N GPUs, ``--nccl`` adds a data-parallel
   layout of N workers in one place.
2. Fidelity on the GPU: ``--model`` profiled layer by layer on the GPU (runtime/profiler.py), a
   one-GPU plan simulated on that measured profile and on the analytic estimate for the catalog's
   GPU of that name, against the runtime's measured iteration time and peak memory there.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

US_A, US_B = "gcp/us-central1/us-central1-a", "gcp/us-central1/us-central1-b"
EU_A, EU_B = "gcp/europe-west4/europe-west4-a", "gcp/europe-west4/europe-west4-b"
PLACES = (US_A, US_B, EU_A, EU_B)


def _layout(model, layers, pipelines, devices, *, microbatch, microbatches):
    """``pipelines``: per replica, the place of each stage; ``devices``: per stage."""
    from runtime.layout import Layout, WorkerSpec

    workers = tuple(
        WorkerSpec(
            stage=s,
            replica=i,
            place=pipelines[i][s],
            device=devices[s],
            microbatches=microbatches,
        )
        for s in range(len(layers))
        for i in range(len(pipelines))
    )
    return Layout(
        model=model,
        layers=tuple(layers),
        workers=workers,
        microbatch_size=microbatch,
        warmup=tuple(len(layers) - 1 - s for s in range(len(layers))),
        allreduce="hierarchical",
    )


def _train(layout, config, *, gpu_share: float) -> tuple[list[float], list[float], list[dict]]:
    """Losses and seconds of every step, and the workers' counters."""
    from runtime.group import WorkerGroup

    group = WorkerGroup.start(layout, config, gpu_share=gpu_share, timeout_s=300)
    losses, seconds = [], []
    try:
        for step in range(config.steps):
            started = time.perf_counter()
            losses.append(group.step(step))
            seconds.append(time.perf_counter() - started)
        counters = group.counters()
    finally:
        group.shutdown()
    return losses, seconds, counters


def correctness(args, report: dict) -> None:
    from runtime.models.specs import model_spec
    from runtime.reference import TrainConfig, workload_losses
    from runtime.workload import build_workload

    model = "gpt-mini"
    n = model_spec(model).num_layers  # embedding, blocks, head
    half = n // 2
    config = TrainConfig(steps=args.steps, global_batch_size=8, microbatch_size=2)
    reference = workload_losses(build_workload(model, seed=config.seed), config)
    cases = [
        ("1 CUDA worker", [(0, n)], [[US_A]], ["cuda"], 4, 1.0),
        (
            "2 stages x 2 replicas, CUDA, 4 places (gloo)",
            [(0, half), (half, n)],
            [[US_A, US_B], [EU_A, EU_B]],
            ["cuda", "cuda"],
            2,
            0.25,
        ),
        (
            "CUDA stage -> CPU stage (gloo)",
            [(0, half), (half, n)],
            [[US_A, US_B]],
            ["cuda", "cpu"],
            4,
            0.5,
        ),
    ]
    if args.nccl > 1:
        cases.append(
            (
                f"DP{args.nccl} CUDA in one place (NCCL)",
                [(0, n)],
                [[US_A]] * args.nccl,
                ["cuda"],
                4 // args.nccl or 1,
                1.0,
            )
        )
    report["correctness"] = []
    for name, layers, pipelines, devices, microbatches, share in cases:
        devices = [args.device if d == "cuda" else d for d in devices]  # cpu: a dry run
        layout = _layout(model, layers, pipelines, devices, microbatch=2, microbatches=microbatches)
        try:
            losses, seconds, _ = _train(layout, config, gpu_share=share)
        except Exception as error:  # noqa: BLE001  (a case's failure is reported, the rest run)
            print(f"{name:48s} FAILED: {error}", flush=True)
            report["correctness"].append({"case": name, "error": str(error)[-2000:]})
            continue
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
        print(
            f"{name:48s} losses {[round(x, 5) for x in losses]}  max rel. diff to CPU {worst:.2e}",
            flush=True,
        )
        report["correctness"].append(
            {"case": name, "losses": losses, "reference": reference, "max_rel_diff": worst}
        )


def fidelity(args, report: dict) -> None:
    import torch

    from orchestrator.catalog import default_catalog
    from orchestrator.plan import Plan, Replica, check_plan
    from orchestrator.profiles import analytic_settings
    from orchestrator.profiles.analytic import analytic_profile
    from orchestrator.profiles.measured import measured_profile
    from orchestrator.simulator import simulate, views_for
    from runtime.models.specs import model_spec
    from runtime.profiler import ProfilerConfig, profile_gpt
    from runtime.reference import TrainConfig

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    gpu = args.gpu or next((g for g in ("H200", "H100", "A100") if g in name), "H100")
    spec = model_spec(args.model)
    catalog = default_catalog()
    # the simulator's place: where the catalog sells this GPU (one GPU: the place sets its price)
    offer = next(o for o in catalog.offers.offers if o.gpu == gpu)
    network, prices, settings = views_for(catalog, catalog.market(offer.location.cloud))
    started = time.perf_counter()
    measurement = profile_gpt(
        spec,
        ProfilerConfig(
            microbatch_sizes=(args.microbatch,), repeats=5, warmup=2, device=args.device
        ),
    )
    profile_s = time.perf_counter() - started
    measured = measured_profile(measurement, gpu=gpu, precision="fp32")
    estimated = analytic_profile(
        spec,
        [catalog.gpus.get(gpu)],
        precision="fp32",
        optimizer="adamw",
        microbatch_sizes=[args.microbatch],
        tp_degrees=[1],
        settings=analytic_settings(catalog),
    )
    n = spec.num_layers
    plan = Plan.from_pipelines(
        global_batch_size=args.global_batch,
        microbatch_size=args.microbatch,
        layers=[(0, n)],
        pipelines=[(1, [Replica(gpu=gpu, infra=str(offer.location))])],
        allreduce="flat",
        compression="none",
    )
    check_plan(plan)
    layout = _layout(
        args.model,
        [(0, n)],
        [[US_A]],
        [args.device],
        microbatch=args.microbatch,
        microbatches=args.global_batch // args.microbatch,
    )
    config = TrainConfig(
        steps=args.fidelity_steps,
        global_batch_size=args.global_batch,
        microbatch_size=args.microbatch,
    )
    losses, seconds, counters = _train(layout, config, gpu_share=1.0)
    ran_s = statistics.median(seconds[2:])  # the first steps pay allocation and kernel choice
    peak = counters[0]["peak_memory_bytes"]
    rows = {}
    for label, profile in (("measured profile", measured), ("analytic estimate", estimated)):
        estimate = simulate(profile, plan, network=network, prices=prices, settings=settings)
        rows[label] = {
            "predicted_s": estimate.iteration_time_s,
            "error": (estimate.iteration_time_s - ran_s) / ran_s,
            "predicted_memory_bytes": int(estimate.peak_memory_bytes),
        }
        print(
            f"{args.model} on {name} ({gpu}), mbs {args.microbatch} x "
            f"{args.global_batch // args.microbatch}: {label:18s} predicts "
            f"{estimate.iteration_time_s * 1e3:8.1f} ms, runtime measured {ran_s * 1e3:8.1f} ms "
            f"({rows[label]['error']:+.1%}); memory predicted {rows[label]['predicted_memory_bytes']} "
            f"measured {peak}",
            flush=True,
        )
    from orchestrator.profiles.profile import profile_to_json

    (Path(args.out) / f"{args.model}-{gpu}-fp32.json").write_text(
        json.dumps(profile_to_json(measured, gpu), indent=1)
    )
    layers = measurement.layers[args.microbatch]
    report["fidelity"] = {
        "device": name,
        "gpu": gpu,
        "model": args.model,
        "microbatch": args.microbatch,
        "global_batch": args.global_batch,
        "profile_s": profile_s,
        "step_s": seconds,
        "losses": losses,
        "runtime_step_s": ran_s,
        "runtime_peak_memory_bytes": peak,
        "predictions": rows,
        "layers_ms": [
            {
                "forward": x.forward_s * 1e3,
                "backward": x.backward_s * 1e3,
                "update": x.update_s * 1e3,
            }
            for x in layers
        ],
        "analytic_layers_ms": _layer_times(estimated, gpu, args.microbatch),
    }


def _layer_times(profile, gpu: str, microbatch: int) -> list[dict]:
    times = profile.time_table(gpu, microbatch, 1)
    return [
        {"forward": f * 1e3, "backward": b * 1e3}
        for f, b in zip(times.forward_s, times.backward_s, strict=True)
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--model", default="opt-350m")
    parser.add_argument("--gpu", default=None, help="the catalog's GPU name (default: from torch)")
    parser.add_argument("--microbatch", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--fidelity-steps", type=int, default=8)
    parser.add_argument("--nccl", type=int, default=0, help="GPUs for an NCCL layout (needs >1)")
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of this script")
    parser.add_argument("--skip", choices=("correctness", "fidelity"), action="append", default=[])
    args = parser.parse_args()

    import ray
    import torch

    gpus = torch.cuda.device_count()
    ray.init(
        num_cpus=8,
        num_gpus=gpus,
        resources={f"infra:{p}": 8.0 for p in PLACES},
        include_dashboard=False,
        log_to_driver=True,
    )
    report: dict = {"torch": torch.__version__, "gpus": gpus}
    try:
        if "correctness" not in args.skip:
            correctness(args, report)
        if "fidelity" not in args.skip:
            fidelity(args, report)
    finally:
        ray.shutdown()
        out = Path(args.out) / "gpu_check.json"
        out.write_text(json.dumps(report, indent=1))
        print(f"wrote {out}")


if __name__ == "__main__":
    main()
