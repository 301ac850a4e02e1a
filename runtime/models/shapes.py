"""The shape (specs.py's ``GptSpec``) of a model that is not built in, with no torch import.

The planner, the simulator and the analytic profiles read a model's shape: layer count,
parameters per layer, sequence length, the tied weight. A Hugging Face GPT-2 has exactly the
shape of our GPT decoder (learned positions, biases, a tied head, GELU MLP), so its shape comes
from its config's fields, over ``GPT2Config``'s defaults (kept here: importing transformers loads
torch); ``hf_spec`` is what every part of the orchestrator sees for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runtime.models.specs import GptSpec


class ShapeError(ValueError):
    """A model config that does not describe a model: names the field and what to write."""


# GPT2Config's own fields (its __init__'s) and tie_word_embeddings, with the defaults of those
# that set the shape: read here without transformers, whose import loads torch (validate and plan
# stay torch-free); tests/unit/test_model_shapes.py checks both against the installed class. The
# workers build the model from transformers' own class, which checks every value.
GPT2_FIELDS = frozenset(
    {
        "vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner",
        "activation_function", "resid_pdrop", "embd_pdrop", "attn_pdrop", "layer_norm_epsilon",
        "initializer_range", "summary_type", "summary_use_proj", "summary_activation",
        "summary_proj_to_labels", "summary_first_dropout", "scale_attn_weights", "use_cache",
        "bos_token_id", "eos_token_id", "scale_attn_by_inverse_layer_idx",
        "reorder_and_upcast_attn", "tie_word_embeddings",
    }
)  # fmt: skip
GPT2_SHAPE_DEFAULTS = {
    "vocab_size": 50257,
    "n_positions": 1024,
    "n_embd": 768,
    "n_layer": 12,
    "n_head": 12,
    "n_inner": None,
    "tie_word_embeddings": True,
}


@dataclass(frozen=True)
class Gpt2Shape:
    """The fields of a GPT-2 config that set its shape."""

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int | None
    tie_word_embeddings: bool


def hf_config(family: str, config: Mapping) -> Gpt2Shape:
    """The shape fields of ``family``'s config with ``config``'s values over its defaults
    (ShapeError if a field is unknown or a size wrong)."""
    if family != "gpt2":
        raise ShapeError(f"Hugging Face family {family!r} is not supported; supported: gpt2")
    unknown = sorted(set(config) - GPT2_FIELDS)
    if unknown:
        raise ShapeError(f"GPT2Config has no field {', '.join(unknown)}")
    return Gpt2Shape(**{k: config.get(k, v) for k, v in GPT2_SHAPE_DEFAULTS.items()})


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
