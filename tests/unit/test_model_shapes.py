"""A Hugging Face GPT-2's shape is read without transformers (whose import loads torch): the
fields and defaults kept for that must be the installed GPT2Config's own."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from runtime.models.shapes import GPT2_FIELDS, GPT2_SHAPE_DEFAULTS, ShapeError, hf_spec


def test_the_kept_fields_and_defaults_are_gpt2configs():
    transformers = pytest.importorskip("transformers")
    config = transformers.GPT2Config
    own = set(inspect.signature(config.__init__).parameters) - {"self", "kwargs"}
    assert GPT2_FIELDS == own | {"tie_word_embeddings"}
    defaults = config().to_dict()
    assert {k: defaults[k] for k in GPT2_SHAPE_DEFAULTS} == GPT2_SHAPE_DEFAULTS


def test_the_shape_over_the_defaults_and_the_errors():
    spec = hf_spec("gpt2", {"n_layer": 2, "n_embd": 64, "n_head": 4}, label="hf:gpt2")
    assert (spec.num_blocks, spec.hidden_size, spec.seq_len, spec.vocab_size) == (
        2,
        64,
        1024,
        50257,
    )
    assert spec.ffn_hidden_size == 256 and spec.tied_embeddings
    with pytest.raises(ShapeError, match="no field n_layers"):
        hf_spec("gpt2", {"n_layers": 2}, label="x")
    with pytest.raises(ShapeError, match="n_embd must be a whole number"):
        hf_spec("gpt2", {"n_embd": None}, label="x")


def test_validating_a_hugging_face_recipe_does_not_import_torch():
    code = (
        "import sys\n"
        "from orchestrator.recipe import load_recipe\n"
        "load_recipe('recipes/hf-gpt2-tp.yaml')\n"
        "print('torch' in sys.modules)\n"
    )
    repo = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo
    )
    assert out.stdout.strip() == "False"
