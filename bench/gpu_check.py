"""The runtime on a real GPU: does it train right on CUDA, and does the simulator predict it?

Usage: python bench/gpu_check.py [--out DIR] [--name gpu_check] [--model opt-350m | hf:gpt2]
       [--hf-config small-sized|test|JSON] [--steps 6] [--skip correctness|hf|fidelity] [--quick]
       [--device cpu]

Needs a machine with one CUDA GPU (or more) and Ray; writes ``NAME.json`` (default
``gpu_check.json``) to ``--out``, again after every row, so a run cut short keeps what it did.
``--device cpu --quick`` is a dry run of the whole script on a CPU machine (tiny sizes, about a
minute): run it before spending device time. bench/gpu_session.sh is what a lent machine runs.

1. Correctness (Ray workers asking for GPUs, as the driver starts them): a small GPT trained
   for a few steps by
   - one CUDA worker;
   - 2 stages x 2 replicas of CUDA workers, each in its own place (zones of two regions): the
     pipeline's tensors and the hierarchical all-reduce go from GPU through host memory over gloo
     (``Layout.on_nccl`` is false across places); four workers share the one GPU;
   - a CUDA first stage feeding a CPU last stage (gloo between a GPU and a CPU worker);
   - a Hugging Face GPT-2 (small config, dropout off; the model protocol's ``hf`` source) by one
     CUDA worker, in fp32 and in bf16-mixed (``--skip hf`` leaves these out);
   each against the single-process run on the CPU (runtime/reference.py) in the same precision,
   step by step. ``--nccl N`` adds a data-parallel layout of N workers in one place, and the
   HF rows 2 stages x TP 2 over NCCL beside gloo: with fewer GPUs than ranks, the ranks sharing a
   GPU are NCCL hosts of their own (runtime/devices.py), so NCCL runs on a one-GPU machine too
   (over its socket transport); each row says how many NCCL groups its workers had.
2. Fidelity on the GPU: ``--model`` (a built-in model, or ``hf:gpt2`` built from ``--hf-config``:
   GPT-2 small's shape by default) profiled layer by layer on the GPU (runtime/profiler.py), a
   one-GPU plan simulated on that measured profile and on the analytic estimate for the catalog's
   GPU of that name, against the runtime's measured iteration time and peak memory there. fp32
   only: the profiler measures fp32 (no autocast; `orchestrator profile` refuses other
   precisions), so a bf16-mixed run would be compared with an fp32 profile; not done here.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

US_A, US_B = "gcp/us-central1/us-central1-a", "gcp/us-central1/us-central1-b"
EU_A, EU_B = "gcp/europe-west4/europe-west4-a", "gcp/europe-west4/europe-west4-b"
PLACES = (US_A, US_B, EU_A, EU_B)

_NO_DROPOUT = {"resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
# GPT2Config fields of the ``hf:gpt2`` models. Dropout off in both: a pipeline's workers draw
# their masks from other generators than one process does (correctness), and the built-in GPTs
# have none, so ``small-sized`` is gpt2-small's shape and work, through transformers' own classes.
HF_CONFIGS = {
    # tests/integration/test_gpu_runtime.py's: the correctness rows
    "test": {
        "n_layer": 4,
        "n_embd": 128,
        "n_head": 4,
        "n_positions": 64,
        "vocab_size": 512,
        **_NO_DROPOUT,
    },
    # GPT-2 small (124M): the fidelity run
    "small-sized": {
        "n_layer": 12,
        "n_embd": 768,
        "n_head": 12,
        "n_positions": 1024,
        "vocab_size": 50257,
        **_NO_DROPOUT,
    },
}
# where the GPU's sums differ from the CPU's (tests/integration/test_gpu_runtime.py's bounds)
TOLERANCE = {"fp32": 1e-4, "bf16-mixed": 2e-2}


def _hf_config(choice: str) -> dict:
    """A named config of HF_CONFIGS, or a JSON object of GPT2Config fields."""
    if choice in HF_CONFIGS:
        return dict(HF_CONFIGS[choice])
    try:
        config = json.loads(choice)
    except json.JSONDecodeError:
        config = None
    if not isinstance(config, dict):
        raise SystemExit(
            f"--hf-config {choice!r}: one of {', '.join(HF_CONFIGS)}, or a JSON object of "
            "GPT2Config fields"
        )
    return config


def _model(name: str, hf_config: str):
    """``name``'s model source and shape: a built-in model, or ``hf:gpt2`` built from
    ``hf_config`` (HF_CONFIGS' name or JSON)."""
    from runtime.models.protocol import ModelSource, builtin
    from runtime.models.specs import model_spec

    if not name.startswith("hf:"):
        return builtin(name), model_spec(name)
    from runtime.models.shapes import hf_spec

    source = ModelSource(kind="hf", target=name[3:], args=_hf_config(hf_config))
    return source, hf_spec(source.target, source.args, label=source.label)


def _layout(model, layers, pipelines, devices, *, microbatch, microbatches, tp=1, nccl=True):
    """``pipelines``: per replica, the place of each stage; ``devices``: per stage; ``tp``: the
    tensor-parallel degree of every stage; ``nccl``: False for gloo even between GPUs."""
    from runtime.layout import Layout, WorkerSpec

    workers = tuple(
        WorkerSpec(
            stage=s,
            replica=i,
            place=pipelines[i][s],
            device=devices[s],
            microbatches=microbatches,
            tp=tp,
            tp_rank=t,
        )
        for s in range(len(layers))
        for i in range(len(pipelines))
        for t in range(tp)
    )
    return Layout(
        model=model,
        layers=tuple(layers),
        workers=workers,
        microbatch_size=microbatch,
        warmup=tuple(len(layers) - 1 - s for s in range(len(layers))),
        allreduce="hierarchical",
        nccl=nccl,
    )


def _gpu_count(device: str) -> int:
    """The GPUs the CUDA rows share (1 on a dry run, whose rows run on the CPU)."""
    import torch

    return max(1, torch.cuda.device_count()) if device == "cuda" else 1


def _train(
    layout, config, *, gpu_share: float, model=None
) -> tuple[list[float], list[float], list[dict]]:
    """Losses and seconds of every step, and the workers' counters."""
    from runtime.group import WorkerGroup

    group = WorkerGroup.start(layout, config, gpu_share=gpu_share, timeout_s=300, model=model)
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


@dataclasses.dataclass(frozen=True)
class _Case:
    """One correctness row: ``model`` (a ModelSource) trained in ``precision`` by ``layers``
    split over ``pipelines`` (per replica, each stage's place) on ``devices`` (per stage)."""

    name: str
    model: object
    precision: str
    layers: list
    pipelines: list
    devices: list
    microbatches: int
    share: float
    tp: int = 1  # tensor-parallel degree of every stage
    nccl: bool = True  # False: gloo even between the GPUs of one place


def correctness(args, report: dict, save) -> None:
    from runtime.models.protocol import ModelSource, builtin
    from runtime.models.specs import model_spec
    from runtime.reference import TrainConfig, workload_losses
    from runtime.workload import build_workload

    mini = builtin("gpt-mini")
    n = model_spec(mini.target).num_layers  # embedding, blocks, head
    half = n // 2
    config = TrainConfig(steps=args.steps, global_batch_size=8, microbatch_size=2)
    cases = [
        _Case("1 CUDA worker", mini, "fp32", [(0, n)], [[US_A]], ["cuda"], 4, 1.0),
        _Case(
            "2 stages x 2 replicas, CUDA, 4 places (gloo)",
            mini,
            "fp32",
            [(0, half), (half, n)],
            [[US_A, US_B], [EU_A, EU_B]],
            ["cuda", "cuda"],
            2,
            0.25,
        ),
        _Case(
            "CUDA stage -> CPU stage (gloo)",
            mini,
            "fp32",
            [(0, half), (half, n)],
            [[US_A, US_B]],
            ["cuda", "cpu"],
            4,
            0.5,
        ),
    ]
    gpus = _gpu_count(args.device)
    if args.nccl > 1:
        cases.append(
            _Case(
                f"DP{args.nccl} CUDA in one place (NCCL)",
                mini,
                "fp32",
                [(0, n)],
                [[US_A]] * args.nccl,
                ["cuda"],
                4 // args.nccl or 1,
                min(1.0, gpus / args.nccl),
            )
        )
    if "hf" not in args.skip:
        # no transformers import here: without it these rows fail one by one, the rest run
        gpt2 = ModelSource(kind="hf", target="gpt2", args=HF_CONFIGS["test"])
        layers = HF_CONFIGS["test"]["n_layer"] + 2  # embedding, blocks, head (models/hf.py)
        for precision in ("fp32", "bf16-mixed"):
            cases.append(
                _Case(
                    f"HF GPT-2, 1 CUDA worker, {precision}",
                    gpt2,
                    precision,
                    [(0, layers)],
                    [[US_A]],
                    ["cuda"],
                    4,
                    1.0,
                )
            )
        # tensor parallelism: 2 stages x TP 2, four workers (sharing GPUs where there are fewer)
        backends = [("gloo", False)] + ([("NCCL", True)] if args.nccl > 1 else [])
        for precision in ("fp32", "bf16-mixed"):
            for backend, nccl in backends:
                cases.append(
                    _Case(
                        f"HF GPT-2, 2 stages x TP 2, CUDA ({backend}), {precision}",
                        gpt2,
                        precision,
                        [(0, layers // 2), (layers // 2, layers)],
                        [[US_A, US_A]],
                        ["cuda", "cuda"],
                        4,
                        min(1.0, gpus / 4),
                        tp=2,
                        nccl=nccl,
                    )
                )
    report["correctness"] = []
    references: dict = {}  # (model, precision) -> the CPU's losses
    for case in cases:
        devices = [args.device if d == "cuda" else d for d in case.devices]  # cpu: a dry run
        layout = _layout(
            case.model.label,
            case.layers,
            case.pipelines,
            devices,
            microbatch=2,
            microbatches=case.microbatches,
            tp=case.tp,
            nccl=case.nccl,
        )
        run = dataclasses.replace(config, precision=case.precision)
        try:
            key = (case.model.label, repr(sorted(case.model.args.items())), case.precision)
            if key not in references:
                references[key] = workload_losses(build_workload(case.model, seed=run.seed), run)
            reference = references[key]
            losses, seconds, counters = _train(layout, run, gpu_share=case.share, model=case.model)
        except Exception as error:  # noqa: BLE001  (a case's failure is reported, the rest run)
            print(f"{case.name:48s} FAILED: {type(error).__name__}: {error}", flush=True)
            report["correctness"].append(
                {"case": case.name, "precision": case.precision, "error": str(error)[-2000:]}
            )
            save()
            continue
        worst = max(abs(a - b) / abs(b) for a, b in zip(losses, reference, strict=True))
        within = worst <= TOLERANCE[case.precision]
        nccl_groups = max(c.get("nccl_groups", 0) for c in counters)
        print(
            f"{case.name:48s} losses {[round(x, 5) for x in losses]}  max rel. diff to CPU "
            f"{worst:.2e} ({'within' if within else 'OVER'} {TOLERANCE[case.precision]:.0e}); "
            f"NCCL groups {nccl_groups}",
            flush=True,
        )
        report["correctness"].append(
            {
                "case": case.name,
                "model": case.model.label,
                "precision": case.precision,
                "losses": losses,
                "reference": reference,
                "max_rel_diff": worst,
                "tolerance": TOLERANCE[case.precision],
                "step_s": seconds,
                "nccl_groups": nccl_groups,
                "gpu_shared": any(c.get("gpu_shared") for c in counters),
            }
        )
        save()


def fidelity(args, report: dict, save) -> None:
    import torch

    from orchestrator.catalog import default_catalog
    from orchestrator.plan import Plan, Replica, check_plan
    from orchestrator.profiles import analytic_settings
    from orchestrator.profiles.analytic import analytic_profile
    from orchestrator.profiles.measured import measured_profile
    from orchestrator.profiles.profile import profile_to_json
    from orchestrator.simulator import simulate, views_for
    from runtime.models.protocol import build_model
    from runtime.profiler import ProfilerConfig, profile_model
    from runtime.reference import TrainConfig

    name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    gpu = args.gpu or next((g for g in ("H200", "H100", "A100") if g in name), "H100")
    source, spec = _model(args.model, args.hf_config)
    catalog = default_catalog()
    # the simulator's place: where the catalog sells this GPU (one GPU: the place sets its price)
    offer = next(o for o in catalog.offers.offers if o.gpu == gpu)
    network, prices, settings = views_for(catalog, catalog.market(offer.location.cloud))
    started = time.perf_counter()
    # fp32 only: the profiler runs no autocast (see the module's docstring)
    profiler = ProfilerConfig(
        microbatch_sizes=(args.microbatch,),
        repeats=args.repeats,
        warmup=args.warmup,
        device=args.device,
        seed=0,
    )
    measurement = profile_model(source.label, build_model(source, seed=profiler.seed), profiler)
    profile_s = time.perf_counter() - started
    if torch.cuda.is_available():
        gc.collect()
        torch.cuda.empty_cache()  # the profiled copy's memory back to the GPU for the worker
    measured = measured_profile(measurement, gpu=gpu, precision="fp32", spec=spec)
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
        source.label,
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
    report["fidelity"] = {
        "device": name,
        "gpu": gpu,
        "model": source.label,
        "model_args": dict(source.args),
        "precision": "fp32",
        "microbatch": args.microbatch,
        "global_batch": args.global_batch,
        "profile_s": profile_s,
        "profiler_method": measurement.method,
        "layers_ms": [
            {
                "forward": x.forward_s * 1e3,
                "backward": x.backward_s * 1e3,
                "update": x.update_s * 1e3,
            }
            for x in measurement.layers[args.microbatch]
        ],
        "analytic_layers_ms": _layer_times(estimated, gpu, args.microbatch),
        "measured_profile": profile_to_json(measured, gpu),
    }
    save()  # the profile is kept should the runtime's run fail
    label = args.model if source.kind == "builtin" else f"{source.label} ({args.hf_config})"
    print(f"{label}: profiled on {name} in {profile_s:.1f} s ({measurement.method})", flush=True)
    losses, seconds, counters = _train(layout, config, gpu_share=1.0, model=source)
    ran_s = statistics.median(seconds[2:])  # the first steps pay allocation and kernel choice
    peak = counters[0]["peak_memory_bytes"]
    rows = {}
    for what, profile in (("measured profile", measured), ("analytic estimate", estimated)):
        estimate = simulate(profile, plan, network=network, prices=prices, settings=settings)
        rows[what] = {
            "predicted_s": estimate.iteration_time_s,
            "error": (estimate.iteration_time_s - ran_s) / ran_s,
            "predicted_memory_bytes": int(estimate.peak_memory_bytes),
        }
        print(
            f"{label} on {name} ({gpu}), mbs {args.microbatch} x "
            f"{args.global_batch // args.microbatch}: {what:18s} predicts "
            f"{estimate.iteration_time_s * 1e3:8.1f} ms, runtime measured {ran_s * 1e3:8.1f} ms "
            f"({rows[what]['error']:+.1%}); memory predicted {rows[what]['predicted_memory_bytes']} "
            f"measured {peak}",
            flush=True,
        )
    (Path(args.out) / f"{_file_name(source.label)}-{gpu}-fp32.json").write_text(
        json.dumps(profile_to_json(measured, gpu), indent=1)
    )
    report["fidelity"].update(
        {
            "step_s": seconds,
            "losses": losses,
            "runtime_step_s": ran_s,
            "runtime_peak_memory_bytes": peak,
            "predictions": rows,
        }
    )


def _file_name(label: str) -> str:
    return label.replace(":", "-").replace("/", "-")


def _layer_times(profile, gpu: str, microbatch: int) -> list[dict]:
    times = profile.time_table(gpu, microbatch, 1)
    return [
        {"forward": f * 1e3, "backward": b * 1e3}
        for f, b in zip(times.forward_s, times.backward_s, strict=True)
    ]


# --quick: tiny sizes for a dry run (with --device cpu) or a first look; explicit flags win
QUICK = {
    "model": "gpt-tiny",
    "hf_config": "test",
    "steps": 2,
    "fidelity_steps": 4,  # the median skips the first two steps
    "microbatch": 2,
    "global_batch": 4,
    "repeats": 1,
    "warmup": 1,
}
FULL = {
    "model": "opt-350m",
    "hf_config": "small-sized",
    "steps": 6,
    "fidelity_steps": 8,
    "microbatch": 2,
    "global_batch": 16,
    "repeats": 5,
    "warmup": 2,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=".")
    parser.add_argument("--name", default="gpu_check", help="the report is NAME.json in --out")
    parser.add_argument(
        "--model", help="a built-in model, or hf:gpt2 (default opt-350m; --quick: gpt-tiny)"
    )
    parser.add_argument(
        "--hf-config",
        help=f"hf:gpt2's GPT2Config fields: {' or '.join(HF_CONFIGS)} (default small-sized; "
        "--quick: test), or a JSON object",
    )
    parser.add_argument("--gpu", default=None, help="the catalog's GPU name (default: from torch)")
    parser.add_argument("--microbatch", type=int)
    parser.add_argument("--global-batch", type=int)
    parser.add_argument("--steps", type=int, help="correctness: steps per row")
    parser.add_argument("--fidelity-steps", type=int)
    parser.add_argument("--repeats", type=int, help="profiler: timed runs per figure")
    parser.add_argument("--warmup", type=int, help="profiler: untimed runs first")
    parser.add_argument(
        "--nccl",
        type=int,
        default=0,
        help="ranks of an NCCL DP layout, and TP rows over NCCL (>1; may exceed the GPUs)",
    )
    parser.add_argument("--device", default="cuda", help="cpu: a dry run of this script")
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a dry run's)")
    parser.add_argument(
        "--skip",
        choices=("correctness", "hf", "fidelity"),
        action="append",
        default=[],
        help="hf: the Hugging Face GPT-2 rows of the correctness part",
    )
    args = parser.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.fidelity_steps < 3:
        parser.error("--fidelity-steps: at least 3 (the median skips the first two)")
    if args.model.startswith("hf:"):
        _hf_config(args.hf_config)  # a wrong --hf-config stops here, not after the first part

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
    report: dict = {"torch": torch.__version__, "gpus": gpus, "args": vars(args), "seconds": {}}
    try:
        import transformers

        report["transformers"] = transformers.__version__
    except ImportError:
        report["transformers"] = None
    out = Path(args.out) / f"{args.name}.json"
    Path(args.out).mkdir(parents=True, exist_ok=True)

    def save() -> None:
        out.write_text(json.dumps(report, indent=1))

    failed = []
    try:
        for part, run in (("correctness", correctness), ("fidelity", fidelity)):
            if part in args.skip:
                continue
            started = time.perf_counter()
            try:
                run(args, report, save)
            except Exception as error:  # noqa: BLE001  (the other part still runs)
                traceback.print_exc()
                report[f"{part}_error"] = f"{type(error).__name__}: {error}"[-2000:]
                failed.append(part)
            finally:
                report["seconds"][part] = time.perf_counter() - started
                print(f"[{part}: {report['seconds'][part]:.0f} s]", flush=True)
                save()
    finally:
        ray.shutdown()
        save()
        print(f"wrote {out}")
    failed += [
        r["case"] + (" (error)" if "error" in r else " (over tolerance)")
        for r in report.get("correctness", [])
        if "error" in r or r["max_rel_diff"] > r["tolerance"]
    ]
    if failed:
        sys.exit(f"failed: {'; '.join(failed)}")


if __name__ == "__main__":
    main()
