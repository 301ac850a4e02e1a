"""Model profiles: SAILOR's import, choosing a source per GPU, the JSON format, range queries."""

from __future__ import annotations

import json

import pytest

from orchestrator.catalog.catalog import PACKAGED_CONFIGS_DIR
from orchestrator.errors import UserError
from orchestrator.profiles import profile_for_recipe, sailor_profile
from orchestrator.profiles.profile import load_profile_json, profile_to_json
from orchestrator.profiles.sailor import sailor_gpus
from orchestrator.recipe import parse_recipe
from runtime.models.specs import model_spec

SAILOR = PACKAGED_CONFIGS_DIR / "profiles" / "sailor"


def recipe(text: str, tmp_path):
    return parse_recipe(text, file="r.yaml", folder=tmp_path)


def test_sailor_import_keeps_measured_figures(catalog):
    profile = sailor_profile("opt-350m", ["A100", "V100"], catalog)
    raw = json.loads((SAILOR / "OPT-350" / "A100-40" / "profile.json").read_text())
    info = json.loads((SAILOR / "llm_info.json").read_text())["OPT-350"]
    table = profile.time_table("A100", 2, 1)
    assert (
        table.forward_s[5] == raw["2"]["1"]["5"][0] and table.backward_s[5] == raw["2"]["1"]["5"][1]
    )
    layers = profile.layer_table(1)
    assert layers.params[1] == info["1"]["1"]["params_floats"]
    assert layers.act_kept_bytes[1] == info["1"]["1"]["act_mem_bytes"]  # measured bytes, not halved
    assert profile.num_layers == 26 and profile.gpus["A100"].source == "imported"
    # SAILOR's update time is the step of the model it profiled (embedding, 2 blocks, head): per parameter
    profiled = table.update_s[0] + table.update_s[1] + table.update_s[2] + table.update_s[-1]
    assert profiled == pytest.approx(raw["2"]["1"]["0"][2])
    assert table.update_s[0] > table.update_s[1]  # the embedding holds more parameters than a block


def test_sailor_gpus_map_to_catalog_names(catalog):
    assert set(sailor_gpus(model_spec("opt-350m"), catalog)) == {
        "A100",
        "A100-80GB",
        "GH200",
        "RTX-2080",
        "RTX-3090",
        "Titan-RTX",
        "V100",
    }
    assert sailor_gpus(model_spec("gpt-tiny"), catalog) == {}


def test_inconsistent_sailor_file_is_reported(catalog):
    with pytest.raises(UserError) as info:
        sailor_profile("gpt-neo-2.7b", ["GH200"], catalog)
    assert "26 layers" in info.value.message and "inconsistent" in info.value.message


def test_missing_gpu_says_where_sailor_measured(catalog):
    with pytest.raises(UserError) as info:
        sailor_profile("opt-350m", ["T4"], catalog)
    assert "did not profile opt-350m on T4" in info.value.message and "A100" in info.value.fix


TRAINING = "training:\n  global_batch_size: 64\n  steps: 1\n  precision: {precision}\n"


@pytest.mark.parametrize(
    ("precision", "sources"),
    [
        ("fp16-mixed", {"A100": "imported", "T4": "estimated"}),
        ("fp32", {"A100": "estimated", "T4": "estimated"}),
    ],
)
def test_auto_takes_sailor_where_it_measured(catalog, tmp_path, precision, sources):
    r = recipe(
        "model: {name: opt-350m}\nprovider: gcp\n" + TRAINING.format(precision=precision), tmp_path
    )
    profile = profile_for_recipe(r, {"A100", "T4"}, catalog, microbatch_sizes=[1], tp_degrees=[1])
    assert profile.sources() == sources
    assert profile.num_layers == 26


def test_forced_sources(catalog, tmp_path):
    analytic = recipe(
        "model: {name: opt-350m, profile: analytic}\nprovider: gcp\n"
        + TRAINING.format(precision="fp16-mixed"),
        tmp_path,
    )
    assert profile_for_recipe(analytic, {"A100"}, catalog).sources() == {"A100": "estimated"}
    sailor = recipe(
        "model: {name: opt-350m, profile: sailor}\nprovider: gcp\n"
        + TRAINING.format(precision="fp16-mixed"),
        tmp_path,
    )
    with pytest.raises(UserError):
        profile_for_recipe(sailor, {"T4"}, catalog)


def test_json_round_trip(catalog, tmp_path):
    profile = sailor_profile("opt-350m", ["V100"], catalog)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile_to_json(profile, "V100")))
    loaded = load_profile_json(path)
    assert loaded.time_table("V100", 4, 2) == profile.time_table("V100", 4, 2)
    assert loaded.layer_table(2) == profile.layer_table(2)
    assert (loaded.model, loaded.precision, loaded.optimizer) == ("opt-350m", "fp16-mixed", "adam")
    r = recipe(
        f"model: {{name: opt-350m, profile: {path.name}}}\nprovider: gcp\n"
        + TRAINING.format(precision="fp16-mixed"),
        tmp_path,
    )
    assert profile_for_recipe(r, {"V100"}, catalog).sources() == {"V100": "imported"}


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ({"format": "other"}, "expected format"),
        ({"format": "geo-orchestrator/profile-v1"}, "missing 'model'"),
    ],
)
def test_bad_profile_file(tmp_path, document, fragment):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(document))
    with pytest.raises(UserError) as info:
        load_profile_json(path)
    assert fragment in info.value.message


def test_missing_microbatch_size_is_scaled(catalog):
    profile = sailor_profile("opt-350m", ["A100"], catalog)
    three = profile.time_table("A100", 3, 1)
    two = profile.time_table("A100", 2, 1)
    assert three.scaled_from_mbs == 2
    assert three.forward_s[3] == pytest.approx(two.forward_s[3] * 1.5)


def test_range_queries(catalog):
    profile = sailor_profile("opt-350m", ["A100"], catalog)
    table = profile.time_table("A100", 1, 1)
    assert table.stage(3, 9)[0] == pytest.approx(sum(table.forward_s[3:9]))
    params, kept, received, sent = profile.stage_facts(1, 3, 9)
    layers = profile.layer_table(1)
    assert params == sum(layers.params[3:9]) and kept == pytest.approx(
        sum(layers.act_kept_bytes[3:9])
    )
    assert received == layers.act_out_elements[2] and sent == layers.act_out_elements[8]
    assert profile.stage_facts(1, 0, 26)[2:] == (0, 0)


def test_a_smaller_microbatch_measured_slower_is_capped_at_the_larger_ones(catalog):
    """SAILOR's GH-96 file has OPT-350M's blocks at TP 4 slower at microbatch 1 than at 2 (2.38
    against 1.51 ms forward): taken as the larger's, the rest untouched, and the origin says so."""
    from orchestrator.profiles.profile import TimeTable
    from orchestrator.profiles.sailor import monotone_in_microbatch

    profile = sailor_profile("opt-350m", ["GH200"], catalog)
    raw = json.loads((SAILOR / "OPT-350" / "GH-96" / "profile.json").read_text())
    one, two = profile.time_table("GH200", 1, 4), profile.time_table("GH200", 2, 4)
    assert raw["1"]["4"]["5"][0] > raw["2"]["4"]["5"][0]
    assert one.forward_s[5] == two.forward_s[5] == raw["2"]["4"]["5"][0]
    assert profile.time_table("GH200", 8, 4).forward_s[5] == raw["8"]["4"]["5"][0]
    assert "mbs 1 TP 4" in profile.gpus["GH200"].origin
    table = lambda f: TimeTable(forward_s=f, backward_s=f, update_s=(0.0,) * len(f))  # noqa: E731
    times = {(1, 1): table((3.0, 1.0)), (2, 1): table((2.0, 2.0)), (4, 1): table((1.5, 4.0))}
    fixed, lowered = monotone_in_microbatch(times)
    assert fixed[(1, 1)].forward_s == (1.5, 1.0) and fixed[(2, 1)].forward_s == (1.5, 2.0)
    assert lowered == {(2, 1): 2, (1, 1): 2} and fixed[(4, 1)] is times[(4, 1)]
