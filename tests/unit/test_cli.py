"""The command line: tables and --json, exit codes, errors without tracebacks, help with examples."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.cli import build_parser, main

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    """Run `python -m orchestrator` as a user would, with no credentials and no proxy in the environment."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AWS_", "GOOGLE_", "AZURE_", "CLOUDSDK_")) and "PROXY" not in k.upper()
    }
    return subprocess.run(
        [sys.executable, "-m", "orchestrator", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )


def test_catalog_offers_gpu_json_offline():
    result = run_cli("catalog", "offers", "--gpu", "A100", "--json")
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    offers = document["offers"]
    assert document["count"] == len(offers) > 0
    assert {o["cloud"] for o in offers} >= {"aws", "gcp", "azure"}
    for offer in offers:
        assert offer["gpu"] == "A100"
        assert offer["on_demand_usd_per_hour"] > 0
        assert offer["source"] and offer["as_of"]
        assert offer["infra"].startswith(offer["cloud"] + "/")


def test_bad_recipe_exits_2_without_traceback(tmp_path):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model:\n  name: gpt-tiny\ntraining:\n  glbal_batch_size: 16\n  steps: 10\n")
    result = run_cli("validate", str(recipe))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert (
        f"{recipe}:4: training.glbal_batch_size: unknown key 'glbal_batch_size' (did you mean "
        "'global_batch_size'?)" in result.stderr
    )
    assert "To fix:" in result.stderr


def test_bad_argument_exits_2():
    result = run_cli("catalog", "offers", "--pricing", "cheap")
    assert (
        result.returncode == 2
        and "Traceback" not in result.stderr
        and "invalid choice" in result.stderr
    )


def test_validate_every_shipped_recipe(capsys):
    for recipe in sorted((REPO / "recipes").glob("*.yaml")):
        assert main(["validate", str(recipe)]) == 0, recipe
        assert f"{recipe}: valid" in capsys.readouterr().out


def test_validate_json(capsys):
    assert main(["validate", str(REPO / "recipes" / "quickstart.yaml"), "--json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["valid"] and document["recipe"]["model"]["name"] == "gpt-tiny"
    assert document["matching_offers"] == 3


@pytest.mark.parametrize(
    "args",
    [
        ["catalog", "gpus", "--json"],
        ["catalog", "gpus", "--name", "V100-16", "--json"],
        ["catalog", "offers", "--provider", "local", "--json"],
        [
            "catalog",
            "offers",
            "--gpu",
            "T4",
            "--location",
            "gcp/europe-west1",
            "--pricing",
            "spot",
            "--json",
        ],
        ["catalog", "network", "--json"],
        ["catalog", "network", "gcp/us-central1", "gcp/europe-west1", "--json"],
        ["catalog", "egress", "--json"],
        [
            "catalog",
            "egress",
            "aws/us-east-1",
            "gcp/us-central1",
            "--table",
            "erben_2023_04",
            "--json",
        ],
        ["catalog", "regions", "--cloud", "azure", "--json"],
        ["catalog", "models", "--json"],
    ],
)
def test_catalog_json_is_one_document(capsys, args):
    assert main(args) == 0
    document = json.loads(capsys.readouterr().out)
    assert isinstance(document, dict) and document


@pytest.mark.parametrize(
    "args",
    [
        ["catalog", "gpus"],
        ["catalog", "offers", "--gpu", "T4", "--limit", "3"],
        ["catalog", "network"],
        ["catalog", "network", "local/sim-us/sim-us-a", "local/sim-eu/sim-eu-a"],
        ["catalog", "egress"],
        ["catalog", "egress", "gcp/us-central1", "gcp/asia-east1"],
        ["catalog", "regions"],
        ["catalog", "models"],
    ],
)
def test_catalog_tables(capsys, args):
    assert main(args) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) >= 3 and set(lines[1].replace(" ", "")) == {"-"}  # header, rule, rows


def test_offers_filters_in_table(capsys):
    assert (
        main(["catalog", "offers", "--gpu", "V100-16", "--location", "aws", "--sort", "price"]) == 0
    )
    rows = capsys.readouterr().out.splitlines()[2:]
    assert rows and all(" V100 " in r for r in rows if r.startswith("aws/"))


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["catalog", "offers", "--gpu", "A1000"], "did you mean 'A100'"),
        (["catalog", "offers", "--location", "gcp/us-centrl1"], "did you mean 'us-central1'"),
        (["catalog", "network", "gcp/us-central1"], "give both FROM and TO"),
        (["catalog", "egress", "gcp", "aws/us-east-1"], "names a whole cloud"),
        (["catalog", "gpus", "--name", "B300"], "unknown GPU"),
        (["catalog", "regions", "--cloud", "oracle"], "unknown cloud"),
    ],
)
def test_user_errors_exit_2(capsys, args, fragment):
    assert main(args) == 2
    assert fragment in capsys.readouterr().err


def _all_parsers(parser):
    yield parser
    for action in parser._actions:
        if hasattr(action, "choices") and isinstance(action.choices, dict):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_every_command_has_help_with_an_example():
    parsers = list(_all_parsers(build_parser()))
    assert len(parsers) >= 12
    for parser in parsers:
        assert parser.epilog and "example" in parser.epilog, parser.prog
        assert "python -m orchestrator" in parser.epilog, parser.prog


def test_top_level_help_lists_the_commands():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in ("validate", "catalog", "plan", "simulate", "submit", "status"):
        assert command in result.stdout


def test_help_texts_read_as_prose_without_rest_markup_or_source_paths():
    from orchestrator.cli.output import help_text

    doc = "``submit RECIPE``: runs (orchestrator/driver/machine.py) it; leases (Unix s; a/b.py).\n"
    assert help_text(doc) == "submit RECIPE: runs it; leases (Unix s)."
    for command in ("submit", "status", "down", "emulate", "plan", "simulate"):
        result = run_cli(command, "--help")
        assert result.returncode == 0 and "``" not in result.stdout, command
        assert ".py)" not in result.stdout and ".py;" not in result.stdout, command
