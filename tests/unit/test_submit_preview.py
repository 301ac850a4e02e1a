"""Before anything is rented, ``submit`` shows the plan it starts on with its predicted rate and
price (``--dry-run`` stops there); ``--plan FILE`` runs a given plan, which the driver keeps while
the market can hold it; a finished job submitted again is a new run with logs of its own."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from orchestrator.catalog import default_catalog
from orchestrator.cli import main
from orchestrator.driver.events import Event, EventLog
from orchestrator.driver.job import archive_ended_run
from orchestrator.driver.local import first_choice
from orchestrator.driver.market_plans import MarketPlans
from orchestrator.driver.state import JobState, StateStore
from orchestrator.recipe import load_recipe
from provisioners.local.provisioner import LocalProvisioner

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def recipe_path(tmp_path) -> Path:
    """The quickstart with its profile estimated (timing the model here takes seconds)."""
    text = (REPO / "recipes" / "quickstart.yaml").read_text()
    path = tmp_path / "quickstart.yaml"
    path.write_text(text.replace("profile: auto", "profile: analytic"))
    return path


def _dry_run(recipe: Path, jobs: Path, capsys, *, steps: int) -> str:
    """What ``submit --dry-run`` prints; it must show a plan and its price and leave no job
    behind (nothing to resume or list)."""
    code = main(["submit", str(recipe), "--dry-run", "--jobs-dir", str(jobs)])
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.startswith("plan: PP") and "samples/s" in out and "/h for the GPUs" in out
    assert f"{steps} steps: about" in out and "dry run: nothing rented" in out
    assert not any(StateStore(folder).exists() for folder in jobs.glob("*"))
    return out


def test_dry_run_shows_the_plan_and_its_price_and_rents_nothing(recipe_path, tmp_path, capsys):
    _dry_run(recipe_path, tmp_path / "jobs", capsys, steps=200)


def test_a_cloud_jobs_plan_and_price_come_before_its_controller_vm(tmp_path, monkeypatch, capsys):
    """On a cloud the plan is the catalog's, at its published prices, and says so; a dry run
    boots no controller VM and makes no cloud call past the credentials' chain."""
    from orchestrator.driver import remote

    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(
        remote, "run_with_controller", lambda *a: pytest.fail("a controller VM was launched")
    )
    recipe = tmp_path / "cloud.yaml"
    recipe.write_text(
        "name: cloud\nprovider: aws\nmodel: {name: gpt-tiny, profile: analytic}\n"
        "training: {global_batch_size: 16, microbatch_sizes: [2], steps: 300}\n"
        "objective: {goal: min_cost}\n"
        "constraints: {locations: [aws/us-east-1], gpu_types: [T4], max_gpus: 4}\n"
    )
    out = _dry_run(recipe, tmp_path / "jobs", capsys, steps=300)
    assert "aws/us-east-1" in out and "published prices" in out


def test_the_driver_keeps_a_given_plan_while_the_market_holds_it(recipe_path):
    catalog = default_catalog()
    recipe = load_recipe(recipe_path, catalog=catalog)
    first = first_choice(recipe, recipe_path, catalog)
    market = LocalProvisioner(seed=0)
    plans = MarketPlans(recipe, catalog, market, given=first.plan)
    kept = plans.choose(excluded=frozenset(), held={})
    assert kept.plan == first.plan and kept.samples_per_s == pytest.approx(first.samples_per_s)
    place = first.plan.stages[0].replicas[0].infra
    moved = plans.choose(excluded=frozenset({place}), held={})
    assert place not in {r.infra for s in moved.plan.stages for r in s.replicas}
    assert "the plan given no longer fits" in moved.note and plans.given is None


def test_a_given_plan_that_does_not_fit_is_refused_naming_its_file(recipe_path, tmp_path, capsys):
    plan = tmp_path / "plan.yaml"
    assert main(["plan", str(recipe_path), "-o", str(plan), "--top", "1"]) == 0
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text(plan.read_text().replace("global_batch_size: 16", "global_batch_size: 32"))
    capsys.readouterr()
    args = ["submit", str(recipe_path), "--dry-run", "--jobs-dir", str(tmp_path / "jobs")]
    assert main([*args, "--plan", str(plan)]) == 0
    assert main([*args, "--plan", str(wrong)]) == 2
    err = capsys.readouterr().err
    assert f"error: {wrong}" in err and "global_batch_size 32" in err


def test_a_finished_jobs_logs_move_aside_for_its_new_run(tmp_path):
    store = StateStore(tmp_path)
    store.save(JobState(job="j", recipe_path="r.yaml", phase="done", step=9, run_id="j-1"))
    EventLog(tmp_path / "events.jsonl").append(Event(event="finished"))
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 9}) + "\n")
    moved = archive_ended_run(tmp_path, from_scratch=False)
    assert moved == tmp_path / "runs" / "j-1"
    assert (moved / "events.jsonl").exists() and (moved / "metrics.jsonl").exists()
    assert not (tmp_path / "events.jsonl").exists()


def test_a_stopped_job_resumes_in_the_same_logs(tmp_path):
    StateStore(tmp_path).save(JobState(job="j", recipe_path="r.yaml", phase="stopped", step=9))
    EventLog(tmp_path / "events.jsonl").append(Event(event="stopped"))
    assert archive_ended_run(tmp_path, from_scratch=False) is None
    assert (tmp_path / "events.jsonl").exists()


def test_a_detached_submit_passes_its_choices_on_to_the_process_that_runs_the_job(tmp_path):
    """The detached child runs the same job as the command typed: its VMs, its dashboard choice,
    its chaos and plan file reach the child's command line, with absolute paths."""
    from orchestrator.cli import build_parser
    from orchestrator.cli.submit_cmd import _child_command

    plan = tmp_path / "plan.json"
    typed = ["submit", "job.yaml", "--detach", "--vms", "processes", "--no-dashboard"]
    typed += ["--preempt-at", "20", "--notice-s", "1.5", "--plan", str(plan)]
    child = _child_command(build_parser().parse_args(typed))
    assert child[child.index("submit") + 1] == str(Path("job.yaml").resolve())
    assert "--yes" in child and "--detach" not in child
    assert "--no-dashboard" in child and child[child.index("--vms") + 1] == "processes"
    assert child[child.index("--preempt-at") + 1] == "20"
    assert child[child.index("--notice-s") + 1] == "1.5"
    assert child[child.index("--plan") + 1] == str(plan)
    # with the dashboard (the default), the child starts it too
    default = _child_command(build_parser().parse_args(["submit", "job.yaml", "--detach"]))
    assert "--no-dashboard" not in default
