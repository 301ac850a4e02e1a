"""Hostile input: every bad recipe, plan, market, events or state file is an error naming the field
or file (exit 2), never a traceback, a hang or unbounded memory (issue 16's findings)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.driver.events import read_events
from orchestrator.driver.state import StateCorrupt, StateStore
from orchestrator.errors import CatalogError, RecipeError
from orchestrator.plan import PlanError, parse_plan
from orchestrator.planner.bounds import held_share as _held_share
from orchestrator.recipe import load_recipe, parse_recipe
from orchestrator.recipe.limits import MAX_GLOBAL_BATCH_SIZE, MAX_SEED
from orchestrator.yamlsrc import YamlSyntaxError, load_yaml_text
from tests.unit.test_jobs_cmd import make_job

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = (REPO / "recipes" / "quickstart.yaml").read_text()
QUICK_PLAN = REPO / "recipes" / "plans" / "quickstart.yaml"
OFFER_HEADER = (
    "cloud,region,zone,instance_type,gpu,gpus_per_node,vcpus,memory_gib,on_demand_usd_per_hour,"
    "spot_usd_per_hour,available_count,preemption_rate_per_hour,source,as_of"
)
OFFER_ROW = "local,sim-us,sim-us-a,sim-t4-1,T4,1,1,2,0.572,0.180,{count},0.2,test,2023-04-01"


def recipe(**changes: str) -> str:
    """The quickstart recipe with some lines replaced: ``{'seed: 0': 'seed: -1'}``."""
    text = QUICKSTART
    for old, new in changes.items():
        assert old in text, old
        text = text.replace(old, new)
    return text


def recipe_error(text: str, tmp_path: Path) -> RecipeError:
    with pytest.raises(RecipeError) as info:
        parse_recipe(text, file="r.yaml", folder=tmp_path)
    assert info.value.fix, info.value.render()
    return info.value


def run(args: list[str], capsys) -> tuple[int, str, str]:
    code = main(args)
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


# ---- YAML: aliases, depth, size --------------------------------------------------------------


def test_a_recursive_alias_is_an_error_with_its_line():
    with pytest.raises(YamlSyntaxError) as info:
        load_yaml_text("a: 1\nb: &x [*x]\n", file="r.yaml")
    assert info.value.line == 2 and "recursive alias" in info.value.message


@pytest.mark.parametrize("opening", ["[", "{a: ", "- "])
def test_nesting_a_thousand_deep_is_an_error_not_a_recursion_error(opening):
    closing = {"[": "]", "{a: ": "}", "- ": ""}[opening]
    if opening == "- ":
        text = "".join("  " * i + "- \n" for i in range(1000)) + "  " * 1000 + "x\n"
    else:
        text = "a: " + opening * 1000 + "1" + closing * 1000 + "\n"
    with pytest.raises(YamlSyntaxError) as info:
        load_yaml_text(text, file="r.yaml")
    assert "nested more than 64 deep" in info.value.message


def test_a_billion_laughs_stops_at_the_alias_budget_quickly():
    text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]\n" for i in range(1, 10)
    )
    started = time.perf_counter()
    with pytest.raises(YamlSyntaxError) as info:
        load_yaml_text(text, file="r.yaml")
    assert "aliases expand to more than 10,000" in info.value.message
    assert info.value.line == 4 and time.perf_counter() - started < 1


def test_a_few_aliases_still_work():
    doc = load_yaml_text("a: &x [1, 2]\nb: *x\n", file="r.yaml")
    assert doc.value == {"a": [1, 2], "b": [1, 2]}


def test_a_huge_list_is_refused_fast_in_time_and_memory(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(
        recipe(**{"microbatch_sizes: [2, 4]": "microbatch_sizes: [" + "1," * 400_000 + "1]"})
    )
    started = time.perf_counter()
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "more than 100,000 values" in info.value.message
    assert time.perf_counter() - started < 5


def test_a_long_list_under_the_node_limit_names_its_field(tmp_path):
    sizes = "microbatch_sizes: [" + ", ".join(["1"] * 500) + "]"
    error = recipe_error(recipe(**{"microbatch_sizes: [2, 4]": sizes}), tmp_path)
    assert error.field == "training.microbatch_sizes" and "at most 64" in error.message


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "big.yaml"
    path.write_text(QUICKSTART + "#" * (2 * 1024 * 1024))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "larger than 1,048,576 bytes" in info.value.message and info.value.file == str(path)


# ---- what the recipe path is -------------------------------------------------------------------


def test_a_folder_a_fifo_and_a_device_are_named_never_read(tmp_path, capsys):
    fifo = tmp_path / "pipe.yaml"
    os.mkfifo(fifo)  # reading it would block for ever
    for path, words in (
        (tmp_path, "is a folder"),
        (fifo, "is a FIFO"),
        (Path("/dev/zero"), "is a device"),
        (tmp_path / "absent.yaml", "file not found"),
    ):
        code, _, err = run(["validate", str(path)], capsys)
        assert code == 2 and words in err and str(path) in err


def test_a_recipe_that_is_not_utf8_names_the_line(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_bytes(QUICKSTART.encode().replace(b"name: quickstart", b"name: quick\xffstart"))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert info.value.line == 4 and "0xff is not UTF-8" in info.value.message


# ---- numbers: finite and in range --------------------------------------------------------------


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("lr: 1.0e-3", "lr: .nan", "training.optimizer.lr"),
        ("weight_decay: 0.01", "weight_decay: .inf", "training.optimizer.weight_decay"),
        ("grad_clip_norm: null", "grad_clip_norm: -.inf", "training.optimizer.grad_clip_norm"),
        ("notice_s: 2.0", "notice_s: .inf", "local_cloud.notice_s"),
        ("budget_usd_per_hour: 5.0", "budget_usd_per_hour: .nan", "objective.budget_usd_per_hour"),
    ],
)
def test_nan_and_infinity_are_refused_naming_the_field(tmp_path, old, new, field):
    error = recipe_error(recipe(**{old: new}), tmp_path)
    assert error.field == field and "finite" in error.message


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("seed: 0", f"seed: {MAX_SEED + 1}", "training.seed"),
        ("seed: 0", "seed: " + "9" * 30, "training.seed"),
        ("steps: 200", "steps: " + "1" + "0" * 30, "training.steps"),
        (
            "global_batch_size: 16",
            f"global_batch_size: {MAX_GLOBAL_BATCH_SIZE * 2}",
            "training.global_batch_size",
        ),
        (
            "global_batch_size: 16",
            "global_batch_size: " + "1" + "0" * 30,
            "training.global_batch_size",
        ),
        ("lr: 1.0e-3", "lr: 1.0e+30", "training.optimizer.lr"),
        ("max_gpus: 4", "max_gpus: 1000000000", "constraints.max_gpus"),
        ("notice_s: 2.0", "notice_s: 1.0e+9", "local_cloud.notice_s"),
    ],
)
def test_numbers_over_their_maximum_are_refused(tmp_path, old, new, field):
    error = recipe_error(recipe(**{old: new}), tmp_path)
    assert error.field == field and "must be at most" in error.message
    assert len(error.render()) < 500  # the number is not echoed digit by digit


def test_a_whole_number_of_more_digits_than_python_reads_is_an_error(tmp_path):
    error = recipe_error(recipe(**{"seed: 0": "seed: " + "9" * 5000}), tmp_path)
    assert error.line == 24 and "cannot read the value" in error.message
    assert len(error.render()) < 500


def test_a_nan_budget_blames_the_budget_not_parallelism(tmp_path, capsys):
    path = tmp_path / "r.yaml"
    path.write_text(recipe(**{"budget_usd_per_hour: 5.0": "budget_usd_per_hour: .nan"}))
    code, _, err = run(["plan", str(path)], capsys)
    assert code == 2 and "objective.budget_usd_per_hour" in err and "parallelism" not in err


# ---- names -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["/abs/path", "../../x", '"a\\nb"', '"\\e[31mred"', "x" * 65, "'-x'"]
)
def test_a_name_that_is_no_job_name_is_a_recipe_error(tmp_path, name):
    error = recipe_error(recipe(**{"name: quickstart": f"name: {name}"}), tmp_path)
    assert error.field == "name" and error.line == 4


def test_a_fifty_megabyte_name_is_refused_by_size(tmp_path):
    path = tmp_path / "r.yaml"
    with path.open("w") as handle:
        handle.write("name: ")
        handle.write("x" * (50 * 1024 * 1024))
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    assert "larger than" in info.value.message


def test_a_recipe_without_a_name_is_named_after_its_file(tmp_path):
    path = tmp_path / "My Recipe (2).yaml"
    path.write_text(recipe(**{"name: quickstart\n": ""}))
    assert load_recipe(path).name == "My-Recipe-2"


@pytest.mark.parametrize("command", ["status", "logs", "stop"])
@pytest.mark.parametrize("job", ["../alpha", "/etc", "a\nb", "x" * 100, ".."])
def test_the_job_argument_is_checked_before_any_path_is_built(tmp_path, capsys, command, job):
    make_job(tmp_path / "jobs", "alpha")
    code, _, err = run([command, job, "--jobs-dir", str(tmp_path / "jobs")], capsys)
    assert code == 2 and "JOB" in err


# ---- places ------------------------------------------------------------------------------------


def test_excluding_every_allowed_place_blames_the_exclusions(tmp_path):
    text = recipe(
        **{"pricing: spot": "pricing: spot\n  exclude_locations: [local/sim-us, local/sim-eu]"}
    )
    error = recipe_error(text, tmp_path)
    assert error.field == "constraints.exclude_locations", error.render()
    assert "exclude fewer" in error.fix


# ---- the planner: bounded by what the market and the model can use ---------------------------


def test_the_held_share_never_reaches_zero():
    assert _held_share(1, 4) == 1.0
    assert _held_share(10**30, 3) > 0
    assert abs(_held_share(4, 2) - (1 - 0.75**2)) < 1e-12


def test_plan_time_does_not_grow_with_max_gpus_when_the_market_has_no_counts(tmp_path, capsys):
    market = tmp_path / "offers.csv"
    market.write_text(f"{OFFER_HEADER}\n{OFFER_ROW.format(count='')}\n")
    path = tmp_path / "r.yaml"
    path.write_text(
        recipe(**{"max_gpus: 4": "max_gpus: 1000000", "min_locations: 3": "min_locations: 1"})
    )
    text = path.read_text()
    for place in ("    - local/sim-us/sim-us-b\n", "    - local/sim-eu/sim-eu-a\n"):
        text = text.replace(place, "")
    path.write_text(text)
    started = time.perf_counter()
    code, out, err = run(["plan", str(path), "--market", str(market)], capsys)
    assert code == 0, err
    assert time.perf_counter() - started < 10


def test_a_market_row_with_nan_or_a_huge_count_names_its_column(tmp_path, capsys):
    for row, column in (
        (OFFER_ROW.format(count="4").replace("0.180", "nan"), "spot_usd_per_hour"),
        (OFFER_ROW.format(count="1" + "0" * 30), "available_count"),
        (OFFER_ROW.format(count="4").replace(",0.2,", ",inf,"), "preemption_rate_per_hour"),
    ):
        market = tmp_path / "offers.csv"
        market.write_text(f"{OFFER_HEADER}\n{row}\n")
        code, _, err = run(
            ["plan", str(REPO / "recipes" / "quickstart.yaml"), "--market", str(market)], capsys
        )
        assert code == 2 and f"{market}:2: {column}" in err, err


def test_a_market_that_is_not_utf8_or_a_folder_is_named(tmp_path, capsys):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(f"{OFFER_HEADER}\n".encode() + b"\xff\xfe\n")
    for market, words in ((bad, "not UTF-8"), (tmp_path, "is a folder")):
        code, _, err = run(
            ["plan", str(REPO / "recipes" / "quickstart.yaml"), "--market", str(market)], capsys
        )
        assert code == 2 and words in err and str(market) in err


def test_a_csv_field_over_the_csv_limit_is_a_catalog_error(tmp_path, catalog):
    market = tmp_path / "offers.csv"
    market.write_text(f'{OFFER_HEADER}\n"{"x" * 200_000}",a\n')
    with pytest.raises(CatalogError) as info:
        catalog.load_market(market)
    assert "not CSV" in info.value.message and info.value.file == str(market)


# ---- plans -------------------------------------------------------------------------------------


def test_a_plan_with_huge_numbers_names_the_field():
    text = QUICK_PLAN.read_text().replace("global_batch_size: 16", "global_batch_size: 1e30")
    with pytest.raises(PlanError) as info:
        parse_plan(text, file="p.yaml")
    assert info.value.field == "global_batch_size"
    text = QUICK_PLAN.read_text().replace("streams: 4", "streams: " + "9" * 40)
    with pytest.raises(PlanError) as info:
        parse_plan(text, file="p.yaml")
    assert info.value.field == "streams" and "at most 256" in info.value.message


def test_a_plan_that_is_a_folder_is_named(tmp_path, capsys):
    args = ["simulate", str(REPO / "recipes" / "quickstart.yaml"), "--plan", str(tmp_path)]
    code, _, err = run(args, capsys)
    assert code == 2 and "is a folder" in err


# ---- events and state --------------------------------------------------------------------------


def test_logs_skip_lines_that_are_not_utf8_or_not_events(tmp_path, capsys):
    folder = make_job(tmp_path, "alpha")
    with (folder / "events.jsonl").open("ab") as handle:
        handle.write(b'{"event": "bad \xff", "time_s": 1}\n[1, 2]\n"text"\n')
        handle.write(b'{"event": "far", "time_s": 1e300}\n{"event": 3, "time_s": 1}\n')
        handle.write(b'{"event": "x", "time_s": 1, "details": [1]}\n' + b"[" * 100_000 + b"\n")
        handle.write(b'{"event": "last", "time_s": 2, "details": {"k": "\\u001b[31m"}}\n')
    code, out, _ = run(["logs", "alpha", "--jobs-dir", str(tmp_path)], capsys)
    assert code == 0
    assert [line.split()[1] for line in out.splitlines()] == ["planned", "recovered", "last"]
    assert "\x1b" not in out and "\\x1b" in out


def test_read_events_skips_a_line_longer_than_its_limit(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(
        b'{"event": "'
        + b"x" * (2 * 1024 * 1024)
        + b'", "time_s": 1}\n{"event": "b", "time_s": 2}\n'
    )
    assert [e["event"] for e in read_events(path)] == ["b"]


def test_an_events_file_that_is_a_folder_is_named(tmp_path, capsys):
    folder = make_job(tmp_path, "alpha")
    (folder / "events.jsonl").unlink()
    (folder / "events.jsonl").mkdir()
    code, _, err = run(["logs", "alpha", "--jobs-dir", str(tmp_path)], capsys)
    assert code == 2 and "events.jsonl" in err and "is a folder" in err


def test_status_of_a_job_whose_state_is_a_folder_exits_2_naming_it(tmp_path, capsys):
    folder = make_job(tmp_path, "alpha")
    for name in ("state.json", "state.prev.json"):
        (folder / name).unlink(missing_ok=True)
    (folder / "state.json").mkdir()
    code, _, err = run(["status", "alpha", "--jobs-dir", str(tmp_path)], capsys)
    assert code == 2 and "state.json: is a folder" in err


def test_status_lists_the_other_jobs_beside_a_broken_one(tmp_path, capsys):
    make_job(tmp_path, "alpha")
    broken = make_job(tmp_path, "beta")
    (broken / "state.prev.json").unlink(missing_ok=True)
    (broken / "state.json").write_bytes(b"\xff\x00 not json")
    make_job(tmp_path, "gamma")
    code, out, _ = run(["status", "--jobs-dir", str(tmp_path)], capsys)
    assert code == 0 and "alpha" in out and "gamma" in out
    assert "unreadable" in out and str(broken / "state.json") in out and "not JSON" in out
    code, out, _ = run(["status", "--jobs-dir", str(tmp_path), "--json"], capsys)
    document = json.loads(out)
    assert [j["job"] for j in document["jobs"]] == ["alpha", "gamma"]
    assert document["unreadable"][0]["job"] == "beta"


def _write_state(folder: Path, state: object) -> None:
    import hashlib

    body = json.dumps(state, sort_keys=True)
    document = {
        "format": "geo-orchestrator/job-state-v1",
        "sha256": hashlib.sha256(body.encode()).hexdigest(),
        "state": state,
    }
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "state.json").write_text(json.dumps(document))


@pytest.mark.parametrize(
    "state",
    [
        [1, 2],
        "text",
        {"job": "a", "recipe_path": "r", "phase": "train", "step": "12"},
        {"job": "a", "recipe_path": "r", "phase": "train", "nodes": "abc"},
        {"job": "a", "recipe_path": "r", "phase": "train", "losses": [None]},
        {"job": "a", "recipe_path": "r", "phase": 3},
        {"job": "a", "recipe_path": "r", "phase": "train", "compute_usd": float("nan")},
        {"job": "a", "recipe_path": "r", "phase": "train", "updated_at_s": 1e300},
        {"job": "a", "recipe_path": "r"},
    ],
)
def test_a_state_with_wrong_types_is_corrupt_not_a_crash_later(tmp_path, capsys, state):
    _write_state(tmp_path / "alpha", state)
    with pytest.raises(StateCorrupt):
        StateStore(tmp_path / "alpha").load()
    code, _, err = run(["status", "alpha", "--jobs-dir", str(tmp_path)], capsys)
    assert code == 2 and "state.json" in err


def test_a_diverged_runs_nan_losses_are_still_a_readable_state(tmp_path):
    _write_state(
        tmp_path / "alpha",
        {"job": "a", "recipe_path": "r", "phase": "train", "losses": [2.5, float("nan")]},
    )
    assert StateStore(tmp_path / "alpha").load().state.phase == "train"


# ---- found by the fuzz campaign (tests/fuzz) ---------------------------------------------------


def test_an_event_with_an_integer_of_thousands_of_digits_is_skipped(tmp_path):
    path = tmp_path / "events.jsonl"
    path.write_bytes(
        b'{"event": "x", "time_s": ' + b"9" * 5000 + b'}\n{"event": "b", "time_s": 2}\n'
    )
    assert [e["event"] for e in read_events(path)] == ["b"]


def test_a_state_number_too_large_for_a_float_is_corrupt(tmp_path):
    # under a valid checksum: the field check must not overflow converting it
    _write_state(tmp_path / "a", {"job": "a", "recipe_path": "r", "phase": "x", "train_s": 10**400})
    with pytest.raises(StateCorrupt, match="train_s"):
        StateStore(tmp_path / "a").load()
    # more digits than Python reads: json.loads fails with a plain ValueError
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "state.json").write_text('{"state": {"step": ' + "9" * 5000 + "}}")
    with pytest.raises(StateCorrupt, match="not JSON"):
        StateStore(tmp_path / "b").load()


# ---- the limits are declared and documented ----------------------------------------------------


def _leaf_fields(cls: type, prefix: str = "") -> list[tuple[str, object, dict]]:
    """(dotted name, type, metadata) of every field that is not a section, sections walked."""
    import dataclasses
    import typing

    found = []
    hints = typing.get_type_hints(cls)
    for spec in dataclasses.fields(cls):
        hint = hints[spec.name]
        inner = [a for a in typing.get_args(hint) if a is not type(None)] or [hint]
        if dataclasses.is_dataclass(inner[0]):
            found += _leaf_fields(inner[0], f"{prefix}{spec.name}.")
        elif typing.get_origin(hint) is tuple and dataclasses.is_dataclass(
            typing.get_args(hint)[0]
        ):
            found.append((prefix + spec.name, hint, dict(spec.metadata)))
            found += _leaf_fields(typing.get_args(hint)[0], f"{prefix}{spec.name}[].")
        else:
            found.append((prefix + spec.name, hint, dict(spec.metadata)))
    return found


@pytest.mark.parametrize("root", ["Recipe", "Plan"])
def test_every_number_has_a_maximum_and_every_list_a_length(root):
    import typing

    from orchestrator.plan import Plan
    from orchestrator.recipe import Recipe

    for name, hint, meta in _leaf_fields({"Recipe": Recipe, "Plan": Plan}[root]):
        if typing.get_origin(hint) is tuple:
            assert "items" in meta, f"{root}.{name} declares no longest list"
        kinds = set(typing.get_args(hint)) | {hint}  # int | None, tuple[int, ...], int
        if kinds & {int, float}:
            assert "most" in meta, f"{root}.{name} declares no maximum"


def test_docs_list_every_recipe_maximum():
    from orchestrator.recipe import Recipe

    docs = (REPO / "docs" / "recipe.md").read_text().split("## Limits", 1)[1]
    for name, _, meta in _leaf_fields(Recipe):
        if "most" in meta and not name.startswith("local_cloud.preempt"):
            assert f"`{name}`" in docs, f"docs/recipe.md's limits table lacks {name}"


@pytest.mark.parametrize(
    "value", ["!!int ", "!!int ''", "!!float ''", "!!bool ''", "!!bool maybe", "!!timestamp x"]
)
def test_an_explicit_tag_on_no_text_names_its_line(tmp_path, value):
    error = recipe_error(recipe(**{"max_gpus: 4": f"max_gpus: {value}"}), tmp_path)
    assert error.line == 36 and "cannot read the value" in error.message, error.render()


def test_flow_nesting_thousands_deep_after_a_libyaml_only_error_is_quick():
    # libyaml refuses the escape on line 1 (PyYAML reads it); PyYAML's scanner then takes time
    # quadratic in the depth of [ ... ]: past a depth no document may have, libyaml's word holds
    text = 'a: "\\ud83d"\nb: ' + "[" * 2000 + "]" * 2000 + "\n"
    started = time.process_time()
    with pytest.raises(YamlSyntaxError):
        load_yaml_text(text, file="r.yaml")
    assert time.process_time() - started < 0.5


def test_text_that_only_pyyaml_reads_is_still_read():
    assert load_yaml_text('a: "\\ud83d"\n', file="r.yaml").value == {"a": "\ud83d"}
