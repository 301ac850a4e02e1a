"""The notebook handle reads a job's folder: status, events and metrics as DataFrames, a plot."""

from __future__ import annotations

import json

import pytest

import orchestrator
from orchestrator.errors import UserError

from .test_jobs_cmd import make_job


def test_a_handle_gives_dataframes_and_a_plot(tmp_path):
    folder = make_job(tmp_path)
    with (folder / "metrics.jsonl").open("w") as handle:
        for step in range(1, 6):
            row = {
                "time_s": 100.0 + step,
                "step": step,
                "loss": 3.0 - step / 10,
                "samples_per_s": 30.0,
                "usd_spent": step * 0.001,
                "egress_bytes": 0,
                "nodes": 2,
                "recoveries": 0,
            }
            handle.write(json.dumps(row) + "\n")
    job = orchestrator.job("alpha", jobs_dir=tmp_path)
    status = job.status()
    assert status.loc[0, "phase"] == "train" and status.loc[0, "recoveries"] == 1
    events = job.events()
    assert list(events["event"]) == ["planned", "recovered"] and "time" in events
    metrics = job.metrics()
    assert list(metrics["step"]) == [1, 2, 3, 4, 5]
    figure = job.plot(tmp_path / "job.png")
    assert (tmp_path / "job.png").stat().st_size > 0 and len(figure.axes) == 2
    job.stop()
    assert (folder / "stop.request").exists()
    assert "alpha" in repr(job)


def test_an_unknown_job_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="no job 'nope'"):
        orchestrator.job("nope", jobs_dir=tmp_path)
