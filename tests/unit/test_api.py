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


def test_dashboard_metrics_are_set_per_step_with_the_job_tag():
    from orchestrator.driver.metrics import DashboardMetrics

    made = {}

    class FakeGauge:
        def __init__(self, name, *, description, tag_keys):
            assert description and tag_keys == ("job",)
            self.values = []
            made[name] = self

        def set(self, value, *, tags):
            self.values.append((value, tags))

    metrics = DashboardMetrics("alpha", gauge=FakeGauge)
    row = {
        "samples_per_s": 30.0,
        "loss": 2.5,
        "usd_spent": 0.01,
        "recoveries": 1,
        "nodes": 2,
        "egress_bytes": 2e9,
    }
    metrics.update(row, usd_per_hour=0.72)
    assert made["geo_orchestrator_egress_gb"].values == [(2.0, {"job": "alpha"})]
    assert made["geo_orchestrator_usd_per_hour"].values == [(0.72, {"job": "alpha"})]
    metrics.update({**row, "samples_per_s": None}, usd_per_hour=0.72)  # a step without a rate
    assert len(made["geo_orchestrator_samples_per_s"].values) == 1


def test_a_handle_on_a_name_that_is_not_a_job_name_is_refused(tmp_path):
    with pytest.raises(UserError, match="not a job name"):
        orchestrator.job("../../etc", jobs_dir=tmp_path)


def test_the_plot_marks_notices_losses_recoveries_and_breaks_the_line_at_a_pause(tmp_path):
    import math

    import pandas as pd

    from orchestrator.cli.job_plot import _broken_at_pauses, draw_job

    times = [100.0, 101.0, 102.0, 120.0, 121.0]  # a pause of 18 s after step 3
    metrics = pd.DataFrame(
        {"time_s": times, "samples_per_s": [30.0] * 5, "usd_spent": [0.001 * i for i in range(5)]}
    )
    events = pd.DataFrame(
        [
            {"time_s": 102.5, "event": "preemption_notice", "details": {}},
            {"time_s": 103.0, "event": "node_lost", "details": {}},
            {"time_s": 120.0, "event": "recovered", "details": {"recovery_s": 17.5}},
            {"time_s": 110.0, "event": "checkpointed", "details": {}},
        ]
    )
    (xs, _), _ = _broken_at_pauses([t - 100 for t in times], [1] * 5, [2] * 5)
    assert math.isnan(xs[3]) and xs[4] == 20.0  # no line across the pause
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, 1)
    draw_job(axes, metrics, events, predicted_samples_per_s=40.0)
    labels = [t.get_text() for t in axes[0].get_legend().get_texts()]
    assert labels == ["measured", "predicted", "preemption notice", "node lost", "recovered"]
    assert len(axes[0].patches) == 1  # the recovery's pause, shaded
    plt.close(figure)
