"""What submitting a recipe again does with the job's state: a failed or stopped job resumes
from its checkpoint with a fresh retry budget, ``--from-scratch`` starts again at step 0, and a
job's folder is always inside the jobs home."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.driver.job import _state, job_folder, signing_key
from orchestrator.driver.state import JobState, StateStore
from orchestrator.driver.status import status_row
from orchestrator.errors import UserError
from orchestrator.recipe.schema import Recipe


def _saved(tmp_path, **fields) -> StateStore:
    store = StateStore(tmp_path / "job")
    store.save(JobState(job="job", recipe_path="r.yaml", phase="failed", run_id="job-1", **fields))
    return store


def test_a_failed_job_resumes_from_its_checkpoint_with_a_fresh_budget(tmp_path):
    failure = {"cause": "disk_full", "message": "no space", "fix": "free some"}
    store = _saved(tmp_path, step=12, checkpoint_step=10, attempts=3, failure=failure)
    state = _state(store, "job", Path("r.yaml"), from_scratch=False)
    assert state.phase == "recover" and state.run_id == "job-1" and state.checkpoint_step == 10
    assert state.failure is None and state.attempts == 0


def test_from_scratch_starts_again_at_step_0_under_a_new_run(tmp_path):
    store = _saved(tmp_path, step=12, checkpoint_step=10)
    state = _state(store, "job", Path("r.yaml"), from_scratch=True)
    assert state.phase == "plan" and state.step == 0 and state.run_id != "job-1"


def test_status_says_why_a_job_failed():
    failure = {"cause": "diverged", "message": "the loss is nan at step 13", "fix": "lower lr"}
    row = status_row(JobState(job="j", recipe_path="r", phase="failed", failure=failure))
    assert row["failure"] == "diverged: the loss is nan at step 13" and row["fix"] == "lower lr"


def test_a_job_folder_never_leaves_the_jobs_home(tmp_path):
    home = tmp_path / "jobs"
    home.mkdir()
    (home / "out").symlink_to(tmp_path)
    recipe = Recipe.__new__(Recipe)  # only the name is read
    for name in ("out", "../x", "/abs"):
        object.__setattr__(recipe, "name", name)
        with pytest.raises(UserError) as caught:
            job_folder(recipe, Path("r.yaml"), home)
        assert caught.value.field == "name"
    object.__setattr__(recipe, "name", None)
    assert job_folder(recipe, Path("My Recipe (2).yaml"), home) == home.resolve() / "My-Recipe-2"


def test_the_checkpoint_key_is_made_once_and_readable_by_its_owner_only(tmp_path):
    key = signing_key(tmp_path)
    assert len(key) == 32 and signing_key(tmp_path) == key
    assert (tmp_path / "checkpoint.key").stat().st_mode & 0o077 == 0


def test_metrics_stay_strict_json_whatever_a_step_reports(tmp_path):
    import json
    import math

    from orchestrator.driver.machine import StepResult
    from orchestrator.driver.metrics import StepMetrics

    metrics = StepMetrics(tmp_path / "metrics.jsonl", batch=8)
    state = JobState(job="j", recipe_path="r", phase="train", step=3, train_s=1.0)
    metrics.record(state, StepResult(loss=math.nan))
    metrics.record(state.evolve(step=4, train_s=2.0, egress_bytes=math.inf), StepResult(loss=1.5))
    rows = [json.loads(line, parse_constant=pytest.fail) for line in metrics.path.open()]
    assert rows[0]["loss"] is None and rows[1]["egress_bytes"] is None and rows[1]["loss"] == 1.5


def test_a_restarted_driver_writes_the_row_its_predecessor_saved_but_did_not_log(tmp_path):
    """The driver saves a step, then logs its row: one that dies in between (its node preempted)
    leaves the state a step ahead of metrics.jsonl, and one cut off mid-write leaves half a row.
    The restarted driver's metrics catch up from the state's losses, once."""
    import orchestrator
    from orchestrator.driver.machine import StepResult
    from orchestrator.driver.metrics import StepMetrics

    path = tmp_path / "jobs/j/metrics.jsonl"
    path.parent.mkdir(parents=True)
    metrics = StepMetrics(path, batch=8)
    state = JobState(job="j", recipe_path="r", phase="train", step=1, losses=(3.0,), train_s=1.0)
    metrics.record(state, StepResult(loss=3.0))
    with path.open("a") as handle:
        handle.write('{"time_s": 1.0, "st')  # the dying driver's row for step 2, cut short
    saved = state.evolve(step=3, losses=(3.0, 2.5, 2.0), train_s=3.0)

    restarted = StepMetrics(path, batch=8)
    assert restarted.catch_up(saved) == 2 and restarted.catch_up(saved) == 0
    restarted.record(saved.evolve(step=4, losses=(3.0, 2.5, 2.0, 1.5)), StepResult(loss=1.5))
    frame = orchestrator.Job("j", jobs_dir=tmp_path / "jobs").metrics()
    assert list(frame["step"]) == [1, 2, 3, 4]
    assert list(frame["loss"]) == [3.0, 2.5, 2.0, 1.5]
    assert frame["samples_per_s"].isna().tolist() == [True, True, True, True]  # rate not known
    # a job rolled back behind its rows (its steps then train again) writes nothing to catch up
    assert StepMetrics(path, batch=8).catch_up(saved.evolve(step=1, losses=(3.0,))) == 0
