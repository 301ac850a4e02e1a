"""Check a bound recipe's values against each other and against the catalog.

All problems are collected and reported together (the first is the main error, the rest follow), each
with its file, line, field and fix. Returns the recipe normalized: GPU aliases resolved to catalog
names, paths resolved against the recipe's folder, the name defaulted to the file name.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Callable
from pathlib import Path

from orchestrator.catalog import PROVIDER_CLOUDS, Catalog, Location, OfferTable
from orchestrator.errors import CatalogError, RecipeError, UserError, together
from orchestrator.names import default_job_name, job_name_problem
from orchestrator.recipe.limits import MAX_STREAMS, MAX_TENSOR_PARALLEL
from orchestrator.recipe.model_checks import check_data, check_model, with_code
from orchestrator.recipe.schema import Recipe
from orchestrator.yamlsrc import Path_, YamlDoc, file_problem, path_text
from runtime.models.specs import ModelSpec

_S3_URL = re.compile(r"^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$")
_GS_URL = re.compile(r"^gs://[a-z0-9][a-z0-9._-]{1,61}[a-z0-9](/.*)?$")


class Checker:
    def __init__(self, recipe: Recipe, doc: YamlDoc, catalog: Catalog, folder: Path) -> None:
        self.recipe = recipe
        self.doc = doc
        self.catalog = catalog
        self.folder = folder
        self.errors: list[RecipeError] = []

    def error(self, path: Path_, message: str, fix: str) -> None:
        self.errors.append(
            RecipeError(
                message,
                file=self.doc.file,
                line=self.doc.line(path),
                field=path_text(path),
                fix=fix,
            )
        )

    def positive(self, path: Path_, value: float | None, *, allow_zero: bool = False) -> None:
        if value is None:
            return
        if value < 0 or (value == 0 and not allow_zero):
            self.error(
                path,
                f"must be {'>= 0' if allow_zero else '> 0'}, got {value:g}",
                f"write a {'non-negative' if allow_zero else 'positive'} number",
            )


def check_recipe(recipe: Recipe, doc: YamlDoc, catalog: Catalog, folder: Path) -> Recipe:
    """Raise RecipeError listing every problem; return the normalized recipe."""
    checker = Checker(recipe, doc, catalog, folder)
    _check_name(checker)
    spec = check_model(checker)
    check_data(checker, spec)
    _check_training(checker)
    _check_objective(checker)
    gpu_types = _check_constraints(checker)
    _check_parallelism(checker, spec)
    _check_checkpointing(checker)
    _check_runtime(checker)
    _check_recovery(checker)
    _check_local_cloud(checker)
    if checker.errors:
        raise together(checker.errors)
    return dataclasses.replace(
        recipe,
        name=recipe.name or default_job_name(doc.file),
        market=_resolve(folder, recipe.market),
        local_cloud=dataclasses.replace(
            recipe.local_cloud, offers=_resolve(folder, recipe.local_cloud.offers)
        ),
        data=dataclasses.replace(
            recipe.data,
            path=recipe.data.path
            if recipe.data.path is None or "://" in recipe.data.path
            else _resolve(folder, recipe.data.path),
        ),
        constraints=dataclasses.replace(recipe.constraints, gpu_types=gpu_types),
        model=dataclasses.replace(
            with_code(recipe.model, folder), profile=_resolve_profile(folder, recipe.model.profile)
        ),
    )


def _resolve(folder: Path, path: str | None) -> str | None:
    return None if path is None else str((folder / path).resolve())


def _resolve_profile(folder: Path, profile: str) -> str:
    return (
        profile if profile in ("auto", "analytic", "sailor") else str((folder / profile).resolve())
    )


def _check_name(c: Checker) -> None:
    name = c.recipe.name
    problem = None if name is None else job_name_problem(name)
    if problem is not None:
        c.error(
            ("name",),
            problem,
            "write a short name such as my-job-1 (it names the job's folder), or remove name: "
            "to use the file's name",
        )


def _check_training(c: Checker) -> None:
    t = c.recipe.training
    if t.global_batch_size < 1:
        c.error(
            ("training", "global_batch_size"),
            f"must be >= 1, got {t.global_batch_size}",
            "write a positive whole number",
        )
    if t.steps < 1:
        c.error(
            ("training", "steps"),
            f"must be >= 1, got {t.steps}",
            "write a positive whole number of steps",
        )
    if t.seed < 0:
        c.error(
            ("training", "seed"), f"must be >= 0, got {t.seed}", "write a non-negative whole number"
        )
    _check_microbatches(c)
    o = t.optimizer
    c.positive(("training", "optimizer", "lr"), o.lr)
    c.positive(("training", "optimizer", "weight_decay"), o.weight_decay, allow_zero=True)
    c.positive(("training", "optimizer", "grad_clip_norm"), o.grad_clip_norm)
    if o.momentum and o.name != "sgd":
        c.error(
            ("training", "optimizer", "momentum"),
            f"momentum applies to sgd, not {o.name}",
            "remove momentum, or write name: sgd",
        )
    if not 0 <= o.momentum < 1:
        c.error(
            ("training", "optimizer", "momentum"),
            f"must be in [0, 1), got {o.momentum:g}",
            "write e.g. 0.9",
        )


def _check_microbatches(c: Checker) -> None:
    t = c.recipe.training
    path = ("training", "microbatch_sizes")
    if not t.microbatch_sizes:
        c.error(path, "the list is empty", "give at least one microbatch size, e.g. [1, 2, 4]")
    seen: set[int] = set()
    for index, size in enumerate(t.microbatch_sizes):
        if size < 1:
            c.error(path + (index,), f"must be >= 1, got {size}", "write positive whole numbers")
        elif size in seen:
            c.error(path + (index,), f"{size} is listed twice", "list each microbatch size once")
        elif t.global_batch_size >= 1 and t.global_batch_size % size:
            divisors = _divisors(t.global_batch_size)[:10]
            c.error(
                path + (index,),
                f"global_batch_size {t.global_batch_size} is not divisible by microbatch size {size}",
                f"use sizes that divide {t.global_batch_size}: {', '.join(map(str, divisors))}"
                f"{', ...' if len(divisors) == 10 else ''}",
            )
        seen.add(size)


def _divisors(n: int) -> list[int]:
    """The divisors of ``n`` in order, in sqrt(n) steps."""
    low = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return low + [n // d for d in reversed(low) if d * d != n]


def _check_objective(c: Checker) -> None:
    o = c.recipe.objective
    path = ("objective",)
    for name in ("budget_usd_per_hour", "min_throughput_samples_per_s", "deadline_h", "budget_usd"):
        c.positive(path + (name,), getattr(o, name))
    if o.goal == "max_throughput":
        for name in ("min_throughput_samples_per_s", "deadline_h"):
            if getattr(o, name) is not None:
                c.error(
                    path + (name,),
                    f"{name} applies to goal min_cost, not max_throughput",
                    f"remove {name}, or write goal: min_cost",
                )
    else:
        if o.budget_usd_per_hour is not None:
            c.error(
                path + ("budget_usd_per_hour",),
                "budget_usd_per_hour applies to goal max_throughput, not min_cost",
                "remove it, or write goal: max_throughput",
            )
        if o.min_throughput_samples_per_s is not None and o.deadline_h is not None:
            c.error(
                path + ("deadline_h",),
                "give min_throughput_samples_per_s or deadline_h, not both",
                "keep the one that matters: a deadline implies a throughput floor",
            )


def _check_constraints(c: Checker) -> tuple[str, ...]:
    """Check places and GPU types; return the GPU types as catalog names."""
    k = c.recipe.constraints
    path = ("constraints",)
    within = _locations(c, path + ("locations",), k.locations)
    exclude = _locations(c, path + ("exclude_locations",), k.exclude_locations)
    gpu_types = []
    for index, name in enumerate(k.gpu_types):
        spec = _catalog_call(c, path + ("gpu_types", index), lambda n=name: c.catalog.gpus.find(n))
        if spec is None:
            hint = c.catalog.gpus.suggest(name)
            c.error(
                path + ("gpu_types", index),
                f"unknown GPU type '{name}'" + (f" (did you mean '{hint}'?)" if hint else ""),
                f"use one of: {', '.join(c.catalog.gpus.names())}",
            )
        elif spec.name in gpu_types:
            c.error(
                path + ("gpu_types", index), f"{name} is listed twice", "list each GPU type once"
            )
        else:
            gpu_types.append(spec.name)
    if k.min_locations < 1:
        c.error(path + ("min_locations",), f"must be >= 1, got {k.min_locations}", "write e.g. 3")
    elif k.max_gpus is not None and k.max_gpus >= 1 and k.min_locations > k.max_gpus:
        c.error(
            path + ("min_locations",),
            f"{k.min_locations} locations need at least as many GPUs, max_gpus is {k.max_gpus}",
            f"lower min_locations, or raise max_gpus to {k.min_locations} or more",
        )
    if k.max_gpus is not None and k.max_gpus < 1:
        c.error(
            path + ("max_gpus",),
            f"must be >= 1, got {k.max_gpus}",
            "write a positive whole number or remove it",
        )
    _check_precision_support(c, gpu_types)
    if within is not None and exclude is not None and len(gpu_types) == len(k.gpu_types):
        _check_market(c, within, exclude, tuple(gpu_types))
    return tuple(gpu_types)


def _catalog_call(c: Checker, path: Path_, call: Callable):
    try:
        return call()
    except CatalogError:
        raise
    except UserError as exc:
        c.error(path, exc.message, exc.fix or "")
        return None


def _locations(c: Checker, path: Path_, texts: tuple[str, ...]) -> list[Location] | None:
    """Parse and check locations; None if any is bad (so later checks that need them are skipped)."""
    result: list[Location] | None = []
    clouds = _provider_clouds(c)
    for index, text in enumerate(texts):
        location = _catalog_call(c, path + (index,), lambda t=text: c.catalog.location(t))
        if location is None:
            result = None
            continue
        if clouds is not None and location.cloud not in clouds:
            provider = c.recipe.provider
            fix = (
                (
                    "provider local simulates the places in configs/local/offers.csv (local/...); "
                    "write provider: skypilot to use real clouds"
                )
                if provider == "local"
                else f"provider {provider} reaches {', '.join(clouds)}; use provider: skypilot to span clouds"
            )
            c.error(
                path + (index,),
                f"'{text}' is on cloud {location.cloud}, which provider {provider} does not reach",
                fix,
            )
            result = None
        elif result is not None:
            result.append(location)
    return result


def _provider_clouds(c: Checker) -> tuple[str, ...] | None:
    return None if c.recipe.market else PROVIDER_CLOUDS[c.recipe.provider]


def _check_precision_support(c: Checker, gpu_types: list[str]) -> None:
    if c.recipe.training.precision != "bf16-mixed" or not gpu_types:
        return
    if not any(c.catalog.gpus.get(name).supports_bf16 for name in gpu_types):
        c.error(
            ("training", "precision"),
            f"bf16-mixed needs bfloat16, which none of {', '.join(gpu_types)} has",
            "write precision: fp16-mixed, or allow a GPU with bf16 (A100, H100, L4, A10G, ...)",
        )


def _market(c: Checker) -> OfferTable | None:
    """The offers the recipe plans against: ``market``, the local cloud's ``offers``, or the
    provider's own."""
    recipe, named = c.recipe, c.recipe.market_file()
    if named is None:
        return c.catalog.market(recipe.provider)
    field = ("market",) if recipe.market is not None else ("local_cloud", "offers")
    path = c.folder / named
    problem = file_problem(path)
    if problem is not None:
        c.error(
            field,
            f"offers file '{path}': {'does not exist' if 'not found' in problem else problem}",
            f"give the path of an offers CSV (relative to the recipe's folder), or remove {field[-1]}",
        )
        return None
    return c.catalog.load_market(path)


def _check_market(
    c: Checker, within: list[Location], exclude: list[Location], gpus: tuple[str, ...]
) -> None:
    """Constraints must leave at least one offer; if not, say which constraint binds."""
    market = _market(c)
    if market is None:
        return
    pricing = c.recipe.constraints.pricing
    if market.query(gpus=gpus, within=within, exclude=exclude, pricing=pricing):
        return
    path = ("constraints",)
    placed = market.query(within=within, exclude=exclude)
    if not placed:
        regions = sorted({str(o.location.region_location()) for o in market.offers})
        # the exclusions bind when the allowed places alone leave offers
        field = "locations" if within and not market.query(within=within) else "exclude_locations"
        offered = f"{', '.join(regions[:15])}{', ...' if len(regions) > 15 else ''}"
        c.error(
            path + (field,),
            f"no offer of the {c.recipe.provider} market is left in these places",
            f"allow some of: {offered}"
            if field == "locations"
            else f"exclude fewer places; the market offers GPUs in {offered}",
        )
    elif not market.query(gpus=gpus, within=within, exclude=exclude):
        there = sorted({o.gpu for o in placed})
        elsewhere = sorted({str(o.location.region_location()) for o in market.query(gpus=gpus)})
        fix = f"GPU types offered there: {', '.join(there)}"
        if elsewhere:
            fix += f"; {', '.join(gpus)} is offered in {', '.join(elsewhere[:8])}"
        c.error(
            path + ("gpu_types",),
            f"none of {', '.join(gpus)} is offered in the allowed places",
            fix,
        )
    else:
        c.error(
            path + ("pricing",),
            "no allowed offer has a spot price",
            "write pricing: any or on_demand",
        )


def _check_parallelism(c: Checker, spec: ModelSpec | None) -> None:
    p = c.recipe.parallelism
    path = ("parallelism",)
    for index, tp in enumerate(p.tensor_parallel):
        if tp < 1 or tp > MAX_TENSOR_PARALLEL or tp & (tp - 1):
            c.error(
                path + ("tensor_parallel", index),
                f"{tp} is not a power of two from 1 to {MAX_TENSOR_PARALLEL}",
                "use 1, 2, 4, 8 or 16 (TP stays inside one node)",
            )
    if not p.tensor_parallel:
        c.error(
            path + ("tensor_parallel",),
            "the list is empty",
            "write [1] to forbid tensor parallelism",
        )
    gb = c.recipe.training.global_batch_size
    sizes = [m for m in c.recipe.training.microbatch_sizes if m >= 1]
    for index, dp in enumerate(p.data_parallel):
        if dp < 1:
            c.error(
                path + ("data_parallel", index),
                f"must be >= 1, got {dp}",
                "write positive whole numbers",
            )
        elif sizes and gb >= 1 and not any(gb % (m * dp) == 0 for m in sizes):
            c.error(
                path + ("data_parallel", index),
                f"global_batch_size {gb} cannot be split over {dp} replicas with microbatch sizes "
                f"{', '.join(map(str, sizes))}",
                f"use a DP degree d with {gb} divisible by d x microbatch size, or change the batch",
            )
        elif c.recipe.constraints.max_gpus is not None and dp > c.recipe.constraints.max_gpus:
            c.error(
                path + ("data_parallel", index),
                f"{dp} replicas need more than max_gpus ({c.recipe.constraints.max_gpus}) GPUs",
                "lower the DP degree or raise max_gpus",
            )
    stages = p.max_pipeline_stages
    if stages is not None and stages < 1:
        c.error(
            path + ("max_pipeline_stages",),
            f"must be >= 1, got {stages}",
            "write a positive whole number",
        )
    elif stages is not None and spec is not None and stages > spec.num_layers:
        c.error(
            path + ("max_pipeline_stages",),
            f"{spec.name} has only {spec.num_layers} layers to split",
            f"write at most {spec.num_layers}",
        )


def _check_checkpointing(c: Checker) -> None:
    k = c.recipe.checkpointing
    path = ("checkpointing",)
    if k.every_steps < 1:
        c.error(
            path + ("every_steps",),
            f"must be >= 1, got {k.every_steps}",
            "write a positive whole number",
        )
    if k.keep_last < 1:
        c.error(
            path + ("keep_last",),
            f"must be >= 1, got {k.keep_last}",
            "keep at least the last checkpoint",
        )
    for scheme, url in (("s3", _S3_URL), ("gs", _GS_URL)):
        if k.path.startswith(f"{scheme}:") and not url.match(k.path):
            c.error(
                path + ("path",),
                f"'{k.path}' is not {scheme}://bucket/prefix",
                "write s3://bucket/prefix, gs://bucket/prefix or a local folder",
            )


def _check_runtime(c: Checker) -> None:
    r = c.recipe.runtime
    path = ("runtime",)
    if not 1 <= r.streams <= MAX_STREAMS:
        c.error(
            path + ("streams",), f"must be from 1 to {MAX_STREAMS}, got {r.streams}", "write e.g. 8"
        )
    if r.compression != "none" and r.allreduce == "flat":
        c.error(
            path + ("compression",),
            "compression applies to the cross-region hop of a hierarchical all-reduce",
            "write allreduce: hierarchical (or auto), or compression: none",
        )


def _check_recovery(c: Checker) -> None:
    r, path = c.recipe.recovery, ("recovery",)
    if r.max_attempts < 1:
        c.error(path + ("max_attempts",), f"must be >= 1, got {r.max_attempts}", "write e.g. 10")
    c.positive(path + ("max_seconds",), r.max_seconds)
    c.positive(path + ("controller_grace_s",), r.controller_grace_s)
    c.positive(path + ("backoff_s",), r.backoff_s, allow_zero=True)
    if r.max_backoff_s < r.backoff_s:
        c.error(
            path + ("max_backoff_s",),
            f"{r.max_backoff_s:g} is less than backoff_s ({r.backoff_s:g})",
            f"write at least {r.backoff_s:g}",
        )


def _check_local_cloud(c: Checker) -> None:
    local, path = c.recipe.local_cloud, ("local_cloud",)
    steps = c.recipe.training.steps
    chaos = (
        local.preempt_at_steps
        or local.preempt_location_at_steps
        or local.preempt_driver_at_steps
        or local.slow_nodes
    )
    if chaos and c.recipe.provider != "local":
        c.error(
            path,
            f"applies to the local simulated cloud, not provider {c.recipe.provider}",
            "remove local_cloud, or write provider: local",
        )
    for name in ("preempt_at_steps", "preempt_location_at_steps", "preempt_driver_at_steps"):
        bad = [k for k in getattr(local, name) if not 1 <= k < steps]
        if bad:
            shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
            c.error(
                path + (name,),
                f"steps [{shown}] are outside 1..{steps - 1} (training.steps is {steps})",
                "list steps the job will reach, e.g. [60]",
            )
    if local.notice_s <= 0:
        c.error(path + ("notice_s",), f"must be > 0, got {local.notice_s}", "write e.g. 2.0")
    if local.slow_nodes < 0:
        c.error(path + ("slow_nodes",), f"must be >= 0, got {local.slow_nodes}", "write e.g. 1")
    if local.slowdown <= 1:
        c.error(path + ("slowdown",), f"must be > 1, got {local.slowdown}", "write e.g. 2.0")
