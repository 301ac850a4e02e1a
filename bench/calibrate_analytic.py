"""Fit the analytic profile estimate (configs/simulator.yaml, section ``analytic``) to SAILOR's profiles.

Usage: python bench/calibrate_analytic.py [--current] [--write] [--points]

What is fitted, to what
  The forward and backward times of the transformer BLOCK layers (not the embedding or the head)
  that SAILOR measured with Megatron-DeepSpeed in fp16 (configs/profiles/sailor/<model>/<gpu>/
  profile.json); the blocks of one (model, GPU, microbatch, TP) have near-identical times and their
  median is one point. Training set: OPT-350 and GPT-Neo-2.7, TP=1, every microbatch size, on every
  GPU SAILOR profiled them on (A100-40, A100-80, V100-16 both models; GH-96, RTX-2080, RTX-3090,
  Titan-RTX OPT-350 only). Files whose layer count differs from SAILOR's llm_info.json are skipped
  (GPT-Neo-2.7 on GH-96 is a copy of OPT-350's). SAILOR's folder names map to catalog GPUs with
  ``catalog.gpus.find``.

  Per GPU: compute_efficiency and memory_efficiency. Shared: backward_factor, layer_overhead_s and
  elementwise_bytes_per_token_hidden. The fit minimises the mean squared log(predicted / measured)
  (Levenberg-Marquardt, numpy only; efficiencies kept in (0, 1), overhead >= 0).

What the data cannot tell apart (the fit says so instead of pretending)
  - Within one model every term of the estimate is linear in the microbatch size, so one model on
    one GPU fixes only the sum "compute time + memory time" per microbatch: memory_efficiency is
    identifiable only on GPUs with both models. The GPUs with OPT-350 only get the median of the
    identifiable GPUs' memory_efficiency (which is ``default``), and their compute_efficiency
    absorbs the rest.
  - elementwise_bytes_per_token_hidden trades exactly against the per-GPU efficiencies (2 models x
    3 GPUs give 6 slopes for 7 unknowns): the objective is flat in it until an efficiency reaches 1.
    It is profiled on a grid and the smallest value within 0.1% of the best objective is kept.
  - ``default`` efficiencies (GPUs SAILOR never measured) are the medians of the per-GPU fits.

Evaluation
  - in-sample errors, per GPU and model;
  - leave one model out, two ways: (a) per GPU that has both models, drop one model on that GPU,
    refit everything else, predict the dropped cell (the situation of GH200 and the RTX GPUs, which
    SAILOR profiled with one model); (b) fit on one model only (every GPU) and predict the other,
    where memory_efficiency must be assumed: shown for several assumed values;
  - the small models at TP>1 (tests the tensor-parallel all-reduce term, which is not fitted);
  - OPT-30 and LLAMA-3-8, reported apart: SAILOR's data for them look inconsistent (see the
    diagnostics printed: achieved FLOPS, and the shape SAILOR actually profiled for LLAMA-3-8).

update_memory_efficiency (the optimizer step, ``update_seconds``)
  SAILOR's ``u`` is the same on every layer of a file. orchestrator/profiles/sailor.py reads it as
  the optimizer step of the whole model; SAILOR's profiler (third_party/Megatron-DeepSpeed/
  profile.sh: ``--num-layers 2``; megatron/training.py writes DeepSpeed's step timer as ``u``; read
  in the copy of SAILOR at github.com/saha18uiuc/sailor, 13b79423) ran a model of the embedding,
  TWO blocks and the head; LLAMA-3-8 was run at seq 8192 (profile_all.py). The fit is printed both ways, with the parameters
  per GPU of the whole model (as sailor.py reads it) and of the profiled 2-block model, and the
  second is the one written (the first needs more than the GPU's peak bandwidth). Training: the
  non-zero ``u`` of OPT-350 and GPT-Neo-2.7 (median over microbatch sizes, every TP); held out:
  OPT-30 and LLAMA-3-8.

Predictions come from the project's estimator (orchestrator.profiles.analytic.analytic_profile):
its per-point parts (compute, attention-score traffic, hidden traffic, TP all-reduce) are read off
the estimator once and recombined for the search; every error printed for the written values is
recomputed through the estimator itself (and checked to agree). Values are rounded to 3 significant
figures; the errors printed are those of the rounded values, i.e. of what simulator.yaml holds.

--current evaluates the values now in configs/simulator.yaml instead of fitting.
--write   puts the fitted (rounded) values into configs/simulator.yaml; only the keys of the
          analytic section change (the calibration source's note is edited by hand).
--points  prints every point, not only summaries.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from analytic_fit import (  # noqa: E402
    FLAT,
    SUSPECT_MODELS,
    TRAIN_MODELS,
    Parts,
    Point,
    Subset,
    UpdatePoint,
    block_times,
    fit,
    fit_profiled,
    fit_update,
    load_points,
    load_update_points,
    update_at_one,
)

from orchestrator.catalog import default_catalog  # noqa: E402
from orchestrator.catalog.gpus import GpuSpec  # noqa: E402
from orchestrator.profiles import analytic_settings  # noqa: E402
from orchestrator.profiles.analytic import (  # noqa: E402
    AnalyticSettings,
    PerGpu,
)
from runtime.models.specs import GptSpec  # noqa: E402

# ---------------------------------------------------------------------------------------------
# Report


def dev(ratios) -> str:
    d = np.abs(np.asarray(ratios) - 1.0)
    if len(d) == 0:
        return "n=0"
    return f"n={len(d):3d}  median |ratio-1| {np.median(d):6.1%}  max {d.max():7.1%}"


def by_key_summary(title: str, points: list[Point], ratios: np.ndarray, key) -> None:
    print(f"\n-- {title} --")
    print(
        f"  {'all':34s} {dev(ratios)}   (fwd: {dev(ratios[_mask(points, 'fwd')])[6:]}; "
        f"bwd: {dev(ratios[_mask(points, 'bwd')])[6:]})"
    )
    keys = sorted({key(p) for p in points})
    for k in keys:
        mask = np.array([key(p) == k for p in points])
        rs = ratios[mask]
        print(
            f"  {' '.join(str(x) for x in k):34s} {dev(rs)}   geometric-mean ratio "
            f"{math.exp(float(np.mean(np.log(rs)))):.2f}"
        )


def _mask(points, passname):
    return np.array([p.passname == passname for p in points])


def print_points(title: str, points: list[Point], predicted: np.ndarray) -> None:
    print(f"\n== {title} ==")
    print(
        f"{'model':12s} {'gpu':10s} {'catalog':10s} {'tp':>2s} {'mbs':>3s} {'pass':4s} "
        f"{'measured_s':>11s} {'predicted_s':>11s} {'ratio':>6s}"
    )
    order = sorted(
        range(len(points)),
        key=lambda i: (
            points[i].model,
            points[i].folder,
            points[i].tp,
            points[i].mbs,
            points[i].passname != "fwd",
        ),
    )
    for i in order:
        p = points[i]
        print(
            f"{p.model:12s} {p.folder:10s} {p.gpu.name:10s} {p.tp:2d} {p.mbs:3d} {p.passname:4s} "
            f"{p.measured_s:11.6f} {predicted[i]:11.6f} {predicted[i] / p.measured_s:6.3f}"
        )


def print_values(settings: AnalyticSettings, gpus: list[GpuSpec]) -> None:
    print(
        f"  {'GPU':10s} {'compute_eff':>11s} {'memory_eff':>10s} {'matmul TFLOPS':>13s} "
        f"{'(fp16 peak, fp32 peak)':>22s} {'GB/s achieved':>13s}"
    )
    for gpu in gpus:
        ce, me = settings.compute_for(gpu.name), settings.memory_for(gpu.name)
        own = dict(settings.memory_efficiency.by_gpu)
        mark = "" if gpu.name in own else " (default)"
        print(
            f"  {gpu.name:10s} {ce:11.3g} {me:10.3g}{mark:10s} {ce * gpu.peak_fp16_tflops:7.1f}"
            f"      ({gpu.peak_fp16_tflops:g}, {gpu.peak_fp32_tflops:g})"
            f" {me * gpu.memory_bandwidth_gb_per_s:10.0f}"
        )
    print(
        f"  default    {settings.compute_efficiency.default:11.3g} "
        f"{settings.memory_efficiency.default:10.3g}"
    )
    print(
        f"  backward_factor {settings.backward_factor:g}, layer_overhead_s "
        f"{settings.layer_overhead_s:g}, elementwise_bytes_per_token_hidden "
        f"{settings.elementwise_bytes_per_token_hidden:g}, update_memory_efficiency "
        f"{settings.update_memory_for('default'):g}"
    )


def leave_one_cell_out(parts, train_idx, points, elementwise) -> None:
    print("\n== Leave one model out (a): drop one model on one GPU, refit the rest, predict it ==")
    print(
        "   (the GPU then has one model: its memory_efficiency is the others' median, as for "
        "GH200 and the RTX GPUs in the config)"
    )
    train = [points[i] for i in train_idx]
    gpus_both = sorted(
        {p.gpu.name for p in train if p.model == TRAIN_MODELS[1]}
        & {p.gpu.name for p in train if p.model == TRAIN_MODELS[0]}
    )
    all_ratios = []
    for gpu in gpus_both:
        for model in TRAIN_MODELS:
            test = np.array(
                [i for i in train_idx if points[i].gpu.name == gpu and points[i].model == model]
            )
            dropped = set(test.tolist())
            rest = np.array([i for i in train_idx if i not in dropped])
            f = fit(parts, rest, points, elementwise)
            ratios = (
                Subset(parts, test).predict(
                    np.array([f.compute[gpu]] * len(test)),
                    np.array([f.memory.get(gpu, f.memory_default)] * len(test)),
                    f.backward_factor,
                    f.overhead_s,
                    f.elementwise,
                )
                / parts.measured[test]
            )
            all_ratios.extend(ratios)
            print(
                f"  {model:12s} on {gpu:10s} {dev(ratios)}   geometric-mean ratio "
                f"{math.exp(float(np.mean(np.log(ratios)))):.2f}"
            )
    print(f"  {'all':27s} {dev(all_ratios)}")


def one_model_only(parts, train_idx, points, elementwise, memory_default) -> None:
    print("\n== Leave one model out (b): fit on one model only (every GPU), predict the other ==")
    print(
        "   One model cannot split compute from memory time, so memory_efficiency is ASSUMED "
        "(same on every GPU);\n   the first row uses the full fit's default (which saw both "
        "models: optimistic)."
    )
    priors = [memory_default, memory_default / 2, memory_default * 2, 0.5]
    for prior in priors:
        for train_model, test_model in (TRAIN_MODELS, TRAIN_MODELS[::-1]):
            tr = np.array([i for i in train_idx if points[i].model == train_model])
            f = fit(parts, tr, points, elementwise, memory_prior=prior)
            test = np.array(
                [
                    i
                    for i in train_idx
                    if points[i].model == test_model and points[i].gpu.name in f.compute
                ]
            )
            sub = Subset(parts, test)
            ce = np.array([f.compute[parts.gpus[i]] for i in test])
            ratios = (
                sub.predict(
                    ce, np.full(len(test), prior), f.backward_factor, f.overhead_s, f.elementwise
                )
                / parts.measured[test]
            )
            per_gpu = []
            for g in sorted({parts.gpus[i] for i in test}):
                m = np.array([parts.gpus[i] == g for i in test])
                d = np.abs(ratios[m] - 1)
                per_gpu.append(f"{g} {np.median(d):.0%}/{d.max():.0%}")
            print(
                f"  memory_eff {prior:5.3g}  {train_model:11s} -> {test_model:11s} "
                f"{dev(ratios)}  per GPU median/max: {', '.join(per_gpu)}"
            )


def sailor_shape(spec: GptSpec) -> GptSpec:
    """The shape SAILOR's profiler ran (profile_all.py, llm_info.json): LLAMA-3-8 differs from ours."""
    if spec.sailor_name != "LLAMA-3-8":
        return spec
    return dataclasses.replace(
        spec, seq_len=8192, num_kv_heads=None, ffn_hidden_size=16384, vocab_size=50304
    )


def suspect_diagnostics(points: list[Point], settings: AnalyticSettings) -> None:
    print("\n== Why OPT-30 and LLAMA-3-8 are reported apart ==")
    print(
        "achieved block matmul rate (fwd, TP=1 or the least TP, largest mbs) = matmul FLOPs / "
        "measured time (LLAMA-3-8: FLOPs of the shape SAILOR ran):"
    )
    fwd = [p for p in points if p.passname == "fwd"]
    compute = Parts(fwd, lambda p: sailor_shape(p.spec)).compute  # seconds at peak
    best: dict[tuple, tuple] = {}
    for p, c in zip(fwd, compute, strict=True):
        key = (p.model, p.folder)
        rank = (-p.tp, p.mbs)
        if key not in best or rank > best[key][0]:
            best[key] = (rank, p, c)
    for (model, folder), (_, p, c) in sorted(best.items()):
        tflops = c * p.gpu.peak_fp16_tflops / p.measured_s
        print(
            f"  {model:12s} {folder:10s} tp {p.tp} mbs {p.mbs:3d}: {tflops:6.1f} TFLOPS = "
            f"{tflops / p.gpu.peak_fp16_tflops:5.1%} of fp16 peak {p.gpu.peak_fp16_tflops:g} "
            f"(fp32 peak {p.gpu.peak_fp32_tflops:g})"
        )
    llama = [p for p in points if p.model == "LLAMA-3-8"]
    if llama:
        spec = llama[0].spec
        shape = sailor_shape(spec)
        print(
            "LLAMA-3-8: SAILOR's profiler ran seq 8192 (profile_all.py; llm_info.json's block output "
            f"is {8192 * spec.hidden_size} = 8192 x {spec.hidden_size} elements), full multi-head "
            "attention and a 16384 FFN (its block has 268.5M parameters; ours "
            f"{spec.block_parameters() / 1e6:.1f}M, seq {spec.seq_len}). With that shape "
            f"({shape.block_parameters() / 1e6:.1f}M per block):"
        )
        for label, spec_for in (("our llama-3-8b spec", None), ("SAILOR's shape", lambda p: shape)):
            ratios = block_times(llama, settings, spec_for) / np.array(
                [p.measured_s for p in llama]
            )
            print(
                f"  {label:20s} {dev(ratios)}   geometric-mean ratio "
                f"{math.exp(float(np.mean(np.log(ratios)))):.2f}"
            )
            for folder in sorted({p.folder for p in llama}):
                m = np.array([p.folder == folder for p in llama])
                print(
                    f"    {folder:10s} {dev(ratios[m])}   geometric-mean ratio "
                    f"{math.exp(float(np.mean(np.log(ratios[m])))):.2f}"
                )


def print_update(points: list[UpdatePoint], efficiency: float, label: str, which: str) -> None:
    print(f"  {label}: update_memory_efficiency {efficiency:.3g}")
    for group, models in (("training", TRAIN_MODELS), ("held out", SUSPECT_MODELS)):
        sel = [p for p in points if p.model in models]
        ratios = [update_at_one(p, getattr(p, which)) / efficiency / p.measured_s for p in sel]
        print(f"    {group:9s} {dev(ratios)}")
        for model in models:
            rs = [r for p, r in zip(sel, ratios, strict=True) if p.model == model]
            if rs:
                needed = [
                    update_at_one(p, getattr(p, which)) / p.measured_s
                    for p in sel
                    if p.model == model
                ]
                print(
                    f"      {model:12s} {dev(rs)}   efficiency each point needs: "
                    f"{min(needed):.2f}..{max(needed):.2f}"
                )


def write_config(path: Path, settings: AnalyticSettings) -> None:
    text = path.read_text(encoding="utf-8")
    start = text.index("\nanalytic:")
    end = text.find("\n\n", start + 1)
    end = len(text) if end < 0 else end

    def per_gpu(name: str, value: PerGpu) -> list[str]:
        plain = value.as_plain()
        if not isinstance(plain, dict):
            return [f"  {name}: {plain!r}"]
        return [f"  {name}:"] + [f"    {k}: {v!r}" for k, v in plain.items()]

    lines = [
        "",
        "analytic:",
        "  # Fitted by bench/calibrate_analytic.py --write (see the calibration source); GPUs not",
        "  # listed take default. Keys are catalog GPU names (configs/gpus.yaml), not aliases.",
        *per_gpu("compute_efficiency", settings.compute_efficiency),
        *per_gpu("memory_efficiency", settings.memory_efficiency),
        *per_gpu("update_memory_efficiency", settings.update_memory_efficiency),
        f"  backward_factor: {settings.backward_factor!r}",
        f"  layer_overhead_s: {settings.layer_overhead_s!r}",
        f"  elementwise_bytes_per_token_hidden: {settings.elementwise_bytes_per_token_hidden!r}",
        "  source: calibration",
    ]
    path.write_text(text[:start] + "\n".join(lines) + text[end:], encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--current", action="store_true", help="evaluate configs/simulator.yaml's values, no fit"
    )
    parser.add_argument(
        "--write", action="store_true", help="write the fitted values to configs/simulator.yaml"
    )
    parser.add_argument("--points", action="store_true", help="print every point")
    args = parser.parse_args()
    if args.write and args.current:
        raise SystemExit("--write needs a fit; drop --current")
    started = time.perf_counter()
    catalog = default_catalog()
    points, notes = load_points(catalog)
    for note in notes:
        print(note)
    parts = Parts(points)
    train_idx = np.array([i for i, p in enumerate(points) if p.group == "train"])
    updates = load_update_points(catalog)
    update_train = [p for p in updates if p.model in TRAIN_MODELS]

    if args.current:
        settings = analytic_settings(catalog)
        print("\nValues of configs/simulator.yaml (no fit):")
        chosen = None
    else:
        chosen, fits = fit_profiled(parts, train_idx, points)
        print(
            f"\nFit: {len(train_idx)} training points (OPT-350 and GPT-Neo-2.7, TP=1, every mbs, "
            f"{len({points[i].folder for i in train_idx})} GPUs)"
        )
        print(
            "elementwise_bytes_per_token_hidden profile (the objective is flat until an "
            "efficiency reaches 1):"
        )
        opt30 = np.array(
            [
                i
                for i, p in enumerate(points)
                if p.model == "OPT-30" and p.folder in ("GH-96", "V100-16")
            ]
        )
        for f in fits:
            a100 = ", ".join(
                f"{g} {v:.3f}" for g, v in sorted(f.compute.items()) if g.startswith("A100")
            )
            r30 = parts.predict_settings(f.settings())[opt30] / parts.measured[opt30]
            print(
                f"  E={f.elementwise:5g}: mean squared log-ratio {f.objective:.6f}   "
                f"compute_efficiency {a100}, GH200 {f.compute['GH200']:.3f}   [OPT-30 on GH-96 "
                f"and V100, not used: median |ratio-1| {np.median(np.abs(r30 - 1)):.1%}]"
            )
        print(f"kept E={chosen.elementwise:g} (smallest within {FLAT:.1%} of the best)")
        whole = fit_update(update_train, "whole_params")
        profiled = fit_update(update_train, "profiled_params")
        settings = chosen.settings(profiled, rounded=True)
        print("Fitted values (3 significant figures; the errors below are of these):")
    print_values(settings, sorted({p.gpu for p in points}, key=lambda g: g.name))

    # The errors, through the estimator itself.
    predicted = block_times(points, settings)
    assert np.allclose(predicted, parts.predict_settings(settings), rtol=1e-9, atol=0), (
        "the recombined parts disagree with the estimator"
    )
    ratios = predicted / parts.measured
    groups = {
        g: np.array([i for i, p in enumerate(points) if p.group == g])
        for g in ("train", "tp>1", *SUSPECT_MODELS)
    }

    def show(title, group, key):
        idx = groups[group]
        sel = [points[i] for i in idx]
        if args.points:
            print_points(title, sel, predicted[idx])
        by_key_summary(title, sel, ratios[idx], key)

    show("In-sample: training set, by GPU and model", "train", lambda p: (p.folder, p.model))
    if chosen is not None:
        leave_one_cell_out(parts, train_idx, points, chosen.elementwise)
        one_model_only(parts, train_idx, points, chosen.elementwise, chosen.memory_default)
    show(
        "Not fitted: OPT-350 / GPT-Neo-2.7 at TP>1 (the all-reduce term), by GPU and TP",
        "tp>1",
        lambda p: (p.folder, p.model, f"tp{p.tp}"),
    )
    show("Reported apart: OPT-30, by GPU and TP", "OPT-30", lambda p: (p.folder, f"tp{p.tp}"))
    show("Reported apart: LLAMA-3-8, by GPU and TP", "LLAMA-3-8", lambda p: (p.folder, f"tp{p.tp}"))
    suspect_diagnostics(points, settings)

    print("\n== Optimizer step (update_seconds) vs SAILOR's non-zero u ==")
    print(
        f"  {len(update_train)} training points (OPT-350, GPT-Neo-2.7: (GPU, TP) with u > 0), "
        f"{len(updates) - len(update_train)} held out (OPT-30, LLAMA-3-8 on GH-96)"
    )
    if chosen is not None:
        print_update(
            updates, whole, "u read as the whole model's step (sailor.py's reading)", "whole_params"
        )
        print_update(
            updates,
            profiled,
            "u read as the profiled 2-block model's step (written)",
            "profiled_params",
        )
    else:
        print_update(
            updates,
            settings.update_memory_for("default"),
            "u read as the profiled 2-block model's step",
            "profiled_params",
        )
    bwd_fwd = {}
    for p in points:
        if p.group == "train":
            bwd_fwd.setdefault((p.folder, p.model, p.mbs), {})[p.passname] = p.measured_s
    spread = [v["bwd"] / v["fwd"] for v in bwd_fwd.values()]
    print(
        f"\nmeasured block backward/forward over the training set: {min(spread):.2f}.."
        f"{max(spread):.2f} (median {statistics.median(spread):.2f}); "
        f"backward_factor {settings.backward_factor:g}"
    )

    if args.write:
        path = catalog.configs_dir / "simulator.yaml"
        write_config(path, settings)
        reread = analytic_settings(catalog)
        assert reread == settings, (reread, settings)
        print(f"\nwrote the analytic section of {path}")
    print(f"\n({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
