"""Data and fitting for bench/calibrate_analytic.py (its docstring says what is fitted, to what).

SAILOR's measured block and optimizer-step times as points, the estimator's per-point parts, a
Levenberg-Marquardt fit with efficiencies kept in (0, 1), and the fits the calibration reports on.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.catalog.gpus import GpuSpec  # noqa: E402
from orchestrator.profiles.analytic import (  # noqa: E402
    AnalyticSettings,
    analytic_profile,
    update_seconds,
)
from runtime.models.specs import BUILTIN_MODELS, GptSpec  # noqa: E402

TRAIN_MODELS = ("OPT-350", "GPT-Neo-2.7")
SUSPECT_MODELS = ("OPT-30", "LLAMA-3-8")
PASSES = ("fwd", "bwd")
ELEMENTWISE_GRID = (0.0, 2.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 80.0, 100.0)
FLAT = 1e-3  # relative tolerance of "as good as the best" on the elementwise grid
INF = float("inf")


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
    group: str  # train | tp>1 | OPT-30 | LLAMA-3-8


# ---------------------------------------------------------------------------------------------
# SAILOR's data


def sailor_specs() -> dict[str, GptSpec]:
    return {s.sailor_name: s for s in BUILTIN_MODELS.values() if getattr(s, "sailor_name", None)}


def load_points(catalog) -> tuple[list[Point], list[str]]:
    """Median block time of every usable (model, GPU, mbs, TP, pass) SAILOR published."""
    root = catalog.configs_dir / "profiles" / "sailor"
    info = json.loads((root / "llm_info.json").read_text(encoding="utf-8"))
    points, notes = [], []
    for model, spec in sorted(sailor_specs().items()):
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
                    if model in SUSPECT_MODELS:
                        group = model
                    else:
                        group = "train" if tp == 1 else "tp>1"
                    for index, passname in enumerate(PASSES):
                        measured = statistics.median(float(b[index]) for b in blocks)
                        points.append(
                            Point(model, spec, child.name, gpu, tp, mbs, passname, measured, group)
                        )
    return points, notes


# ---------------------------------------------------------------------------------------------
# Predictions through the project's estimator


def block_times(points: list[Point], settings: AnalyticSettings, spec_for=None) -> np.ndarray:
    """The estimator's block time of each point (its pass), one analytic_profile per (model, GPU)."""
    out = np.empty(len(points))
    groups: dict[tuple[str, str], list[int]] = {}
    for i, p in enumerate(points):
        groups.setdefault((p.model, p.folder), []).append(i)
    for indices in groups.values():
        first = points[indices[0]]
        spec = spec_for(first) if spec_for else first.spec
        profile = analytic_profile(
            spec,
            [first.gpu],
            precision="fp16-mixed",
            optimizer="adam",
            microbatch_sizes=sorted({points[i].mbs for i in indices}),
            tp_degrees=sorted({points[i].tp for i in indices}),
            settings=settings,
        )
        for i in indices:
            p = points[i]
            table = profile.time_table(first.gpu.name, p.mbs, p.tp)
            times = table.forward_s if p.passname == "fwd" else table.backward_s
            out[i] = times[1]  # every block of the analytic estimate has the same time
    return out


def plain_settings(
    ce, me, *, overhead=0.0, elementwise=0.0, backward=1.0, update=None
) -> AnalyticSettings:
    return AnalyticSettings(
        compute_efficiency=ce,
        memory_efficiency=me,
        layer_overhead_s=overhead,
        elementwise_bytes_per_token_hidden=elementwise,
        backward_factor=backward,
        update_memory_efficiency=update,
        source="calibration",
    )


class Parts:
    """Per point, the estimate's parts at efficiency 1, read off the estimator:
    t = overhead + f x (compute / ce + (attention + E x hidden) / me) + all-reduce,
    f = backward_factor for backward points, 1 for forward ones."""

    def __init__(self, points: list[Point], spec_for=None) -> None:
        fwd = [dataclasses.replace(p, passname="fwd") for p in points]

        def at(settings):
            return block_times(fwd, settings, spec_for)

        self.comm = at(plain_settings(INF, INF))
        self.compute = at(plain_settings(1.0, INF)) - self.comm
        self.attention = at(plain_settings(INF, 1.0)) - self.comm
        self.hidden = at(plain_settings(INF, 1.0, elementwise=1.0)) - self.comm - self.attention
        self.backward = np.array([p.passname == "bwd" for p in points])
        self.measured = np.array([p.measured_s for p in points])
        self.gpus = [p.gpu.name for p in points]

    def predict(self, ce: np.ndarray, me: np.ndarray, bf: float, ov: float, e: float) -> np.ndarray:
        f = np.where(self.backward, bf, 1.0)
        return ov + f * (self.compute / ce + (self.attention + e * self.hidden) / me) + self.comm

    def predict_settings(self, s: AnalyticSettings) -> np.ndarray:
        ce = np.array([s.compute_for(g) for g in self.gpus])
        me = np.array([s.memory_for(g) for g in self.gpus])
        return self.predict(
            ce, me, s.backward_factor, s.layer_overhead_s, s.elementwise_bytes_per_token_hidden
        )


# ---------------------------------------------------------------------------------------------
# The fit


def levenberg_marquardt(residuals, x0, *, iterations=300):
    """Minimise sum(residuals(x)^2); forward-difference Jacobian."""
    x = np.asarray(x0, dtype=float)
    r = residuals(x)
    cost = float(r @ r)
    damping = 1e-3
    for _ in range(iterations):
        jac = np.empty((len(r), len(x)))
        for j in range(len(x)):
            h = 1e-6 * max(1.0, abs(x[j]))
            step = x.copy()
            step[j] += h
            jac[:, j] = (residuals(step) - r) / h
        grad, hess = jac.T @ r, jac.T @ jac
        while True:
            delta = np.linalg.solve(hess + damping * np.diag(np.diag(hess) + 1e-12), -grad)
            trial = x + delta
            r_trial = residuals(trial)
            c_trial = float(r_trial @ r_trial)
            if c_trial < cost:
                converged = cost - c_trial < 1e-14 * max(cost, 1e-30)
                x, r, cost = trial, r_trial, c_trial
                damping = max(damping / 3, 1e-12)
                break
            damping *= 4
            if damping > 1e12:
                return x, cost
        if converged or np.max(np.abs(delta)) < 1e-10:
            break
    return x, cost


def _unit(z):  # (-inf, inf) -> (0, 1)
    return 1.0 / (1.0 + np.exp(z))


def _softplus(z):
    return np.log1p(np.exp(-abs(z))) + max(z, 0.0)


@dataclass
class Fit:
    compute: dict[str, float]  # catalog GPU -> compute_efficiency
    memory: dict[str, float]  # catalog GPU -> memory_efficiency, identifiable GPUs only
    memory_default: float  # every other GPU's
    backward_factor: float
    overhead_s: float
    elementwise: float
    objective: float  # mean squared log-ratio

    def settings(self, update=None, *, rounded=False) -> AnalyticSettings:
        r = round_sig if rounded else float
        ce = {"default": r(statistics.median(self.compute.values()))}
        ce.update({g: r(v) for g, v in sorted(self.compute.items())})
        me = {"default": r(self.memory_default)}
        me.update({g: r(v) for g, v in sorted(self.memory.items())})
        return plain_settings(
            ce,
            me,
            overhead=r(self.overhead_s),
            elementwise=r(self.elementwise),
            backward=r(self.backward_factor),
            update=None if update is None else r(update),
        )


def fit(
    parts: Parts,
    index: np.ndarray,
    points: list[Point],
    elementwise: float,
    *,
    memory_prior: float | None = None,
) -> Fit:
    """Per-GPU efficiencies and shared factors on the points ``index``, elementwise factor fixed.

    memory_efficiency is fitted on GPUs with two models among the points; the others take the
    median of those (or ``memory_prior`` for all GPUs when given)."""
    models_on: dict[str, set[str]] = {}
    for i in index:
        models_on.setdefault(points[i].gpu.name, set()).add(points[i].model)
    gpus = sorted(models_on)
    both = [] if memory_prior is not None else [g for g in gpus if len(models_on[g]) > 1]
    if memory_prior is None and not both:
        raise ValueError("memory_efficiency is not identifiable without a GPU with two models")
    sub_gpus = [parts.gpus[i] for i in index]
    pos = {g: k for k, g in enumerate(gpus)}
    gpu_of = np.array([pos[g] for g in sub_gpus])
    measured = parts.measured[index]
    view = Subset(parts, index)

    def unpack(x):
        ce = {g: float(_unit(x[k])) for k, g in enumerate(gpus)}
        me = {g: float(_unit(x[len(gpus) + k])) for k, g in enumerate(both)}
        default = statistics.median(me.values()) if both else memory_prior
        bf, ov = float(x[-2]), float(_softplus(x[-1])) * 1e-3
        return ce, me, default, bf, ov

    def residuals(x):
        ce, me, default, bf, ov = unpack(x)
        ce_v = np.array([ce[g] for g in gpus])[gpu_of]
        me_v = np.array([me.get(g, default) for g in gpus])[gpu_of]
        return np.log(view.predict(ce_v, me_v, bf, ov, elementwise) / measured)

    z0 = math.log(1 / 0.3 - 1)
    x0 = [z0] * len(gpus) + [math.log(1 / 0.15 - 1)] * len(both) + [2.3, 0.0]
    x, cost = levenberg_marquardt(residuals, x0)
    ce, me, default, bf, ov = unpack(x)
    return Fit(ce, me, default, bf, ov, elementwise, cost / len(index))


class Subset:
    def __init__(self, parts: Parts, index: np.ndarray) -> None:
        self.compute, self.attention = parts.compute[index], parts.attention[index]
        self.hidden, self.comm = parts.hidden[index], parts.comm[index]
        self.backward = parts.backward[index]

    predict = Parts.predict


def fit_profiled(parts, index, points) -> tuple[Fit, list[Fit]]:
    """Fit on the elementwise grid; keep the smallest factor as good as the best (within FLAT)."""
    fits = [fit(parts, index, points, e) for e in ELEMENTWISE_GRID]
    best = min(f.objective for f in fits)
    chosen = next(f for f in fits if f.objective <= best * (1 + FLAT) + 1e-15)
    return chosen, fits


def round_sig(value: float, digits: int = 3) -> float:
    if value == 0:
        return 0.0
    return float(f"{value:.{digits}g}")


# ---------------------------------------------------------------------------------------------
# The optimizer step


@dataclass(frozen=True)
class UpdatePoint:
    model: str
    folder: str
    gpu: GpuSpec
    tp: int
    measured_s: float
    whole_params: float  # per GPU, the whole model (as orchestrator/profiles/sailor.py reads u)
    profiled_params: float  # per GPU, the model SAILOR's profiler ran: embedding, 2 blocks, head


def load_update_points(catalog) -> list[UpdatePoint]:
    root = catalog.configs_dir / "profiles" / "sailor"
    info = json.loads((root / "llm_info.json").read_text(encoding="utf-8"))
    out = []
    for model, spec in sorted(sailor_specs().items()):
        for child in sorted((root / model).iterdir()) if (root / model).is_dir() else []:
            path = child / "profile.json"
            gpu = catalog.gpus.find(child.name)
            if not path.is_file() or gpu is None:
                continue
            raw = json.loads(path.read_text(encoding="utf-8"))
            by_tp: dict[int, list[float]] = {}
            for by_layer_tp in raw.values():
                for tp_key, by_layer in by_layer_tp.items():
                    if tp_key not in info[model] or len(by_layer) != len(info[model][tp_key]):
                        continue
                    u = float(by_layer["0"][2])
                    if u > 0:
                        by_tp.setdefault(int(tp_key), []).append(u)
            for tp, values in sorted(by_tp.items()):
                layer = info[model][str(tp)]
                emb, block = layer["0"]["params_floats"], layer["1"]["params_floats"]
                # Tied models list the word embeddings again in the head; the optimizer steps them once.
                tail = (
                    0
                    if spec.tied_embeddings
                    else sum(
                        layer[str(i)]["params_floats"]
                        for i in range(spec.num_blocks + 1, len(layer))
                    )
                )
                out.append(
                    UpdatePoint(
                        model,
                        child.name,
                        gpu,
                        tp,
                        statistics.median(values),
                        emb + spec.num_blocks * block + tail,
                        emb + 2 * block + tail,
                    )
                )
    return out


def update_at_one(p: UpdatePoint, params: float) -> float:
    one = plain_settings(1.0, 1.0, update=1.0)
    return update_seconds(p.gpu, params, optimizer="adam", precision="fp16-mixed", settings=one)


def fit_update(points: list[UpdatePoint], which: str) -> float:
    """Least squares of log(predicted / measured): the geometric mean of the needed efficiencies."""
    logs = [math.log(update_at_one(p, getattr(p, which)) / p.measured_s) for p in points]
    return math.exp(sum(logs) / len(logs))
