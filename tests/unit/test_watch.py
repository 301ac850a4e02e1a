"""What a person sees of a running job (orchestrator/cli/watch.py): events as one line each, a
progress line that only a terminal rewrites, the output copied to the job's folder without the
rewrites and escape codes, the workers' output tagged with their actor, and ``logs -f`` ending
with the job."""

from __future__ import annotations

import io
import json
import threading
from pathlib import Path

from orchestrator.cli.watch import (
    OutputCopy,
    Tee,
    Terminal,
    WorkerOutput,
    event_text,
    follow_job,
)
from orchestrator.driver.events import Event, EventLog, LogTail
from orchestrator.driver.lock import JobLock
from orchestrator.driver.state import JobState, StateStore

NODE = "8743b00aa698b3ad608a9ab15f5c82ad5e85c1f26f7bf19e218c0616"


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_an_event_is_one_line_and_the_periodic_checkpoint_is_left_out():
    notice = Event(
        event="preemption_notice",
        decision="checkpoint now, then move off the node before it goes",
        reason=f"node {NODE} in local/sim-us/sim-us-a",
    ).to_dict()
    line = event_text(notice)
    assert line.split("  ", 1)[1].startswith("preemption notice  node 8743b00aa698… in local/")
    assert line.endswith("-> checkpoint now, then move off the node before it goes")
    recovered = Event(event="recovered", reason="first step", details={"recovery_s": 16.34})
    assert "first step: 16.3 s after the loss" in event_text(recovered.to_dict())
    assert event_text(Event(event="checkpointed", reason="its period").to_dict()) is None
    assert event_text(Event(event="checkpointed", reason="a notice").to_dict()) is not None


def test_a_progress_line_is_rewritten_on_a_terminal_only():
    plain, tty = io.StringIO(), _Tty()
    for stream in (plain, tty):
        terminal = Terminal(stream)
        terminal.progress("step 1", keep=False)
        terminal.line("event")
        terminal.progress("step 10", keep=True)
    assert plain.getvalue() == "event\nstep 10\n"  # no escape codes in a file or a pipe
    assert tty.getvalue() == "\r\033[Kstep 1\r\033[Kevent\n\r\033[Kstep 10\n"


def test_the_copy_keeps_what_each_line_showed_last_without_escape_codes():
    shown, log = _Tty(), io.StringIO()
    tee = Tee(shown, log)
    tee.write("\r\033[Kstep 1")
    tee.write("\r\033[Kstep 2")
    tee.write("\r\033[Kpreempted\nstep 10\n")
    tee.write("half")
    assert log.getvalue() == "preempted\nstep 10\n"
    assert shown.getvalue().endswith("half") and tee.isatty()


def test_output_copy_appends_to_the_jobs_output_log_and_restores_the_streams(tmp_path, capsys):
    import sys

    copy = OutputCopy(tmp_path)
    print("plan: 2 T4")
    print("step 10", file=sys.stderr)
    copy.close()
    print("after")
    text = (tmp_path / "output.log").read_text()
    assert "plan: 2 T4\nstep 10\n" in text and "after" not in text
    assert (tmp_path / "output.log").stat().st_mode & 0o077 == 0  # its owner's only


def test_a_tail_reads_whole_lines_once_from_the_end_it_was_made_at(tmp_path):
    path = tmp_path / "events.jsonl"
    log = EventLog(path)
    log.append(Event(event="planned"))
    tail = LogTail(path)
    assert tail.read() == []
    log.append(Event(event="launched"))
    with path.open("a") as handle:
        handle.write('{"event": "started", "time_s": 1')  # being written
    assert [e["event"] for e in tail.read()] == ["launched"]
    with path.open("a") as handle:
        handle.write("}\n")
    assert [e["event"] for e in tail.read()] == ["started"]
    assert [e["event"] for e in LogTail(path, from_start=True).read()] == [
        "planned",
        "launched",
        "started",
    ]


def test_workers_output_is_tagged_with_their_actor_and_rays_markers_are_not_shown(tmp_path):
    logs = tmp_path / "ray-logs"
    logs.mkdir()
    out = logs / "worker-ab12-01000000-77.out"
    out.write_text(":job_id:01000000\n:actor_name:StageWorker\nepoch 1 done\n")
    (logs / "raylet.out").write_text("not a worker's\n")
    output = WorkerOutput(tmp_path)
    assert output.read() == ["[StageWorker] epoch 1 done"]
    with out.open("a") as handle:
        handle.write("epoch 2 done\n")
    assert output.read() == ["[StageWorker] epoch 2 done"]


def _job(tmp_path: Path, phase: str) -> Path:
    folder = tmp_path / "job"
    StateStore(folder).save(JobState(job="job", recipe_path="r.yaml", phase=phase, step=20))
    log = EventLog(folder / "events.jsonl")
    log.append(Event(event="planned", decision="launch its nodes", plan_after="PP1 x DP1"))
    log.append(Event(event="finished", decision="released every node", reason="20 steps"))
    with (folder / "metrics.jsonl").open("w") as handle:
        for step in (1, 10, 20):
            row = {"time_s": 1.7e9, "step": step, "loss": 2.0, "samples_per_s": 5.0}
            handle.write(json.dumps(row) + "\n")
    return folder


def test_following_a_finished_job_prints_its_events_and_ends_with_its_phase(tmp_path):
    folder, shown = _job(tmp_path, "done"), io.StringIO()
    assert follow_job(folder, Terminal(shown)) == "done"
    text = shown.getvalue()
    assert "planned  PP1 x DP1  -> launch its nodes" in text and "finished  20 steps" in text


def test_following_waits_while_a_process_holds_the_job_and_stops_when_none_runs_it(tmp_path):
    folder = _job(tmp_path, "train")
    assert follow_job(folder, Terminal(io.StringIO())).startswith("no process runs it")
    stop, ended = threading.Event(), []
    with JobLock.acquire(folder, job="job"):  # held in this process: the job runs
        thread = threading.Thread(
            target=lambda: ended.append(follow_job(folder, Terminal(io.StringIO()), stop=stop))
        )
        thread.start()
        thread.join(timeout=1.5)
        assert thread.is_alive()  # still following
        stop.set()
        thread.join(timeout=5)
    assert ended == ["interrupted"]
