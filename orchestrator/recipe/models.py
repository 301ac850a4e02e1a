"""Which model a recipe trains, as the rest of the orchestrator reads it: its label and its shape.

``model.name`` names a built-in model (runtime/models/specs.py); ``model.hf`` a Hugging Face
family built from ``model.config`` (its shape from the config class: runtime/models/shapes.py).
"""

from __future__ import annotations

from orchestrator.errors import UserError
from orchestrator.recipe.schema import ModelConfig
from runtime.models.specs import BUILTIN_MODELS, ModelSpec


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
        from runtime.models.shapes import ShapeError, hf_spec

        try:
            return hf_spec(model.hf, model.config.to_dict(), label=model_label(model))
        except ShapeError as error:
            raise UserError(
                str(error), field="model.config", fix="write fields of the family's config class"
            ) from None
        except ImportError:
            raise UserError(
                "model.hf needs transformers, which is not installed",
                field="model.hf",
                fix="pip install 'geo-orchestrator[hf]'",
            ) from None
    if model.module:
        raise UserError(
            f"model.module {model.module}: the planner cannot size a model it has not measured yet",
            field="model.module",
            fix="run it on the local cloud (provider: local) with profile: auto",
        )
    return BUILTIN_MODELS[model.name]


def model_source(model: ModelConfig):
    """What the workers build (runtime/models/protocol.py's ModelSource; imports torch)."""
    from runtime.models.protocol import ModelSource

    if model.hf:
        return ModelSource(
            kind="hf", target=model.hf, args=model.config.to_dict(), weights=model.weights
        )
    if model.module:
        return ModelSource(kind="module", target=model.module, args=model.args.to_dict())
    return ModelSource(kind="builtin", target=model.name)
