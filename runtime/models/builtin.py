"""The built-in models (specs.py) through the model protocol (protocol.py), as a user's would be."""

from __future__ import annotations

from runtime.models.protocol import ImageInputs, ModelError, ModelParts, TokenInputs
from runtime.models.specs import BUILTIN_MODELS, GptSpec


def build_builtin(name: str, *, seed: int) -> ModelParts:
    spec = BUILTIN_MODELS.get(name)
    if spec is None:
        raise ModelError(f"no built-in model {name!r}; built-in: {', '.join(BUILTIN_MODELS)}")
    if isinstance(spec, GptSpec):
        from runtime.models.gpt import build_layers, next_token_loss, tp_plan

        layers = build_layers(spec, seed=seed)
        return ModelParts(
            layers=layers,
            loss=next_token_loss,
            inputs=TokenInputs(seq_len=spec.seq_len, vocab_size=spec.vocab_size),
            tied=layers[0].tokens.weight if spec.tied_embeddings else None,
            tp_plan=tp_plan,
        )
    from runtime.models.cnn import build_layers as build_cnn
    from runtime.models.cnn import classification_loss

    return ModelParts(
        layers=build_cnn(spec, seed=seed),
        loss=classification_loss,
        inputs=ImageInputs(image_size=spec.image_size, num_classes=spec.num_classes),
    )
