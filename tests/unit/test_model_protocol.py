"""The model protocol (runtime/models/protocol.py): a Hugging Face GPT-2 split into layers computes
what the whole model computes and has the shape the planner reads; a user's build function is
called with its seed and arguments and checked; recipes name such models, strictly."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from orchestrator.errors import RecipeError  # noqa: E402
from orchestrator.recipe import parse_recipe  # noqa: E402
from orchestrator.recipe.models import model_label, model_source, spec_of  # noqa: E402
from runtime.models.protocol import (  # noqa: E402
    ModelError,
    ModelSource,
    build_model,
    owned_parameters,
)

SMALL = {"n_layer": 2, "n_embd": 32, "n_head": 4, "n_positions": 16, "vocab_size": 300}
USER_PACKAGES = Path(__file__).parents[1] / "fixtures" / "usermodels"
TRAINING = "training: {global_batch_size: 8, microbatch_sizes: [2], steps: 4}\n"


def test_a_gpt2_in_layers_computes_what_the_whole_model_does():
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    config = {**SMALL, "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0}
    parts = build_model(ModelSource(kind="hf", target="gpt2", args=config), seed=11)
    assert len(parts.layers) == 2 + 2 and parts.tied is parts.layers[0].wte.weight
    torch.manual_seed(11)
    whole = GPT2LMHeadModel(GPT2Config(**config))  # the same seed: the same weights
    ids = torch.randint(0, 300, (3, 16))
    x = ids
    for layer in parts.layers:
        x = layer(x)
    assert torch.equal(x, whole(ids).logits)


def test_a_gpt2s_shape_is_what_its_layers_hold():
    pytest.importorskip("transformers")
    parts = build_model(ModelSource(kind="hf", target="gpt2", args=SMALL), seed=0)
    recipe = parse_recipe(
        f"model: {{hf: gpt2, config: {SMALL}}}\n" + TRAINING, file="r.yaml", folder=Path(".")
    )
    spec = spec_of(recipe.model)
    owned = [sum(p.numel() for p in mine) for mine in owned_parameters(parts.layers)]
    assert tuple(owned) == spec.layer_parameters()
    assert spec.seq_len == 16 and spec.tied_parameters() == 300 * 32
    assert model_label(recipe.model) == "hf:gpt2"
    assert model_source(recipe.model) == ModelSource(kind="hf", target="gpt2", args=SMALL)


def test_a_users_function_gets_its_seed_and_arguments(monkeypatch):
    monkeypatch.syspath_prepend(str(USER_PACKAGES))
    source = ModelSource(kind="module", target="tiny_lm:build", args={"depth": 2, "width": 16})
    before = torch.random.get_rng_state()
    one, two = build_model(source, seed=3), build_model(source, seed=3)
    assert len(one.layers) == 4  # embedding, two mixers, head
    assert torch.equal(one.layers[1].mlp[0].weight, two.layers[1].mlp[0].weight)
    assert torch.equal(torch.random.get_rng_state(), before)  # its seeding left ours alone


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ("tiny_lm", "not 'package.module:function'"),
        ("no_such_package.model:build", "cannot be imported"),
        ("tiny_lm:nothing", "has no function 'nothing'"),
        ("tiny_lm.model:loss", "takes seed and model.args"),  # not a build function
    ],
)
def test_a_function_that_is_not_a_model_is_refused_with_what_to_write(
    monkeypatch, target, fragment
):
    monkeypatch.syspath_prepend(str(USER_PACKAGES))
    monkeypatch.delitem(sys.modules, "tiny_lm", raising=False)
    with pytest.raises(ModelError, match=fragment):
        build_model(ModelSource(kind="module", target=target), seed=0)


@pytest.mark.parametrize(
    ("model", "field", "fragment"),
    [
        ("{name: gpt-tiny, hf: gpt2}", "model", "named name and hf"),
        ("{profile: auto}", "model", "by none of them"),
        ("{hf: gpt2, config: {n_layers: 4}}", "model.config", "no field n_layers"),
        ("{hf: gpt2, config: {n_layer: {deep: 1}}}", "model.config.n_layer", "expected a number"),
        ("{name: gpt-tiny, args: {depth: 2}}", "model.args", "for module: models"),
        ("{module: my_models}", "model.module", "names no function"),
        ("{hf: llama, config: {}}", "model.config", "not supported"),
        ("{hf: gpt2, config: {vocab_size: 100}}", "model.config", "vocabulary of 100"),
    ],
)
def test_recipes_name_one_model_and_its_settings_strictly(model, field, fragment):
    pytest.importorskip("transformers")
    with pytest.raises(RecipeError) as caught:
        parse_recipe(f"model: {model}\n" + TRAINING, file="r.yaml", folder=Path("."))
    problems = [caught.value, *caught.value.also]
    assert any(p.field == field and fragment in p.message for p in problems), [
        (p.field, p.message) for p in problems
    ]


def test_gpt2_weights_come_from_a_saved_folder_when_given(tmp_path):
    pytest.importorskip("transformers")
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(5)
    saved = GPT2LMHeadModel(GPT2Config(**SMALL))
    saved.save_pretrained(tmp_path / "weights")
    source = ModelSource(kind="hf", target="gpt2", args=SMALL, weights=str(tmp_path / "weights"))
    parts = build_model(source, seed=0)  # the seed does not matter: the weights are loaded
    hidden = SMALL["n_embd"]  # c_attn is q|k|v as linears: (out, in), Conv1D's transposed
    assert torch.equal(
        parts.layers[1].block.attn.c_attn.k.weight,
        saved.transformer.h[0].attn.c_attn.weight[:, hidden : 2 * hidden].t(),
    )
    assert parts.tied is parts.layers[-1].lm_head.weight  # still tied after loading
    with pytest.raises(ModelError, match="is not a folder"):
        build_model(ModelSource(kind="hf", target="gpt2", weights=str(tmp_path / "none")), seed=0)


def test_a_users_model_is_measured_here_on_the_local_cloud_and_asked_for_elsewhere(tmp_path):
    """No formula gives a user's model's times: on the local cloud `profile: auto` times its
    layers on this machine; on a cloud the recipe must name a measured profile."""
    from orchestrator.catalog import default_catalog
    from orchestrator.errors import UserError
    from orchestrator.planner import plan_recipe

    (tmp_path / "tiny_lm").mkdir()
    for path in (USER_PACKAGES / "tiny_lm").glob("*.py"):
        (tmp_path / "tiny_lm" / path.name).write_text(path.read_text())
    text = (
        'model: {module: "tiny_lm:build", args: {depth: 2}}\n'
        "constraints: {gpu_types: [T4], max_gpus: 2}\n" + TRAINING
    )
    catalog = default_catalog()
    local = parse_recipe(text, file="r.yaml", folder=tmp_path)
    best = plan_recipe(local, catalog, catalog.market("local")).plans[0]
    assert best.estimate.samples_per_s > 0
    on_gcp = parse_recipe("provider: gcp\n" + text, file="r.yaml", folder=tmp_path)
    with pytest.raises(UserError, match="needs the model's measured times") as caught:
        plan_recipe(on_gcp, catalog, catalog.market("gcp"))
    assert "orchestrator profile" in caught.value.fix
