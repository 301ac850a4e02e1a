"""Which model a recipe trains, as the rest of the orchestrator reads it: its label and its shape.

``model.name`` names a built-in model (runtime/models/specs.py); ``model.hf`` a Hugging Face
family built from ``model.config`` (its shape from the config class: runtime/models/shapes.py).
"""

from __future__ import annotations

import contextlib
import functools
import sys
from pathlib import Path

from orchestrator.errors import UserError
from orchestrator.recipe.binder import Settings
from orchestrator.recipe.schema import ModelConfig
from runtime.models.specs import BUILTIN_MODELS, CustomSpec, ModelSpec


def model_label(model: ModelConfig) -> str:
    """How jobs, profiles and plans name the model: ``gpt-tiny``, ``hf:gpt2``, ``module:pkg.m:f``."""
    if model.hf:
        return f"hf:{model.hf}"
    if model.module:
        return f"module:{model.module}"
    assert model.name, "checks.py refuses a recipe that names no model"
    return model.name


def spec_of(model: ModelConfig) -> ModelSpec:
    """The model's shape (layers, parameters, sequence length); UserError naming the field."""
    if model.hf:
        import importlib.util

        from runtime.models.shapes import ShapeError, hf_spec

        # looked up, not imported: importing transformers loads torch (shapes.py)
        if importlib.util.find_spec("transformers") is None:
            raise UserError(
                "model.hf needs transformers, which is not installed",
                field="model.hf",
                fix="pip install 'geo-orchestrator[hf]'",
            )
        try:
            return hf_spec(model.hf, model.config.to_dict(), label=model_label(model))
        except ShapeError as error:
            raise UserError(
                str(error), field="model.config", fix="write fields of the family's config class"
            ) from None
    if model.module:
        assert model.code is not None, "checks.py makes the code's folder absolute"
        return _module_shape(model.module, model.args, model.code, model_label(model))
    return BUILTIN_MODELS[model.name]


@functools.lru_cache(maxsize=8)
def _module_shape(target: str, args: Settings, code: str, label: str) -> CustomSpec:
    """Build the user's model once (its package imported from ``code``) and read its shape."""
    from runtime.models.protocol import (
        ModelError,
        ModelSource,
        TokenInputs,
        build_model,
        owned_parameters,
    )

    source = ModelSource(kind="module", target=target, args=args.to_dict())
    with _importable(code):
        try:
            parts = build_model(source, seed=0)
        except ModelError as error:
            raise UserError(str(error), field="model.module", fix=_MODULE_FIX) from None
    owned = [sum(p.numel() for p in mine) for mine in owned_parameters(parts.layers)]
    tokens = isinstance(parts.inputs, TokenInputs)
    return CustomSpec(
        name=label,
        description=f"{target} ({len(owned)} layers)",
        params=tuple(owned),
        seq_len=parts.inputs.seq_len if tokens else 1,
        inputs="tokens" if tokens else "images",
        tied=parts.tied.numel() if parts.tied is not None else 0,
    )


_MODULE_FIX = "fix the function (docs/models.md shows the protocol), or the module's path"


@contextlib.contextmanager
def _importable(folder: str):
    """``folder`` first on ``sys.path`` while the user's package is imported."""
    added = folder not in sys.path
    if added:
        sys.path.insert(0, folder)
    try:
        yield
    finally:
        if added and folder in sys.path:
            sys.path.remove(folder)


def code_env(model: ModelConfig) -> dict | None:
    """Ray's job-level ``runtime_env`` that ships a module model's package to every worker (its
    top-level package or module under ``model.code``); None for other models."""
    if not model.module:
        return None
    top = model.module.partition(":")[0].split(".")[0]
    folder = Path(model.code or ".")
    path = folder / top if (folder / top).is_dir() else folder / f"{top}.py"
    return {"py_modules": [str(path)]}


def model_source(model: ModelConfig):
    """What the workers build (runtime/config.py's ModelSource, which models/protocol.py
    builds); plain data, no torch."""
    from runtime.config import ModelSource

    if model.hf:
        return ModelSource(
            kind="hf", target=model.hf, args=model.config.to_dict(), weights=model.weights
        )
    if model.module:
        return ModelSource(kind="module", target=model.module, args=model.args.to_dict())
    return ModelSource(kind="builtin", target=model.name)


def build_parts(model: ModelConfig, *, seed: int):
    """The model's parts in this process (a module model imported from its code's folder)."""
    from runtime.models.protocol import build_model

    with _importable(model.code) if model.module else contextlib.nullcontext():
        return build_model(model_source(model), seed=seed)
