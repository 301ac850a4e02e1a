"""``python -m orchestrator profile RECIPE -o profile.json``: measure the recipe's model here.

runtime/profiler.py times every layer's forward, backward and optimizer step on this machine's
device and measures its memory; this command turns the figures into a model profile (source
``measured``, docs/profile.md) for one GPU type, which a recipe then names in ``model.profile``.
The simulator keys profiles by GPU type: on a CPU-only machine the figures stand for the GPU that
the local simulated cloud rents (its workers are CPU slots standing in for that GPU), and the
profile's ``origin`` says so. torch is imported only when the command runs, so that
``import orchestrator`` stays free of it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.catalog import Catalog
from orchestrator.cli.output import format_table, print_json
from orchestrator.errors import UserError
from orchestrator.profiles.measured import measure_here
from orchestrator.profiles.profile import (
    profile_to_json,
)
from orchestrator.recipe import Recipe, load_recipe
from orchestrator.recipe.models import spec_of
from runtime.models.specs import ModelSpec

if TYPE_CHECKING:  # for annotations only: importing runtime.profiler imports torch
    from runtime.profiler import ModelMeasurement, ProfilerConfig

KIB = 1024


def add_profile(commands: argparse._SubParsersAction, formatter: type) -> None:
    p = commands.add_parser(
        "profile",
        help="measure the recipe's model layer by layer on this machine and write a profile",
        description="Time each layer's forward, backward and optimizer step (mean of --repeats runs "
        "after warm-up) and measure its parameters, bytes kept for backward and elements sent on, "
        "for each microbatch size, on this machine's device (CUDA if present, else CPU with one "
        "thread, like a local worker). Writes a profile .json (docs/profile.md) with source "
        "'measured' for one GPU type; point the recipe's model.profile at it and simulate/plan use it.",
        formatter_class=formatter,
        epilog="example:\n  python -m orchestrator profile recipes/quickstart.yaml -o gpt-tiny-t4.json "
        "--microbatch-sizes 1,2,4",
    )
    p.add_argument(
        "recipe", type=Path, metavar="RECIPE", help="a recipe .yaml (its model is measured)"
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        required=True,
        metavar="FILE",
        help="the profile .json to write",
    )
    p.add_argument(
        "--gpu",
        metavar="NAME",
        help="the GPU type the figures stand for (default: the one GPU type the recipe allows or "
        "its market offers, e.g. T4 on the local simulated cloud)",
    )
    p.add_argument(
        "--microbatch-sizes",
        metavar="SIZES",
        help="comma-separated microbatch sizes, e.g. 1,2,4 (default: the recipe's)",
    )
    p.add_argument("--repeats", type=int, default=5, metavar="N", help="timed runs per figure (5)")
    p.add_argument(
        "--warmup", type=int, default=2, metavar="N", help="untimed runs before them (2)"
    )
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="where to measure: auto (CUDA if torch sees one, else CPU)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=1,
        metavar="N",
        help="torch CPU threads while measuring (1: one local worker's CPU slot)",
    )
    p.add_argument(
        "--tp",
        metavar="DEGREES",
        help="comma-separated tensor-parallel degrees to measure too, e.g. 2,4: the model split "
        "over as many processes (one GPU each on CUDA, NCCL; gloo on the CPU), as a stage's "
        "workers run it (default: none, the model whole)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON document")
    p.set_defaults(run=run_profile)


def run_profile(args: argparse.Namespace, catalog: Catalog) -> int:
    recipe = load_recipe(args.recipe, catalog=catalog)
    spec = _profilable_spec(recipe)
    sizes = _microbatch_sizes(args.microbatch_sizes, recipe)
    _check_counts(args)
    gpu = _target_gpu(args.gpu, recipe, catalog)
    # torch is imported here only: `import orchestrator` must not pull it in
    from runtime.profiler import ProfilerConfig

    config = ProfilerConfig(
        microbatch_sizes=sizes,
        repeats=args.repeats,
        warmup=args.warmup,
        optimizer=recipe.training.optimizer.name,
        device=_device(args.device),
        threads=args.threads,
        seed=recipe.training.seed,
    )
    profile, measurement = measure_here(
        recipe, spec, config, gpu=gpu, tp_degrees=_tp_degrees(args.tp, spec, config.device)
    )
    document = profile_to_json(profile, gpu)
    document["measurement"] = _measurement_facts(measurement, config, gpu)
    _write(args.output, document)
    rows = _rows(spec, measurement)
    if args.json:
        print_json({"output": str(args.output), **_summary(document), "layers": rows})
        return 0
    _print(args.output, document, rows)
    return 0


def _tp_degrees(text: str | None, spec: ModelSpec, device: str) -> list[int]:
    """The ``--tp`` degrees above 1, each one the model splits and this machine can run."""
    from orchestrator.planner.space import splits

    if not text:
        return []
    try:
        degrees = sorted({int(part) for part in text.split(",")} - {1})
    except ValueError:
        raise UserError(f"--tp {text!r} is not whole numbers", fix="write e.g. --tp 2,4") from None
    for degree in degrees:
        if degree < 1 or not splits(spec, degree):
            raise UserError(
                f"--tp {degree}: {spec.name} does not split {degree} ways (its heads and widths "
                "must divide evenly, and only GPT-family models have a plan the planner uses)",
                fix="name degrees that divide the model's heads",
            )
        if device == "cuda":
            import torch

            if torch.cuda.device_count() < degree:
                raise UserError(
                    f"--tp {degree} needs {degree} GPUs; torch sees {torch.cuda.device_count()}",
                    fix="measure on a machine with that many GPUs, or a lower degree",
                )
    return degrees


def _profilable_spec(recipe: Recipe) -> ModelSpec:
    spec = spec_of(recipe.model)
    if spec.family == "cnn":
        raise UserError(
            f"the profiler measures language models (built-in GPTs, hf:, module:); {spec.name} "
            "is a CNN",
            field="model.name",
            fix="use profile: auto or analytic for this model, or profile a GPT model such as gpt-tiny",
        )
    if recipe.training.precision != "fp32":
        raise UserError(
            f"the profiler measures fp32 only; the recipe asks for {recipe.training.precision}",
            field="training.precision",
            fix="set training.precision: fp32 to profile, or use profile: auto or analytic for "
            "mixed-precision estimates",
        )
    return spec


def _microbatch_sizes(text: str | None, recipe: Recipe) -> tuple[int, ...]:
    if text is None:
        return tuple(recipe.training.microbatch_sizes)
    try:
        sizes = tuple(int(part) for part in text.split(","))
    except ValueError:
        sizes = ()
    if not sizes or any(size < 1 for size in sizes):
        raise UserError(
            f"--microbatch-sizes '{text}' is not a list of positive whole numbers",
            fix="write them comma-separated without spaces, e.g. --microbatch-sizes 1,2,4",
        )
    return tuple(sorted(set(sizes)))


def _check_counts(args: argparse.Namespace) -> None:
    for flag, value, least in (
        ("--repeats", args.repeats, 1),
        ("--warmup", args.warmup, 0),
        ("--threads", args.threads, 1),
    ):
        if value < least:
            raise UserError(f"{flag} {value} is below {least}", fix=f"give {flag} {least} or more")


def _target_gpu(name: str | None, recipe: Recipe, catalog: Catalog) -> str:
    """The catalog name of the GPU the figures stand for: ``--gpu``, else the only GPU type the
    recipe allows, else the only one its market offers."""
    if name is not None:
        spec = catalog.gpus.find(name)
        if spec is None:
            raise UserError(
                f"unknown GPU '{name}'",
                fix="name a GPU of `python -m orchestrator catalog gpus`, e.g. --gpu T4",
            )
        return spec.name
    if len(recipe.constraints.gpu_types) == 1:
        return recipe.constraints.gpu_types[0]
    market = catalog.market(recipe.provider, recipe.market_file())
    offered = sorted({offer.gpu for offer in market.query(gpus=recipe.constraints.gpu_types)})
    if len(offered) == 1:
        return offered[0]
    raise UserError(
        f"the recipe allows several GPU types ({', '.join(offered) or 'none offered'}); the profile "
        "is for one",
        fix="name the GPU the measurement stands for, e.g. --gpu T4",
    )


def _device(choice: str) -> str:
    import torch

    if choice == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if choice == "cuda" and not torch.cuda.is_available():
        raise UserError(
            "--device cuda, but torch sees no CUDA device here", fix="use --device cpu or auto"
        )
    return choice


def _measurement_facts(measurement: ModelMeasurement, config: ProfilerConfig, gpu: str) -> dict:
    """How the figures were taken; readers of the profile ignore this block (docs/profile.md)."""
    return {
        "device": measurement.device_name,
        "stands_in_for": gpu,
        "threads": measurement.threads,
        "torch_version": measurement.torch_version,
        "repeats": config.repeats,
        "warmup": config.warmup,
        "method": measurement.method,  # layers timed in one graph, or each alone
        "elapsed_s": measurement.elapsed_s,
    }


def _write(path: Path, document: dict) -> None:
    try:
        path.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")
    except OSError as exc:
        raise UserError(
            f"cannot write the profile: {exc.strerror}",
            file=str(path),
            fix="choose a writable path for -o",
        ) from None


def _layer_names(spec: ModelSpec) -> list[str]:
    return ["embedding", *(f"block {i}" for i in range(spec.num_blocks)), "head"]


def _rows(spec: ModelSpec, measurement: ModelMeasurement) -> list[dict]:
    rows = []
    for mbs, layers in sorted(measurement.layers.items()):
        for index, (name, t) in enumerate(zip(_layer_names(spec), layers, strict=True)):
            rows.append(
                {
                    "microbatch_size": mbs,
                    "layer": index,
                    "name": name,
                    "params": measurement.params[index],
                    "forward_ms": t.forward_s * 1000,
                    "backward_ms": t.backward_s * 1000,
                    "update_ms": t.update_s * 1000,
                    "kept_bytes": t.kept_bytes,
                    "out_bytes": t.out_elements * 4,  # fp32 activations
                }
            )
    return rows


def _summary(document: dict) -> dict:
    facts = document["measurement"]
    return {
        "model": document["model"],
        "gpu": document["gpu"],
        "source": document["source"],
        "device": facts["device"],
        "elapsed_s": facts["elapsed_s"],
    }


def _print(output: Path, document: dict, rows: list[dict]) -> None:
    facts = document["measurement"]
    print(
        f"profiled {document['model']} on {facts['device']} ({facts['threads']} thread(s)) in "
        f"{facts['elapsed_s']:.1f} s, standing for {document['gpu']}; wrote {output}"
    )
    table = [
        (
            r["microbatch_size"],
            r["layer"],
            r["name"],
            r["params"],
            r["forward_ms"],
            r["backward_ms"],
            r["update_ms"],
            r["kept_bytes"] / KIB,
            r["out_bytes"] / KIB,
        )
        for r in rows
    ]
    headers = (
        "mbs",
        "layer",
        "name",
        "params",
        "fwd_ms",
        "bwd_ms",
        "update_ms",
        "kept_kib",
        "out_kib",
    )
    print(format_table(headers, table))
    print(
        f"use it: set model.profile: {output} in the recipe (a path relative to the recipe's folder)"
    )
