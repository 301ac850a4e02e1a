"""Model profiles: imported from SAILOR, estimated analytically, or measured by our profiler.

``profile_for_recipe`` picks per GPU what the recipe's ``model.profile`` asks: ``auto`` takes SAILOR's
measurement where SAILOR profiled that model on that GPU in fp16, and the analytic estimate
elsewhere; ``sailor`` and ``analytic`` force one source; a path loads a profile file.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from orchestrator.catalog import Catalog
from orchestrator.errors import UserError
from orchestrator.profiles.analytic import AnalyticSettings, analytic_profile, update_seconds
from orchestrator.profiles.profile import ModelProfile, load_profile_json
from orchestrator.profiles.sailor import import_sailor, sailor_gpus
from orchestrator.recipe import Recipe
from orchestrator.recipe.models import model_label, spec_of
from runtime.models.specs import model_spec

__all__ = ["ModelProfile", "analytic_settings", "profile_for_recipe", "sailor_profile"]


def analytic_settings(catalog: Catalog) -> AnalyticSettings:
    return AnalyticSettings.load(
        catalog.configs_dir / "simulator.yaml",
        "configs/simulator.yaml",
        gpus=catalog.gpus,
        doc=catalog.yaml_doc("simulator.yaml"),
    )


def sailor_profile(model: str, gpus: Iterable[str], catalog: Catalog) -> ModelProfile:
    """SAILOR's measured profile of built-in ``model`` on ``gpus`` (catalog names); where SAILOR
    recorded no optimizer step, it is estimated from memory bandwidth."""
    settings = analytic_settings(catalog)

    def update(gpu: str, params: float) -> float:
        return update_seconds(
            catalog.gpus.get(gpu),
            params,
            optimizer="adam",
            precision="fp16-mixed",
            settings=settings,
        )

    return import_sailor(model_spec(model), list(gpus), catalog, update)


def profile_for_recipe(
    recipe: Recipe,
    gpus: Iterable[str],
    catalog: Catalog,
    *,
    microbatch_sizes: Iterable[int] = (),
    tp_degrees: Iterable[int] = (),
) -> ModelProfile:
    """The profile of the recipe's model on ``gpus`` (catalog names)."""
    gpus = sorted(set(gpus))
    spec, label = spec_of(recipe.model), model_label(recipe.model)
    mode = recipe.model.profile
    if mode not in ("auto", "analytic", "sailor"):
        profile = load_profile_json(Path(mode))
        if profile.model != label:
            raise UserError(
                f"profile {mode} is of {profile.model}; the recipe trains {label}",
                field="model.profile",
                fix=f"profile this model: python -m orchestrator profile RECIPE -o {mode}",
            )
        missing = [g for g in gpus if g not in profile.gpus]
        if missing:
            raise UserError(
                f"profile {mode} has no times for {', '.join(missing)}",
                field="model.profile",
                fix="profile those GPUs, or use profile: auto",
            )
        return profile
    if spec.family == "custom":  # no formula gives a user's model's times: measured
        if mode == "auto" and recipe.provider == "local" and set(gpus) <= {"T4"}:
            from orchestrator.profiles.measured import profile_here

            return profile_here(recipe, spec)  # a local worker: this machine's CPU slot
        raise UserError(
            f"{label}: profile {mode} needs the model's measured times on {', '.join(gpus)}",
            field="model.profile",
            fix="measure them: `python -m orchestrator profile RECIPE --gpu GPU -o my-profile.json` "
            "(on a machine with that GPU), then write profile: my-profile.json",
        )
    settings = analytic_settings(catalog)
    precision, optimizer = recipe.training.precision, recipe.training.optimizer.name
    measured = sailor_gpus(spec, catalog) if precision == "fp16-mixed" or mode == "sailor" else {}
    imported = [g for g in gpus if g in measured] if mode != "analytic" else []
    if mode == "sailor":
        imported = gpus  # import_sailor names any GPU SAILOR lacks
    estimated = [g for g in gpus if g not in imported]

    profile = sailor_profile(spec.name, imported, catalog) if imported else None
    if estimated:
        sizes = set(microbatch_sizes) | set(recipe.training.microbatch_sizes)
        tps = {1} | set(tp_degrees) | set(recipe.parallelism.tensor_parallel)
        analytic = analytic_profile(
            spec,
            [catalog.gpus.get(g) for g in estimated],
            precision=precision,
            optimizer=optimizer,
            microbatch_sizes=sizes,
            tp_degrees=tps,
            settings=settings,
        )
        profile = analytic if profile is None else profile.merged(analytic)
    if profile is None:
        raise UserError("no GPU to profile", fix="name at least one GPU")
    return profile
