"""The shape (specs.py's ``GptSpec``) of a model that is not built in, with no torch import.

The planner, the simulator and the analytic profiles read a model's shape: layer count,
parameters per layer, sequence length, the tied weight. A Hugging Face GPT-2 has exactly the
shape of our GPT decoder (learned positions, biases, a tied head, GELU MLP), so its shape comes
from its config class (transformers' ``GPT2Config``, which fills the defaults the recipe leaves
out); ``hf_spec`` is what every part of the orchestrator sees for it.
"""

from __future__ import annotations

from collections.abc import Mapping

from runtime.models.specs import GptSpec


class ShapeError(ValueError):
    """A model config that does not describe a model: names the field and what to write."""


def hf_config(family: str, config: Mapping):
    """transformers' config object of ``family`` with ``config``'s fields (ShapeError if a field
    is unknown or a value wrong; ImportError without transformers)."""
    if family != "gpt2":
        raise ShapeError(f"Hugging Face family {family!r} is not supported; supported: gpt2")
    from transformers import GPT2Config

    known = set(GPT2Config().to_dict())
    unknown = sorted(set(config) - known - {"n_inner"})
    if unknown:
        raise ShapeError(f"GPT2Config has no field {', '.join(unknown)}")
    try:
        return GPT2Config(**dict(config))
    except (TypeError, ValueError) as error:
        raise ShapeError(f"GPT2Config: {error}") from None


def hf_spec(family: str, config: Mapping, *, label: str) -> GptSpec:
    """The shape of the Hugging Face model ``family`` built from ``config``."""
    c = hf_config(family, config)
    sizes = ("n_layer", "n_embd", "n_head", "n_positions", "vocab_size")
    for name in sizes + (("n_inner",) if c.n_inner is not None else ()):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ShapeError(f"{name} must be a whole number >= 1, got {value!r}")
    if c.n_embd % c.n_head:
        raise ShapeError(f"n_embd {c.n_embd} is not a multiple of n_head {c.n_head}")
    return GptSpec(
        name=label,
        description=f"Hugging Face {family} ({c.n_layer} blocks, width {c.n_embd})",
        num_blocks=c.n_layer,
        hidden_size=c.n_embd,
        num_heads=c.n_head,
        ffn_hidden_size=c.n_inner or 4 * c.n_embd,
        seq_len=c.n_positions,
        vocab_size=c.vocab_size,
        tied_embeddings=bool(c.tie_word_embeddings),
    )
