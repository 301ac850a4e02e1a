"""The recipe's model and data, checked (checks.py runs these among its checks): exactly one way to
name the model, its settings for that way only, its shape (built in, from a Hugging Face config,
or read off the user's built model), its profile, and data it can read.
"""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import UserError
from orchestrator.recipe.models import spec_of
from orchestrator.yamlsrc import file_problem
from runtime.models.specs import BUILTIN_MODELS, ModelSpec

if TYPE_CHECKING:
    from orchestrator.recipe.checks import Checker

_DATA_BY_FAMILY = {
    "gpt": ("builtin-text", "shards", "tokens"),
    "cnn": ("synthetic-images", "shards"),
    "custom": ("builtin-text", "synthetic-images", "shards", "tokens"),  # as its inputs say
}
_WITH_PATH = ("shards", "tokens")


def check_model(c: Checker) -> ModelSpec | None:
    model = c.recipe.model
    named = [k for k in ("name", "hf", "module") if getattr(model, k)]
    if len(named) != 1:
        c.error(
            ("model",),
            "the model is named " + (" and ".join(named) if named else "by none of them"),
            "write exactly one of name: (a built-in model), hf: (a Hugging Face family) or "
            "module: (your build function)",
        )
        return None
    if model.config and not model.hf or model.weights and not model.hf:
        c.error(
            ("model", "config" if model.config else "weights"), "is for hf: models", "remove it"
        )
    if model.args and not model.module:
        c.error(("model", "args"), "is for module: models", "remove it, or write module:")
    if not model.name:
        return _check_own_model(c, model)
    spec = BUILTIN_MODELS.get(model.name)
    if spec is None:
        close = difflib.get_close_matches(model.name, list(BUILTIN_MODELS), n=1, cutoff=0.5)
        c.error(
            ("model", "name"),
            f"unknown model '{model.name}'" + (f" (did you mean '{close[0]}'?)" if close else ""),
            f"use a built-in model: {', '.join(BUILTIN_MODELS)}",
        )
        return None
    return _check_profile(c, spec)


def _check_own_model(c: Checker, model) -> ModelSpec | None:
    """A Hugging Face or a user's model: its shape from its config (hf), or measured (module)."""
    if model.module and ":" not in model.module:
        c.error(
            ("model", "module"),
            f"'{model.module}' names no function",
            "write 'package.module:function'",
        )
    if model.profile in ("sailor",):
        c.error(
            ("model", "profile"), "SAILOR published no profile of this model", "use profile: auto"
        )
    if model.code and not model.module:
        c.error(("model", "code"), "is for module: models", "remove it, or write module:")
    elif model.module and not (c.folder / (model.code or ".")).is_dir():
        c.error(("model", "code"), f"'{model.code}' is not a folder", "write your package's folder")
        return None
    try:
        spec = spec_of(with_code(model, c.folder))
    except UserError as error:
        c.error(
            tuple(error.field.split(".")) if error.field else ("model",), error.message, error.fix
        )
        return None
    return _check_profile(c, spec)


def _check_profile(c: Checker, spec: ModelSpec) -> ModelSpec:
    model = c.recipe.model
    profile = model.profile
    if profile == "sailor" and getattr(spec, "sailor_name", None) is None:
        with_sailor = [n for n, s in BUILTIN_MODELS.items() if getattr(s, "sailor_name", None)]
        c.error(
            ("model", "profile"),
            f"SAILOR published no profile of {model.name}",
            f"use profile: analytic, or a model SAILOR profiled: {', '.join(with_sailor)}",
        )
    elif profile not in ("auto", "analytic", "sailor"):
        path = c.folder / profile
        if not profile.endswith(".json"):
            c.error(
                ("model", "profile"),
                f"'{profile}' is not auto, analytic, sailor or a .json file",
                "write auto, analytic, sailor, or the path of a profile written by `orchestrator profile`",
            )
        elif file_problem(path) is not None:
            problem = file_problem(path)
            c.error(
                ("model", "profile"),
                f"profile file '{path}': {'does not exist' if 'not found' in problem else problem}",
                "check the path (relative to the recipe's folder) or use profile: auto",
            )
    return spec


def check_data(c: Checker, spec: ModelSpec | None) -> None:
    data = c.recipe.data
    if (
        spec is not None
        and data.source != "auto"
        and data.source not in _DATA_BY_FAMILY[spec.family]
    ):
        allowed = " or ".join(("auto",) + _DATA_BY_FAMILY[spec.family])
        c.error(
            ("data", "source"),
            f"{spec.name} is a {spec.family.upper()} model; it cannot train on {data.source}",
            f"write source: {allowed}",
        )
    vocab = getattr(spec, "vocab_size", None)
    if vocab is not None and vocab < 256 and data.source in ("auto", "builtin-text"):
        c.error(
            ("model", "config" if c.recipe.model.hf else "name"),
            f"{spec.name} has a vocabulary of {vocab}; the built-in text is bytes (256 ids)",
            "give the model a vocabulary of at least 256 (vocab_size)",
        )
    if data.source in _WITH_PATH and not data.path:
        c.error(
            ("data",),
            f"source {data.source} needs a path",
            "add path: a folder or s3://bucket/prefix of "
            + (".tar shards" if data.source == "shards" else ".bin token files"),
        )
    if data.path and data.source not in _WITH_PATH:
        c.error(
            ("data", "path"),
            "path is only read when source is shards or tokens",
            "remove path, or write source: shards or tokens",
        )
    if data.log_samples and data.source not in _WITH_PATH:
        c.error(
            ("data", "log_samples"), "only token files and shards log their samples", "remove it"
        )
    if (
        data.source in _WITH_PATH
        and data.path
        and not data.path.startswith("s3://")
        and not (c.folder / data.path).is_dir()
    ):
        c.error(
            ("data", "path"),
            f"folder '{c.folder / data.path}' does not exist",
            "give an existing folder, or s3://bucket/prefix",
        )


def with_code(model, folder: Path):
    """A module model's code folder made absolute (default: the recipe's folder)."""
    if not model.module:
        return model
    return dataclasses.replace(model, code=str((folder / (model.code or ".")).resolve()))
