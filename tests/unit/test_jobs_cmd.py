"""``status``, ``logs`` and ``stop`` read and write a job's folder."""

from __future__ import annotations

import json

from orchestrator.cli import main
from orchestrator.driver.events import Event, EventLog
from orchestrator.driver.state import JobState, StateStore


def make_job(root, name="alpha", phase="train"):
    folder = root / name
    StateStore(folder).save(
        JobState(
            job=name,
            recipe_path="r.yaml",
            phase=phase,
            step=12,
            steps_total=40,
            global_batch_size=8,
            losses=(2.5, 2.25),
            compute_usd=0.01,
            egress_usd=0.002,
            trained_steps=12,
            train_s=3.0,
            nodes=("n1", "n2"),
            recoveries=1,
        )
    )
    log = EventLog(folder / "events.jsonl")
    log.append(Event(event="planned", decision="launch its nodes", plan_after="2 x T4"))
    log.append(Event(event="recovered", details={"recovery_s": 6.5}))
    return folder


def test_status_lists_jobs_as_a_table_and_json(tmp_path, capsys):
    make_job(tmp_path)
    make_job(tmp_path, "beta", phase="done")
    assert main(["status", "--jobs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "alpha" in out and "beta" in out and "12/40" in out
    assert main(["status", "alpha", "--jobs-dir", str(tmp_path), "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)["jobs"]
    assert job["samples_per_s"] == 32.0 and job["usd_spent"] == 0.012 and job["nodes"] == 2
    assert job["loss"] == 2.25 and job["recoveries"] == 1


def test_logs_prints_the_events(tmp_path, capsys):
    make_job(tmp_path)
    assert main(["logs", "alpha", "--jobs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "planned  launch its nodes" in out and "recovery_s=6.5" in out
    assert main(["logs", "alpha", "--jobs-dir", str(tmp_path), "--json"]) == 0
    assert [e["event"] for e in json.loads(capsys.readouterr().out)["events"]] == [
        "planned",
        "recovered",
    ]


def test_stop_leaves_a_request_for_a_running_job_only(tmp_path, capsys):
    folder = make_job(tmp_path)
    assert main(["stop", "alpha", "--jobs-dir", str(tmp_path)]) == 0
    assert (folder / "stop.request").exists()
    done = make_job(tmp_path, "beta", phase="done")
    assert main(["stop", "beta", "--jobs-dir", str(tmp_path)]) == 0
    assert not (done / "stop.request").exists() and "not running" in capsys.readouterr().out


def test_an_unknown_job_is_a_user_error(tmp_path, capsys):
    assert main(["logs", "nope", "--jobs-dir", str(tmp_path)]) == 2
    assert "no job 'nope'" in capsys.readouterr().err


def test_the_progress_line_shows_step_loss_samples_per_s_spend_and_eta(capsys, monkeypatch):
    from orchestrator.cli import submit_cmd
    from orchestrator.driver.machine import StepResult

    ticks = iter([100.0, 102.0])  # 10 steps in 2 s
    monkeypatch.setattr(submit_cmd.time, "monotonic", lambda: next(ticks))
    progress = submit_cmd._Progress(submit_cmd.Terminal(), quiet=False)
    base = JobState(job="j", recipe_path="r.yaml", phase="train", steps_total=40)
    base = base.evolve(global_batch_size=16, compute_usd=0.25, egress_usd=0.05)
    progress.show(base.evolve(step=10), StepResult(loss=3.5))
    progress.show(base.evolve(step=20), StepResult(loss=3.25))
    line = capsys.readouterr().err.strip().splitlines()[-1].split("\r")[-1]
    assert line == "step 20/40  loss 3.2500  80 samples/s  $0.30000 spent  ETA 4 s"


def test_logs_shorten_ray_node_ids_and_json_keeps_them(tmp_path, capsys):
    from orchestrator.driver.events import Event, EventLog

    node = "3053fc38321e99c0af101ad97f3d5983e514247c1293a2185c94751d"
    folder = make_job(tmp_path)
    EventLog(folder / "events.jsonl").append(
        Event(event="preemption_notice", reason=f"node {node} in local/sim-us/sim-us-b")
    )
    assert main(["logs", "alpha", "--jobs-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "node 3053fc38321e… in local/sim-us/sim-us-b" in out and node not in out
    assert main(["logs", "alpha", "--jobs-dir", str(tmp_path), "--json"]) == 0
    assert node in capsys.readouterr().out
