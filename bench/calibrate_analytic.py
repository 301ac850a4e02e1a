"""Fit the analytic profile estimate's four factors to SAILOR's measured per-layer times.

Usage: python bench/calibrate_analytic.py [--current] [--write]

The four numbers of configs/simulator.yaml, section ``analytic`` (compute_efficiency,
memory_efficiency, layer_overhead_s, elementwise_bytes_per_token_hidden), are fitted to the forward
and backward times of the transformer BLOCK layers (not the embedding or the head) that SAILOR
measured with Megatron-DeepSpeed in fp16 (configs/profiles/sailor/<model>/<gpu>/profile.json).
The blocks of one (model, GPU, microbatch, TP) have near-identical times; their median is one point.

- Training set: OPT-350 and GPT-Neo-2.7 on A100-40 and V100-16, TP=1, microbatch sizes 1, 2, 4.
- Held-out set: the same two models on the other GPUs SAILOR profiled (TP=1, every microbatch),
  on A100-40 and V100-16 at TP=1 with microbatches outside the training set and at TP=2, and OPT-30
  and LLAMA-3-8 wherever SAILOR profiled them (every TP and microbatch). Files whose layer count
  differs from SAILOR's llm_info.json are skipped (GPT-Neo-2.7 on GH-96 is a copy of OPT-350's).
- Extra (printed as summaries only, not part of either set): OPT-350 and GPT-Neo-2.7 at the
  remaining TP degrees (TP=2 on the other GPUs, TP>=4 everywhere), mostly a test of the
  tensor-parallel all-reduce term, which this fit does not tune.

Predictions come from the project's own estimator (orchestrator.profiles.analytic.analytic_profile),
so the fitted numbers mean exactly what the simulator uses. The fit minimises the mean squared
log(predicted / measured) over the training points: a coarse grid, then a Nelder-Mead (numpy only)
from the best grid points, within the bounds efficiencies (0, 1], overhead [0, 2e-3] s, elementwise
factor [0, 200]. The fitted values are rounded to 3 significant figures and the errors printed are
those of the rounded values, i.e. of what configs/simulator.yaml holds.

--current evaluates the values now in configs/simulator.yaml instead of fitting.
--write   puts the fitted (rounded) values into configs/simulator.yaml; only the four numbers of
          the analytic section change (the calibration source's note is edited by hand).
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import re
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.catalog import default_catalog  # noqa: E402
from orchestrator.catalog.gpus import GpuSpec  # noqa: E402
from orchestrator.profiles import analytic_settings  # noqa: E402
from orchestrator.profiles.analytic import AnalyticSettings, analytic_profile  # noqa: E402
from runtime.models.specs import BUILTIN_MODELS, GptSpec  # noqa: E402

TRAIN_MODELS = ("OPT-350", "GPT-Neo-2.7")
TRAIN_GPUS = ("A100-40", "V100-16")
TRAIN_MBS = (1, 2, 4)
HELD_OUT_ONLY_MODELS = ("OPT-30", "LLAMA-3-8")

# (lower, upper) of each factor, in the order of FACTORS.
FACTORS = (
    "compute_efficiency",
    "memory_efficiency",
    "layer_overhead_s",
    "elementwise_bytes_per_token_hidden",
)
BOUNDS = ((1e-3, 1.0), (1e-3, 1.0), (0.0, 2e-3), (0.0, 200.0))
PASSES = ("fwd", "bwd")


@dataclass(frozen=True)
class Point:
    model: str  # SAILOR's name
    spec: GptSpec
    folder: str  # SAILOR's GPU folder name
    gpu: GpuSpec
    tp: int
    mbs: int
    passname: str  # fwd | bwd
    measured_s: float
    group: str


# ---------------------------------------------------------------------------------------------
# SAILOR's data


def load_points(catalog) -> tuple[list[Point], list[str]]:
    """Median block time of every usable (model, GPU, mbs, TP, pass) SAILOR published."""
    root = catalog.configs_dir / "profiles" / "sailor"
    info = json.loads((root / "llm_info.json").read_text(encoding="utf-8"))
    specs = {s.sailor_name: s for s in BUILTIN_MODELS.values() if getattr(s, "sailor_name", None)}
    points, notes = [], []
    for model in sorted(specs):
        spec = specs[model]
        layers_expected = {len(v) for v in info[model].values()}
        folder_root = root / model
        if not folder_root.is_dir():
            continue
        for child in sorted(folder_root.iterdir()):
            path = child / "profile.json"
            if not path.is_file():
                continue
            gpu = catalog.gpus.find(child.name)
            if gpu is None:
                notes.append(f"skipped {model}/{child.name}: no such GPU in the catalog")
                continue
            raw = json.loads(path.read_text(encoding="utf-8"))
            for mbs_key, by_tp in raw.items():
                for tp_key, by_layer in by_tp.items():
                    if len(by_layer) not in layers_expected:
                        note = (
                            f"skipped {model}/{child.name}: {len(by_layer)} layers where "
                            f"llm_info.json has {sorted(layers_expected)} (the published file is "
                            "not this model's)"
                        )
                        if note not in notes:
                            notes.append(note)
                        continue
                    # Blocks are layers 1..num_blocks (LLAMA-3-8 has a final norm after them).
                    blocks = [by_layer[str(i)] for i in range(1, spec.num_blocks + 1)]
                    mbs, tp = int(mbs_key), int(tp_key)
                    for index, passname in enumerate(PASSES):
                        measured = statistics.median(float(b[index]) for b in blocks)
                        group = classify(model, child.name, tp, mbs)
                        points.append(
                            Point(model, spec, child.name, gpu, tp, mbs, passname, measured, group)
                        )
    return points, notes


def classify(model: str, folder: str, tp: int, mbs: int) -> str:
    """train | held-out: <what> | extra: <what>."""
    if model in HELD_OUT_ONLY_MODELS:
        return f"held-out: {model}, all TP"
    if folder in TRAIN_GPUS:
        if tp == 1:
            return "train" if mbs in TRAIN_MBS else "held-out: training GPUs, TP=1, other mbs"
        if tp == 2:
            return "held-out: training GPUs, TP=2"
        return "extra: small models, TP>=4"
    if tp == 1:
        return "held-out: other GPUs, TP=1"
    if tp == 2:
        return "extra: small models, other GPUs, TP=2"
    return "extra: small models, TP>=4"


# ---------------------------------------------------------------------------------------------
# Predictions through the project's estimator


def make_settings(values) -> AnalyticSettings:
    return AnalyticSettings(
        **dict(zip(FACTORS, (float(v) for v in values), strict=True)), source="calibration"
    )


class Predictor:
    """Predicted block times of a fixed set of points, for any candidate settings."""

    def __init__(self, points: list[Point]) -> None:
        self.points = points
        self.groups: dict[tuple[str, str], list[int]] = {}
        for i, p in enumerate(points):
            self.groups.setdefault((p.model, p.folder), []).append(i)
        self.measured = np.array([p.measured_s for p in points])

    def predict(self, settings: AnalyticSettings) -> np.ndarray:
        out = np.empty(len(self.points))
        for indices in self.groups.values():
            first = self.points[indices[0]]
            profile = analytic_profile(
                first.spec,
                [first.gpu],
                precision="fp16-mixed",
                optimizer="adam",
                microbatch_sizes=sorted({self.points[i].mbs for i in indices}),
                tp_degrees=sorted({self.points[i].tp for i in indices}),
                settings=settings,
            )
            block = 1  # every block of the analytic estimate has the same time
            for i in indices:
                p = self.points[i]
                table = profile.time_table(first.gpu.name, p.mbs, p.tp)
                times = table.forward_s if p.passname == "fwd" else table.backward_s
                out[i] = times[block]
        return out

    def log_ratios(self, settings: AnalyticSettings) -> np.ndarray:
        return np.log(self.predict(settings) / self.measured)


# ---------------------------------------------------------------------------------------------
# The fit


def clip(values) -> np.ndarray:
    return np.array([min(max(v, lo), hi) for v, (lo, hi) in zip(values, BOUNDS, strict=True)])


def to_free(values) -> np.ndarray:
    """Search coordinates of comparable scale: log efficiencies, overhead in ms, factor / 100."""
    ce, me, ov, e = values
    return np.array([math.log(ce), math.log(me), ov * 1e3, e / 100.0])


def from_free(x) -> np.ndarray:
    return clip([math.exp(min(x[0], 0.0)), math.exp(min(x[1], 0.0)), x[2] * 1e-3, x[3] * 100.0])


def nelder_mead(f, x0, *, step, max_evals=4000, tol=1e-12):
    """Plain Nelder-Mead (reflection 1, expansion 2, contraction 0.5, shrink 0.5)."""
    n = len(x0)
    simplex = [np.asarray(x0, dtype=float)]
    for i in range(n):
        x = simplex[0].copy()
        x[i] += step[i]
        simplex.append(x)
    values = [f(x) for x in simplex]
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(values)
        simplex = [simplex[i] for i in order]
        values = [values[i] for i in order]
        if abs(values[-1] - values[0]) <= tol * (abs(values[0]) + tol):
            break
        centroid = np.mean(simplex[:-1], axis=0)
        reflected = centroid + (centroid - simplex[-1])
        fr = f(reflected)
        evals += 1
        if fr < values[0]:
            expanded = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(expanded)
            evals += 1
            simplex[-1], values[-1] = (expanded, fe) if fe < fr else (reflected, fr)
        elif fr < values[-2]:
            simplex[-1], values[-1] = reflected, fr
        else:
            inside = fr >= values[-1]
            contracted = centroid + (
                0.5 * (simplex[-1] - centroid) if inside else 0.5 * (reflected - centroid)
            )
            fc = f(contracted)
            evals += 1
            if fc < min(fr, values[-1]):
                simplex[-1], values[-1] = contracted, fc
            else:
                for i in range(1, n + 1):
                    simplex[i] = simplex[0] + 0.5 * (simplex[i] - simplex[0])
                    values[i] = f(simplex[i])
                evals += n
    best = int(np.argmin(values))
    return simplex[best], values[best], evals


def fit(predictor: Predictor) -> tuple[np.ndarray, float, int]:
    def objective_values(values) -> float:
        return float(np.mean(predictor.log_ratios(make_settings(values)) ** 2))

    grid = itertools.product(
        np.geomspace(0.02, 1.0, 12),
        np.geomspace(0.02, 1.0, 12),
        (0.0, 0.25e-3, 0.5e-3, 1e-3, 2e-3),
        (0.0, 10.0, 25.0, 50.0, 100.0, 200.0),
    )
    scored = sorted((objective_values(v), tuple(v)) for v in grid)
    evals = 12 * 12 * 5 * 6
    best_x, best_f = None, math.inf
    for _, start in scored[:4]:
        x, fx, n = nelder_mead(
            lambda z: objective_values(from_free(z)), to_free(start), step=[0.3, 0.3, 0.2, 0.2]
        )
        evals += n
        # Restart once from the result: Nelder-Mead can stall on a bound.
        x, fx, n = nelder_mead(
            lambda z: objective_values(from_free(z)), x, step=[0.05, 0.05, 0.05, 0.05]
        )
        evals += n
        if fx < best_f:
            best_x, best_f = x, fx
    return from_free(best_x), best_f, evals


def round_sig(value: float, digits: int = 3) -> float:
    if value == 0:
        return 0.0
    return float(f"{value:.{digits}g}")


# ---------------------------------------------------------------------------------------------
# Report


def summary(ratios: np.ndarray) -> str:
    dev = np.abs(ratios - 1.0)
    return (
        f"n={len(ratios):3d}  median |ratio-1|={np.median(dev):6.1%}  max |ratio-1|={dev.max():7.1%}"
        f"  mean log-ratio={np.mean(np.log(ratios)):+.3f}"
        f"  worst factor={np.exp(np.max(np.abs(np.log(ratios)))):5.2f}x"
    )


def print_table(title: str, points: list[Point], predicted: np.ndarray) -> np.ndarray:
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
    ratios = predicted / np.array([p.measured_s for p in points])
    for i in order:
        p = points[i]
        print(
            f"{p.model:12s} {p.folder:10s} {p.gpu.name:10s} {p.tp:2d} {p.mbs:3d} {p.passname:4s} "
            f"{p.measured_s:11.6f} {predicted[i]:11.6f} {ratios[i]:6.3f}"
        )
    return ratios


def print_summaries(title: str, points: list[Point], ratios: np.ndarray) -> None:
    print(f"\n-- {title} --")
    print(f"  {'all':44s} {summary(ratios)}")
    for passname in PASSES:
        mask = np.array([p.passname == passname for p in points])
        print(f"  {'  ' + passname:44s} {summary(ratios[mask])}")
    groups = sorted({p.group for p in points})
    if len(groups) > 1:
        for group in groups:
            mask = np.array([p.group == group for p in points])
            print(f"  {group:44s} {summary(ratios[mask])}")


def print_diagnostics(points: list[Point], settings: AnalyticSettings) -> None:
    """What the functional form fixes and the data disagree on."""
    print("\n== Diagnostics (TP=1; every usable GPU) ==")
    # Backward / forward: the estimate's is 2 less the overhead's dilution.
    print("backward/forward ratio of the measured block times (the estimate's is <= 2.0):")
    by_key: dict[tuple, dict[str, float]] = {}
    for p in points:
        if p.tp == 1:
            by_key.setdefault((p.model, p.folder, p.gpu.name), {}).setdefault(p.mbs, {})[
                p.passname
            ] = p.measured_s
    for (model, folder, _), by_mbs in sorted(by_key.items()):
        ratios = [v["bwd"] / v["fwd"] for _, v in sorted(by_mbs.items()) if len(v) == 2]
        print(
            f"  {model:12s} {folder:10s} mbs {','.join(str(m) for m in sorted(by_mbs)):14s} "
            f"bwd/fwd {min(ratios):.2f}..{max(ratios):.2f}"
        )
    # Matmul time alone at peak: t(ce=0.5) - t(ce=1) with everything else fixed = C / peak.
    print(
        "block matmul FLOPs / measured forward time, as a fraction of the catalog's fp16 peak\n"
        "(the least compute_efficiency with which the estimate does not exceed that time; one "
        "model's spread\nbetween GPUs is what a single compute_efficiency cannot follow; "
        f"fitted: {settings.compute_efficiency:.3g}):"
    )
    fwd = [p for p in points if p.tp == 1 and p.passname == "fwd"]
    predictor = Predictor(fwd)
    full = predictor.predict(replace(settings, compute_efficiency=1.0))
    half = predictor.predict(replace(settings, compute_efficiency=0.5))
    matmul_at_peak = half - full
    best: dict[tuple, tuple[int, float]] = {}
    for p, c in zip(fwd, matmul_at_peak, strict=True):
        key = (p.model, p.folder, p.gpu.name, p.gpu.peak_fp16_tflops)
        if key not in best or p.mbs > best[key][0]:
            best[key] = (p.mbs, c / p.measured_s)
    for (model, folder, name, peak), (mbs, fraction) in sorted(best.items()):
        print(
            f"  {model:12s} {folder:10s} ({name}, {peak:g} TFLOPS)  mbs {mbs:3d}: "
            f"{fraction:6.1%}  = {fraction * peak:6.1f} TFLOPS achieved"
        )


def write_config(path: Path, values: np.ndarray) -> None:
    text = path.read_text(encoding="utf-8")
    start = text.index("\nanalytic:")
    end = text.find("\n\n", start + 1)
    end = len(text) if end < 0 else end
    section = text[start:end]
    for name, value in zip(FACTORS, values, strict=True):
        pattern = re.compile(rf"(\n  {name}: )([^\s#]+)")
        if not pattern.search(section):
            raise SystemExit(f"{path}: no {name} in the analytic section")
        section = pattern.sub(lambda m, v=value: m.group(1) + repr(float(v)), section, count=1)
    path.write_text(text[:start] + section + text[end:], encoding="utf-8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--current", action="store_true", help="evaluate configs/simulator.yaml's values, no fit"
    )
    parser.add_argument(
        "--write", action="store_true", help="write the fitted values to configs/simulator.yaml"
    )
    args = parser.parse_args()
    started = time.perf_counter()
    catalog = default_catalog()
    points, notes = load_points(catalog)
    for note in notes:
        print(note)
    train = [p for p in points if p.group == "train"]
    held = [p for p in points if p.group.startswith("held-out")]
    extra = [p for p in points if p.group.startswith("extra")]
    train_predictor = Predictor(train)

    if args.current:
        settings = analytic_settings(catalog)
        values = np.array([getattr(settings, name) for name in FACTORS])
        print("\nValues of configs/simulator.yaml (no fit):")
    else:
        raw, objective, evals = fit(train_predictor)
        values = np.array([round_sig(v) for v in raw])
        settings = make_settings(values)
        print(
            f"\nFit: {len(train)} training points, {evals} evaluations, mean squared log-ratio "
            f"{objective:.5f} (unrounded: "
            + ", ".join(f"{n}={v:.6g}" for n, v in zip(FACTORS, raw, strict=True))
            + ")"
        )
        print("Fitted values (3 significant figures; the errors below are of these):")
    for name, value in zip(FACTORS, values, strict=True):
        print(f"  {name}: {value:g}")
    rms = math.sqrt(np.mean(train_predictor.log_ratios(settings) ** 2))
    print(f"  RMS log-ratio on the training set: {rms:.4f}")

    train_ratios = print_table("Training set", train, train_predictor.predict(settings))
    held_ratios = print_table("Held-out set", held, Predictor(held).predict(settings))
    extra_ratios = Predictor(extra).predict(settings) / np.array([p.measured_s for p in extra])
    print("\n== Summaries ==")
    print_summaries("Training set", train, train_ratios)
    print_summaries("Held-out set", held, held_ratios)
    print_summaries("Extra (not in either set: TP tests of the small models)", extra, extra_ratios)
    print_diagnostics(points, settings)
    if not args.current:
        print(
            "the same fit on one training GPU at a time (the form has one compute_efficiency for "
            "every GPU):"
        )
        for folder in TRAIN_GPUS:
            own = [p for p in train if p.folder == folder]
            others = [p for p in train if p.folder != folder]
            raw_own, _, _ = fit(Predictor(own))
            own_settings = make_settings(raw_own)
            own_ratios = Predictor(own).predict(own_settings) / np.array(
                [p.measured_s for p in own]
            )
            other_ratios = Predictor(others).predict(own_settings) / np.array(
                [p.measured_s for p in others]
            )
            print(
                f"  {folder:8s} "
                + ", ".join(f"{n}={v:.3g}" for n, v in zip(FACTORS, raw_own, strict=True))
                + f"\n           own points: median |ratio-1| {np.median(np.abs(own_ratios - 1)):.1%}, "
                f"max {np.max(np.abs(own_ratios - 1)):.1%}; the other training GPU's: geometric-mean "
                f"ratio {np.exp(np.mean(np.log(other_ratios))):.2f}"
            )

    if args.write:
        if args.current:
            raise SystemExit("--write needs a fit; drop --current")
        path = catalog.configs_dir / "simulator.yaml"
        write_config(path, values)
        print(f"\nwrote the four analytic factors to {path}")
    print(f"\n({time.perf_counter() - started:.1f} s)")


if __name__ == "__main__":
    main()
