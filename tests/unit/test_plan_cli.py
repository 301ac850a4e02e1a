"""`python -m orchestrator plan`: the ranked table, the written plan read back by simulate, JSON, the
frontier picture, and errors that say what binds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.cli import main
from orchestrator.cli.plot import frontier
from tests.unit.test_cli import run_cli

REPO = Path(__file__).resolve().parents[2]
QUICKSTART = REPO / "recipes" / "quickstart.yaml"
OFFER_HEADER = (
    "cloud,region,zone,instance_type,gpu,gpus_per_node,vcpus,memory_gib,on_demand_usd_per_hour,"
    "spot_usd_per_hour,available_count,preemption_rate_per_hour,source,as_of"
)


def write_recipe(folder: Path, *, objective: str, model: str = "gpt-tiny", extra: str = "") -> Path:
    path = folder / "recipe.yaml"
    path.write_text(
        f"name: t\nmodel: {{name: {model}}}\nprovider: local\n"
        "training: {global_batch_size: 16, microbatch_sizes: [2, 4], steps: 100}\n"
        f"objective: {objective}\n"
        "constraints: {locations: [local/sim-us/sim-us-a, local/sim-us/sim-us-b], gpu_types: [T4], "
        "max_gpus: 4, pricing: spot}\n" + extra,
        encoding="utf-8",
    )
    return path


def test_table_lists_ranked_plans_with_reasons(capsys):
    assert main(["plan", str(QUICKSTART), "--top", "3"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    header = lines[1].split()
    assert header[:3] == ["rank", "gpus@place", "shape"]
    for column in ("shape", "mbs", "samples_s", "usd_per_h", "usd_per_1m", "egress", "peak_gib"):
        assert column in header
    ranks = [line.split()[0] for line in lines[3:6]]
    assert ranks == ["1", "2", "3"]
    assert "T4@sim-" in lines[3] and "PP" in lines[3]  # GPUs per zone (--json: the whole place)
    # every runner-up says why it lost, against the best's figures
    assert any(line.startswith("2: ") and " vs " in line for line in lines)
    assert any(line.startswith("3: ") and " vs " in line for line in lines)


def test_written_plan_reads_back_in_simulate(tmp_path, capsys):
    plan = tmp_path / "best.yaml"
    assert main(["plan", str(QUICKSTART), "--json", "-o", str(plan)]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["written"] == str(plan)
    best = document["plans"][0]
    assert plan.read_text().startswith("# The best plan for ")
    assert main(["simulate", str(QUICKSTART), "--plan", str(plan), "--json"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    assert simulated["samples_per_s"] == pytest.approx(best["samples_per_s"], rel=1e-9)
    # the plan table's $/h is compute and egress (the quickstart spreads over regions: egress)
    assert simulated["cost_per_hour_usd"] == pytest.approx(
        best["estimate"]["cost_per_hour_usd"], rel=1e-9
    )
    per_hour = simulated["cost_per_iteration_usd"] / simulated["iteration_time_s"] * 3600
    assert per_hour == pytest.approx(best["usd_per_hour"], rel=1e-9)
    assert simulated["cost_per_million_samples_usd"] == pytest.approx(
        best["usd_per_million_samples"], rel=1e-9
    )


def test_json_ranks_by_the_objective(capsys):
    assert main(["plan", str(QUICKSTART), "--json", "--top", "4"]) == 0
    document = json.loads(capsys.readouterr().out)
    plans = document["plans"]
    assert [p["rank"] for p in plans] == list(range(1, len(plans) + 1))
    assert len(plans) >= 2
    rates = [p["samples_per_s"] for p in plans]
    assert rates == sorted(rates, reverse=True)  # quickstart maximises throughput
    assert plans[0]["behind_the_best"] is None
    assert all(p["behind_the_best"] for p in plans[1:])
    assert all(p["usd_per_hour"] <= 5.0 for p in plans)  # its budget_usd_per_hour
    assert document["search"]["plans_simulated"] >= len(plans)
    assert document["frontier"]


@pytest.mark.parametrize("suffix, magic", [(".png", b"\x89PNG"), (".svg", b"<?xml")])
def test_frontier_picture(tmp_path, capsys, suffix, magic):
    picture = tmp_path / f"frontier{suffix}"
    assert main(["plan", str(QUICKSTART), "--plot", str(picture)]) == 0
    assert f"frontier drawn in {picture}" in capsys.readouterr().out
    assert picture.read_bytes().startswith(magic)


def test_frontier_keeps_only_undominated_points():
    points = [(10.0, 5.0), (20.0, 6.0), (15.0, 7.0), (20.0, 8.0), (5.0, 4.0), (25.0, 6.0)]
    # (20, 6) is beaten by (25, 6): as fast or faster at the same cost
    assert frontier(points) == [(5.0, 4.0), (10.0, 5.0), (25.0, 6.0)]


def test_unknown_picture_format_is_a_user_error(tmp_path):
    result = run_cli("plan", str(QUICKSTART), "--plot", str(tmp_path / "frontier.gif"))
    assert result.returncode == 2
    assert "--plot" in result.stderr and ".png" in result.stderr and "To fix" in result.stderr
    assert "Traceback" not in result.stderr


def test_budget_that_binds_is_named(tmp_path):
    recipe = write_recipe(tmp_path, objective="{goal: max_throughput, budget_usd_per_hour: 0.05}")
    result = run_cli("plan", str(recipe))
    assert result.returncode == 2, result.stdout
    assert "Traceback" not in result.stderr
    assert "budget_usd_per_hour" in result.stderr
    assert "To fix" in result.stderr and "raise objective.budget_usd_per_hour" in result.stderr


def test_memory_that_binds_is_named(tmp_path, capsys):
    # GPT-Neo-2.7B on at most 4 T4 with one stage: weights and Adam state cannot fit
    recipe = write_recipe(
        tmp_path,
        objective="{goal: max_throughput}",
        model="gpt-neo-2.7b",
        extra="parallelism: {tensor_parallel: [1], max_pipeline_stages: 1}\n",
    )
    assert main(["plan", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "no plan fits" in err and "memory" in err
    assert "max_pipeline_stages" in err


def test_floor_out_of_reach_is_named(tmp_path, capsys):
    recipe = write_recipe(
        tmp_path, objective="{goal: min_cost, min_throughput_samples_per_s: 1.0e+9}"
    )
    assert main(["plan", str(recipe)]) == 2
    err = capsys.readouterr().err
    assert "no plan reaches" in err and "min_throughput_samples_per_s" in err


def test_market_file_replaces_the_recipes_market(tmp_path, capsys):
    market = tmp_path / "market.csv"
    market.write_text(
        OFFER_HEADER + "\n"
        "local,sim-eu,sim-eu-a,sim-t4-1,T4,1,1,2,0.572,0.180,2,0.1,test,2026-01-01\n",
        encoding="utf-8",
    )
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "name: t\nmodel: {name: gpt-tiny}\nprovider: local\n"
        "training: {global_batch_size: 16, microbatch_sizes: [2], steps: 100}\n",
        encoding="utf-8",
    )
    assert main(["plan", str(recipe), "--market", str(market), "--json"]) == 0
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans
    assert all(p["gpus_by_location"].startswith("local/sim-eu/sim-eu-a: ") for p in plans)
    assert all(p["plan"]["stages"] for p in plans)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--top", "0"], "--top 0"),
        (["--market", "no-such-market.csv"], "no-such-market.csv"),
    ],
)
def test_bad_arguments_exit_2(args, words):
    result = run_cli("plan", str(QUICKSTART), *args)
    assert result.returncode == 2
    assert words in result.stderr and "To fix" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    "recipe", sorted((REPO / "recipes").glob("*.yaml")), ids=lambda path: path.stem
)
def test_every_shipped_recipe_plans(recipe, capsys):
    """Each recipe that ships finds a plan (GPT and CNN models, SAILOR and analytic profiles)."""
    assert main(["plan", str(recipe), "--top", "2", "--json"]) == 0, capsys.readouterr().err
    plans = json.loads(capsys.readouterr().out)["plans"]
    assert plans and plans[0]["samples_per_s"] > 0
